"""prompt extra overlap: prompts.extra_overlap, the more annotators `disagreement` gives its most contested prompts

Under the project setting `selection` = `disagreement` the priorities job gives a prompt that reached the project's
overlap and whose human rankings disagree more than the project's threshold extra rankings; the queue then caps it
at overlap + extra_overlap (0 for every existing prompt).

Downgrade: drops the column and its check; every prompt is capped at the project's overlap again. Rankings already
given beyond it stay, with their pairs.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03 05:55:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0016'
down_revision: str | None = '0015'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.add_column(sa.Column('extra_overlap', sa.Integer(), server_default='0', nullable=False))
        batch_op.create_check_constraint(op.f('ck_prompts_extra_overlap_range'),
                                         'extra_overlap >= 0 AND extra_overlap <= 50')


def downgrade() -> None:
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_prompts_extra_overlap_range'), type_='check')
        batch_op.drop_column('extra_overlap')
