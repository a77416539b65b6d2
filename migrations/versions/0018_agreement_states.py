"""agreement states: each (prompt, round)'s contribution to the agreement figures, their running totals per scope,
the seconds histograms behind the medians, and the marks of groups waiting for the next drain

Every existing project gets a state row at formula 0, below any the app computes under: its first view queues one
rebuild from its rankings (app.quality.upkeep), after which the figures are kept up to date as rankings arrive.

Downgrade: drops the tables; the rollup job computes the figures from the rankings again (nothing in them is a
source of truth).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-08 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0018'
down_revision: str | None = '0017'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def _project_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f(f'fk_{table}_project_id_projects'),
                                   ondelete='CASCADE')


def upgrade() -> None:
    op.create_table('agreement_states',
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('formula', sa.Integer(), nullable=False),
    sa.Column('as_of', sa.DateTime(timezone=True), nullable=True),
    sa.Column('seconds', sa.Float(), nullable=False),
    sa.Column('sequence', sa.Integer(), nullable=False),
    sa.Column('total_prompts', sa.Integer(), nullable=False),
    sa.Column('gold_prompts', sa.Integer(), nullable=False),
    _project_fk('agreement_states'),
    sa.PrimaryKeyConstraint('project_id', name=op.f('pk_agreement_states'))
    )
    op.create_table('agreement_marks',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('prompt_id', sa.Integer(), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    _project_fk('agreement_marks'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_agreement_marks'))
    )
    op.create_index('ix_agreement_marks_project_id_id', 'agreement_marks', ['project_id', 'id'], unique=False)
    op.create_table('agreement_groups',
    sa.Column('prompt_id', sa.Integer(), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('state', JSON, nullable=False),
    sa.Column('agreement', sa.Float(), nullable=True),
    sa.Column('shared', sa.Boolean(), nullable=False),
    sa.Column('gold_ranked', sa.Boolean(), nullable=False),
    _project_fk('agreement_groups'),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_agreement_groups_prompt_id_prompts'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('prompt_id', 'round', 'version', name=op.f('pk_agreement_groups'))
    )
    op.create_index('ix_agreement_groups_project_id_version_agreement', 'agreement_groups',
                    ['project_id', 'version', 'agreement'], unique=False)
    op.create_table('agreement_totals',
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=1), nullable=False),
    sa.Column('key', sa.Integer(), nullable=False),
    sa.Column('rankings', sa.Integer(), nullable=False),
    sa.Column('state', JSON, nullable=False),
    sa.Column('median_seconds', sa.Float(), nullable=True),
    _project_fk('agreement_totals'),
    sa.PrimaryKeyConstraint('project_id', 'version', 'kind', 'key', name=op.f('pk_agreement_totals'))
    )
    op.create_table('agreement_seconds',
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=1), nullable=False),
    sa.Column('key', sa.Integer(), nullable=False),
    sa.Column('tenth', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    _project_fk('agreement_seconds'),
    sa.PrimaryKeyConstraint('project_id', 'version', 'kind', 'key', 'tenth', name=op.f('pk_agreement_seconds'))
    )
    # Existing projects: formula 0, so the first view queues the one rebuild that fills their states.
    op.execute("INSERT INTO agreement_states (project_id, formula, seconds, sequence, total_prompts, gold_prompts) "
               "SELECT id, 0, 0, 0, 0, 0 FROM projects")


def downgrade() -> None:
    # Figures derived from the rankings: the rollup job of the release before computes them again.
    for table in ('agreement_seconds', 'agreement_totals', 'agreement_groups', 'agreement_marks',
                  'agreement_states'):
        op.drop_table(table)
