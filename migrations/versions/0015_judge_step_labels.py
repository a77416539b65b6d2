"""judge step labels: the AI judge's soft label p(step correct) beside the hard label of its step labels

Downgrade: drops step_labels.p; the judge's step labels keep their hard labels (+1 / −1), their soft labels are lost.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-02 23:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0015'
down_revision: str | None = '0014'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('step_labels', schema=None) as batch_op:
        batch_op.add_column(sa.Column('p', sa.Float(), nullable=True))
        batch_op.create_check_constraint(op.f('ck_step_labels_p'), 'p IS NULL OR (p >= 0 AND p <= 1)')


def downgrade() -> None:
    with op.batch_alter_table('step_labels', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_step_labels_p'), type_='check')
        batch_op.drop_column('p')
