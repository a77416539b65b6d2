"""assignment drafts: the unsent ranking of a leased task, kept on the server so another device resumes it

Downgrade: drops the table; the drafts of tasks still leased are lost (each browser keeps its own copy).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0008'
down_revision: str | None = '0007'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('assignment_drafts',
    sa.Column('assignment_id', sa.Integer(), nullable=False),
    sa.Column('tiers', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('flags', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('seconds_spent', sa.Float(), nullable=True),
    sa.Column('edited_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('saved_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['assignment_id'], ['assignments.id'],
                            name=op.f('fk_assignment_drafts_assignment_id_assignments'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('assignment_id', name=op.f('pk_assignment_drafts'))
    )


def downgrade() -> None:
    # Drafts are unsent work in progress, never labels: the annotator's browser still holds each one locally.
    op.drop_table('assignment_drafts')
