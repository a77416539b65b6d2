"""webhooks: a project's HTTPS hooks and their deliveries; jobs.run_after, so a retry can wait out its backoff

Downgrade: drops both webhook tables (the hooks, their encrypted secrets and the delivery log are lost; a lead
registers the hooks again) and jobs.run_after (a queued retry is then claimed at once instead of after its backoff).

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02 20:15:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0011'
down_revision: str | None = '0010'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('run_after', sa.DateTime(timezone=True), nullable=True))
    op.create_table('webhooks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('url', sa.String(length=1000), nullable=False),
    sa.Column('events', JSON, nullable=False),
    sa.Column('secret', sa.Text(), nullable=False),
    sa.Column('allow_private', sa.Boolean(), nullable=False),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_webhooks_created_by_id_users'),
                            ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_webhooks_project_id_projects'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhooks'))
    )
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_webhooks_project_id'), ['project_id'], unique=False)
    op.create_table('webhook_deliveries',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('webhook_id', sa.Integer(), nullable=False),
    sa.Column('uid', sa.String(length=36), nullable=False),
    sa.Column('event', sa.String(length=40), nullable=False),
    sa.Column('payload', JSON, nullable=False),
    sa.Column('state', sa.String(length=12), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('status_code', sa.Integer(), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('log', JSON, nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('delivered_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('pending', 'delivered', 'failed')", name=op.f('ck_webhook_deliveries_state')),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_webhook_deliveries_job_id_jobs'),
                            ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['webhook_id'], ['webhooks.id'], name=op.f('fk_webhook_deliveries_webhook_id_webhooks'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_webhook_deliveries')),
    sa.UniqueConstraint('uid', name=op.f('uq_webhook_deliveries_uid'))
    )
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.create_index('ix_webhook_deliveries_webhook_id_id', ['webhook_id', 'id'], unique=False)


def downgrade() -> None:
    # Hooks are configuration a lead re-enters and deliveries a log of what was sent; neither is a label.
    with op.batch_alter_table('webhook_deliveries', schema=None) as batch_op:
        batch_op.drop_index('ix_webhook_deliveries_webhook_id_id')
    op.drop_table('webhook_deliveries')
    with op.batch_alter_table('webhooks', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_webhooks_project_id'))
    op.drop_table('webhooks')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('run_after')
