"""export snapshot: the database snapshot an export read, kept on its immutable row

Data migration: none; exports written before it keep a NULL snapshot (it was in their job's result only).
Downgrade: drops exports.snapshot; the recorded snapshots are lost, the exports stay.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30 09:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0006'
down_revision: str | None = '0005'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Exports written before this revision recorded their snapshot in the job result only: left NULL.
    with op.batch_alter_table('exports', schema=None) as batch_op:
        batch_op.add_column(sa.Column('snapshot', sa.String(length=200), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('exports', schema=None) as batch_op:
        batch_op.drop_column('snapshot')
