"""training run kinds: sft, rft and dpo (and prm, for process reward models) beside reward, ppo and grpo

Downgrade: restores the old kind check; refuses (changing nothing) while runs of kind sft, rft, dpo or prm
exist, since the old schema cannot hold them: delete those runs first.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01 20:40:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0007'
down_revision: str | None = '0006'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD = "kind IN ('reward', 'ppo', 'grpo')"
NEW = "kind IN ('reward', 'prm', 'sft', 'rft', 'dpo', 'grpo', 'ppo')"


def upgrade() -> None:
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_training_runs_kind'), type_='check')
        batch_op.create_check_constraint(op.f('ck_training_runs_kind'), NEW)


def downgrade() -> None:
    # Runs of the new kinds cannot be expressed before this revision: refuse rather than delete them.
    newer = op.get_bind().execute(sa.text(
        "SELECT count(*) FROM training_runs WHERE kind NOT IN ('reward', 'ppo', 'grpo')")).scalar()
    if newer:
        raise RuntimeError(f"{newer} training run(s) of kind sft, rft, dpo or prm exist; delete them before "
                           "downgrading below revision 0007")
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_training_runs_kind'), type_='check')
        batch_op.create_check_constraint(op.f('ck_training_runs_kind'), OLD)
