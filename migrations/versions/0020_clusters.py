"""clusters: Slurm and Ray clusters configured in the app (admin page and API), each with its concurrency cap and
an optional secret stored encrypted

Downgrade: drops the table; runs already sent to one of its clusters fail when a worker next looks for it.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-09 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0020'
down_revision: str | None = '0019'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    op.create_table('clusters',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=40), nullable=False),
    sa.Column('kind', sa.String(length=10), nullable=False),
    sa.Column('address', sa.String(length=1000), nullable=True),
    sa.Column('partition', sa.String(length=200), nullable=True),
    sa.Column('shared_dir', sa.String(length=1000), nullable=False),
    sa.Column('resources', JSON, nullable=False),
    sa.Column('env', JSON, nullable=False),
    sa.Column('job_prefix', sa.String(length=40), nullable=False),
    sa.Column('max_running', sa.Integer(), nullable=True),
    sa.Column('secret', sa.Text(), nullable=True),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_clusters_created_by_id_users'),
                            ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_clusters')),
    sa.UniqueConstraint('name', name=op.f('uq_clusters_name'))
    )


def downgrade() -> None:
    op.drop_table('clusters')
