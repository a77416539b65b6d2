"""step labels (process supervision): completions' stored steps, per-step labels of a ranking, steps in drafts

Downgrade: drops step_labels, completions.steps and assignment_drafts.step_labels; every step label and stored
step split is lost (rankings, pairs and drafts' tiers stay).

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02 19:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0010'
down_revision: str | None = '0009'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('steps', JSON, nullable=True))

    with op.batch_alter_table('assignment_drafts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('step_labels', JSON, server_default='{}', nullable=False))

    op.create_table('step_labels',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('ranking_id', sa.Integer(), nullable=False),
    sa.Column('completion_id', sa.Integer(), nullable=False),
    sa.Column('step_index', sa.Integer(), nullable=False),
    sa.Column('label', sa.Integer(), nullable=False),
    sa.CheckConstraint('label IN (1, 0, -1)', name=op.f('ck_step_labels_label')),
    sa.CheckConstraint('step_index >= 0', name=op.f('ck_step_labels_step_index')),
    sa.ForeignKeyConstraint(['completion_id'], ['completions.id'],
                            name=op.f('fk_step_labels_completion_id_completions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['ranking_id'], ['rankings.id'],
                            name=op.f('fk_step_labels_ranking_id_rankings'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_step_labels')),
    sa.UniqueConstraint('ranking_id', 'completion_id', 'step_index',
                        name=op.f('uq_step_labels_ranking_id_completion_id_step_index'))
    )
    with op.batch_alter_table('step_labels', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_step_labels_completion_id'), ['completion_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('step_labels', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_step_labels_completion_id'))
    op.drop_table('step_labels')

    with op.batch_alter_table('assignment_drafts', schema=None) as batch_op:
        batch_op.drop_column('step_labels')

    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.drop_column('steps')
