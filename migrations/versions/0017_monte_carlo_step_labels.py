"""monte carlo step labels: rankings of source 'mc', the step labels of a Monte-Carlo estimation run

A Monte-Carlo run is a judge_runs row (params.method "monte_carlo"); its rankings name it in judge_run_id, as the
AI judge's do, and hold step labels only.

Downgrade: deletes the Monte-Carlo rankings and their step labels (the old checks cannot hold them; a run of the
job makes them again); the runs themselves stay.

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06 18:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0017'
down_revision: str | None = '0016'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

OLD_SOURCE = "source IN ('human', 'ai', 'imported')"
NEW_SOURCE = "source IN ('human', 'ai', 'imported', 'mc')"
OLD_LABELLER = ("(source = 'human' AND annotator_id IS NOT NULL AND judge_run_id IS NULL)"
                " OR (source = 'ai' AND judge_run_id IS NOT NULL AND annotator_id IS NULL)"
                " OR (source = 'imported' AND annotator_id IS NULL AND judge_run_id IS NULL)")
NEW_LABELLER = ("(source = 'human' AND annotator_id IS NOT NULL AND judge_run_id IS NULL)"
                " OR (source IN ('ai', 'mc') AND judge_run_id IS NOT NULL AND annotator_id IS NULL)"
                " OR (source = 'imported' AND annotator_id IS NULL AND judge_run_id IS NULL)")


def _checks(source: str, labeller: str) -> None:
    with op.batch_alter_table('rankings', schema=None) as batch_op:
        batch_op.drop_constraint(op.f('ck_rankings_source'), type_='check')
        batch_op.drop_constraint(op.f('ck_rankings_labeller'), type_='check')
        batch_op.create_check_constraint(op.f('ck_rankings_source'), source)
        batch_op.create_check_constraint(op.f('ck_rankings_labeller'), labeller)


def upgrade() -> None:
    _checks(NEW_SOURCE, NEW_LABELLER)


def downgrade() -> None:
    bind = op.get_bind()
    # Explicitly, not by the foreign key's cascade: SQLite enforces it only with its foreign_keys pragma on.
    bind.execute(sa.text("DELETE FROM step_labels WHERE ranking_id IN (SELECT id FROM rankings WHERE source = 'mc')"))
    bind.execute(sa.text("DELETE FROM rankings WHERE source = 'mc'"))
    _checks(OLD_SOURCE, OLD_LABELLER)
