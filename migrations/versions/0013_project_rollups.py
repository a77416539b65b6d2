"""project rollups: a project's agreement reports and counts as the rollup job last computed them, when and how long

Downgrade: drops the table; the figures are recomputed from the rankings (nothing in it is a source of truth).

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-02 19:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0013'
down_revision: str | None = '0012'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('project_rollups',
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('reports', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('counts', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('rankings', sa.Integer(), nullable=False),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('computed_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'],
                            name=op.f('fk_project_rollups_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('project_id', name=op.f('pk_project_rollups'))
    )


def downgrade() -> None:
    # A cache of figures derived from the rankings: the next rollup job computes them again.
    op.drop_table('project_rollups')
