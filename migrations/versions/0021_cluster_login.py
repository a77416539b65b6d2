"""clusters.login: a Slurm cluster's login node (user@host[:port]), reached over SSH with the cluster's secret as
the private key

Downgrade: drops the column; a Slurm cluster that had one runs its commands on the worker's host again.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-10 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0021'
down_revision: str | None = '0020'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('clusters') as batch:
        batch.add_column(sa.Column('login', sa.String(length=330), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('clusters') as batch:
        batch.drop_column('login')
