"""gold tasks and lease length

Downgrade: drops projects.lease_minutes and prompts.gold_tiers; lease lengths and gold orders are lost,
everything else stays.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30 06:27:34.731577
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0002'
down_revision: str | None = '0001'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.add_column(sa.Column('lease_minutes', sa.Integer(), server_default='30', nullable=False))
        batch_op.create_check_constraint(op.f('ck_projects_lease_range'), 'lease_minutes >= 1 AND lease_minutes <= 1440')

    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('gold_tiers', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=True))



def downgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.drop_column('gold_tiers')

    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_projects_lease_range'), type_='check')
        batch_op.drop_column('lease_minutes')

