"""prompt priorities: prompts.priority and prompts.queue_rank, for the queue's `selection` setting

A priorities job (after a reward run, or on demand) writes each prompt's priority and its position in that order;
with the project setting `selection` = `uncertainty` or `disagreement` the queue serves prompts by that position.

Downgrade: drops both columns and their index; the queue goes back to serving prompts by id (random selection),
the priorities are lost, every prompt, ranking and assignment stays.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02 19:45:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0012'
down_revision: str | None = '0011'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('priority', sa.Float(), nullable=True))
        batch_op.add_column(sa.Column('queue_rank', sa.Integer(), nullable=True))
        batch_op.create_index('ix_prompts_project_id_queue_rank', ['project_id', 'queue_rank'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.drop_index('ix_prompts_project_id_queue_rank')
        batch_op.drop_column('queue_rank')
        batch_op.drop_column('priority')
