"""gold step labels: a gold task's known label of each step of its completions, for annotators' step accuracy

Downgrade: drops prompts.gold_step_labels; gold tasks keep their known order, their known step labels are lost
(annotators' own step labels stay).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-02 23:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0014'
down_revision: str | None = '0013'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gold_step_labels', JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.drop_column('gold_step_labels')
