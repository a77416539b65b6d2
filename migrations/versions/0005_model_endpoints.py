"""model endpoints: OpenAI-compatible servers configured by admins (leads pick one by id)

Downgrade: drops model_endpoints; the configured endpoints (and their keys) are lost. Jobs that named one
keep its id in their payload.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0005'
down_revision: str | None = '0004'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('model_endpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('base_url', sa.String(length=1000), nullable=False),
    sa.Column('model', sa.String(length=300), nullable=False),
    sa.Column('api_key', sa.String(length=500), nullable=True),
    sa.Column('allow_private', sa.Boolean(), nullable=False),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_model_endpoints_created_by_id_users'),
                            ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_model_endpoints')),
    sa.UniqueConstraint('name', name=op.f('uq_model_endpoints_name'))
    )


def downgrade() -> None:
    op.drop_table('model_endpoints')
