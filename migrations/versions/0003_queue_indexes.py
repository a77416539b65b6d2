"""queue indexes: a prompt's load, an annotator's tasks, gold prompts

Downgrade: drops the three indexes; no data changes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30 06:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0003'
down_revision: str | None = '0002'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index('ix_assignments_prompt_id_round_state', 'assignments', ['prompt_id', 'round', 'state'])
    op.create_index('ix_assignments_annotator_id_round_state', 'assignments', ['annotator_id', 'round', 'state'])
    op.create_index('ix_prompts_project_id_gold', 'prompts', ['project_id', 'id'],
                    postgresql_where=sa.text('gold_tiers IS NOT NULL'), sqlite_where=sa.text('gold_tiers IS NOT NULL'))


def downgrade() -> None:
    op.drop_index('ix_prompts_project_id_gold', table_name='prompts')
    op.drop_index('ix_assignments_annotator_id_round_state', table_name='assignments')
    op.drop_index('ix_assignments_prompt_id_round_state', table_name='assignments')
