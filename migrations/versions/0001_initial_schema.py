"""initial schema

Downgrade: drops every table; all data is lost (there is no earlier schema to keep it in).

Revision ID: 0001
Revises:
Create Date: 2026-11-30 06:17:53.722901
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('users',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('email', sa.String(length=320), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('password_hash', sa.String(length=255), nullable=False),
    sa.Column('role', sa.String(length=20), nullable=False),
    sa.Column('active', sa.Boolean(), nullable=False),
    sa.Column('failed_logins', sa.Integer(), nullable=False),
    sa.Column('last_failed_login_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('password_changed_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("role IN ('admin', 'lead', 'annotator', 'engineer')", name=op.f('ck_users_role')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_users')),
    sa.UniqueConstraint('email', name=op.f('uq_users_email'))
    )
    op.create_table('api_tokens',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=100), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('last_used_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_api_tokens_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_api_tokens_token_hash'))
    )
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_api_tokens_user_id'), ['user_id'], unique=False)

    op.create_table('projects',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('completions_per_prompt', sa.Integer(), nullable=False),
    sa.Column('overlap', sa.Integer(), nullable=False),
    sa.Column('current_round', sa.Integer(), nullable=False),
    sa.Column('allow_ties', sa.Boolean(), nullable=False),
    sa.Column('allow_partial', sa.Boolean(), nullable=False),
    sa.Column('flags', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('skip_reasons', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('settings', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('current_rubric_id', sa.Integer(), nullable=True),
    sa.Column('current_constitution_id', sa.Integer(), nullable=True),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('completions_per_prompt >= 2 AND completions_per_prompt <= 16', name=op.f('ck_projects_k_range')),
    sa.CheckConstraint('overlap >= 1 AND overlap <= 50', name=op.f('ck_projects_overlap_range')),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_projects_created_by_id_users'), ondelete='SET NULL'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_projects')),
    sa.UniqueConstraint('name', name=op.f('uq_projects_name'))
    )
    op.create_table('user_sessions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('expires_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('ip', sa.String(length=64), nullable=False),
    sa.Column('user_agent', sa.String(length=300), nullable=False),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_user_sessions_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_user_sessions')),
    sa.UniqueConstraint('token_hash', name=op.f('uq_user_sessions_token_hash'))
    )
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_user_sessions_user_id'), ['user_id'], unique=False)

    op.create_table('audit_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('actor_id', sa.Integer(), nullable=True),
    sa.Column('project_id', sa.Integer(), nullable=True),
    sa.Column('action', sa.String(length=60), nullable=False),
    sa.Column('object_type', sa.String(length=40), nullable=False),
    sa.Column('object_id', sa.Integer(), nullable=True),
    sa.Column('data', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('ip', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['actor_id'], ['users.id'], name=op.f('fk_audit_events_actor_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_audit_events_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_audit_events'))
    )
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.create_index('ix_audit_events_project_id_created_at', ['project_id', 'created_at'], unique=False)

    op.create_table('constitutions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('principles', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('note', sa.String(length=500), nullable=False),
    sa.Column('author_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('version >= 1', name=op.f('ck_constitutions_version')),
    sa.ForeignKeyConstraint(['author_id'], ['users.id'], name=op.f('fk_constitutions_author_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_constitutions_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_constitutions')),
    sa.UniqueConstraint('project_id', 'version', name=op.f('uq_constitutions_project_id_version'))
    )
    with op.batch_alter_table('constitutions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_constitutions_project_id'), ['project_id'], unique=False)

    op.create_table('jobs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=True),
    sa.Column('payload', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('state', sa.String(length=12), nullable=False),
    sa.Column('progress', sa.Float(), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('max_attempts', sa.Integer(), nullable=False),
    sa.Column('claimed_by', sa.String(length=200), nullable=True),
    sa.Column('heartbeat_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('log_path', sa.String(length=500), nullable=True),
    sa.Column('error', sa.Text(), nullable=True),
    sa.Column('result', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('started_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('finished_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f('ck_jobs_state')),
    sa.CheckConstraint('progress >= 0 AND progress <= 1', name=op.f('ck_jobs_progress')),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_jobs_created_by_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_jobs_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_jobs'))
    )
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_jobs_project_id'), ['project_id'], unique=False)
        batch_op.create_index('ix_jobs_state_created_at', ['state', 'created_at'], unique=False)

    op.create_table('project_members',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('user_id', sa.Integer(), nullable=False),
    sa.Column('role', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("role IN ('lead', 'annotator', 'engineer')", name=op.f('ck_project_members_role')),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_project_members_project_id_projects'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['user_id'], ['users.id'], name=op.f('fk_project_members_user_id_users'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_project_members')),
    sa.UniqueConstraint('project_id', 'user_id', name=op.f('uq_project_members_project_id_user_id'))
    )
    with op.batch_alter_table('project_members', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_project_members_project_id'), ['project_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_project_members_user_id'), ['user_id'], unique=False)

    op.create_table('prompts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('messages', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=True),
    sa.Column('text_hash', sa.String(length=64), nullable=False),
    sa.Column('split', sa.String(length=10), nullable=False),
    sa.Column('reference', sa.Text(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("split IN ('train', 'heldout')", name=op.f('ck_prompts_split')),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_prompts_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_prompts')),
    sa.UniqueConstraint('project_id', 'text_hash', name=op.f('uq_prompts_project_id_text_hash'))
    )
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_prompts_project_id'), ['project_id'], unique=False)

    op.create_table('rubrics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('criteria', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('note', sa.String(length=500), nullable=False),
    sa.Column('author_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint('version >= 1', name=op.f('ck_rubrics_version')),
    sa.ForeignKeyConstraint(['author_id'], ['users.id'], name=op.f('fk_rubrics_author_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_rubrics_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rubrics')),
    sa.UniqueConstraint('project_id', 'version', name=op.f('uq_rubrics_project_id_version'))
    )
    with op.batch_alter_table('rubrics', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rubrics_project_id'), ['project_id'], unique=False)

    op.create_table('assignments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('prompt_id', sa.Integer(), nullable=False),
    sa.Column('annotator_id', sa.Integer(), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    sa.Column('state', sa.String(length=12), nullable=False),
    sa.Column('leased_until', sa.DateTime(timezone=True), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('completed_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("state IN ('leased', 'submitted', 'skipped', 'expired', 'released')", name=op.f('ck_assignments_state')),
    sa.ForeignKeyConstraint(['annotator_id'], ['users.id'], name=op.f('fk_assignments_annotator_id_users'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_assignments_project_id_projects'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_assignments_prompt_id_prompts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_assignments')),
    sa.UniqueConstraint('prompt_id', 'annotator_id', 'round', name=op.f('uq_assignments_prompt_id_annotator_id_round'))
    )
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_assignments_annotator_id'), ['annotator_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_assignments_project_id'), ['project_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_assignments_prompt_id'), ['prompt_id'], unique=False)
        batch_op.create_index('ix_assignments_state_leased_until', ['state', 'leased_until'], unique=False)

    op.create_table('completions',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('prompt_id', sa.Integer(), nullable=False),
    sa.Column('text', sa.Text(), nullable=False),
    sa.Column('source', sa.String(length=80), nullable=False),
    sa.Column('generator_name', sa.String(length=200), nullable=True),
    sa.Column('generator_params', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('seed', sa.Integer(), nullable=True),
    sa.Column('metadata', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("source IN ('imported', 'sampled', 'revision') OR source LIKE 'policy:%'", name=op.f('ck_completions_source')),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_completions_prompt_id_prompts'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_completions'))
    )
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_completions_prompt_id'), ['prompt_id'], unique=False)

    op.create_table('exports',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=20), nullable=False),
    sa.Column('format', sa.String(length=20), nullable=False),
    sa.Column('filters', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('row_count', sa.Integer(), nullable=False),
    sa.Column('row_counts', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('sha256', sa.String(length=64), nullable=True),
    sa.Column('files', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('path', sa.String(length=500), nullable=True),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('deleted_at', sa.DateTime(timezone=True), nullable=True),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_exports_created_by_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_exports_job_id_jobs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_exports_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_exports'))
    )
    with op.batch_alter_table('exports', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_exports_project_id'), ['project_id'], unique=False)

    op.create_table('judge_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('constitution_id', sa.Integer(), nullable=True),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('params', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('state', sa.String(length=12), nullable=False),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['constitution_id'], ['constitutions.id'], name=op.f('fk_judge_runs_constitution_id_constitutions'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_judge_runs_created_by_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_judge_runs_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_judge_runs'))
    )
    with op.batch_alter_table('judge_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_judge_runs_project_id'), ['project_id'], unique=False)

    op.create_table('rankings',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('prompt_id', sa.Integer(), nullable=False),
    sa.Column('round', sa.Integer(), nullable=False),
    sa.Column('source', sa.String(length=10), nullable=False),
    sa.Column('annotator_id', sa.Integer(), nullable=True),
    sa.Column('judge_run_id', sa.Integer(), nullable=True),
    sa.Column('rubric_id', sa.Integer(), nullable=True),
    sa.Column('constitution_id', sa.Integer(), nullable=True),
    sa.Column('tiers', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('display_order', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('flags', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('skipped', sa.Boolean(), nullable=False),
    sa.Column('skip_reason', sa.String(length=200), nullable=True),
    sa.Column('seconds_spent', sa.Float(), nullable=True),
    sa.Column('client_submission_id', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("(source = 'human' AND annotator_id IS NOT NULL AND judge_run_id IS NULL) OR (source = 'ai' AND judge_run_id IS NOT NULL AND annotator_id IS NULL) OR (source = 'imported' AND annotator_id IS NULL AND judge_run_id IS NULL)", name=op.f('ck_rankings_labeller')),
    sa.CheckConstraint("source IN ('human', 'ai', 'imported')", name=op.f('ck_rankings_source')),
    sa.CheckConstraint('seconds_spent IS NULL OR seconds_spent >= 0', name=op.f('ck_rankings_seconds')),
    sa.ForeignKeyConstraint(['annotator_id'], ['users.id'], name=op.f('fk_rankings_annotator_id_users'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['constitution_id'], ['constitutions.id'], name=op.f('fk_rankings_constitution_id_constitutions'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['judge_run_id'], ['judge_runs.id'], name=op.f('fk_rankings_judge_run_id_judge_runs'), ondelete='RESTRICT'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_rankings_project_id_projects'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_rankings_prompt_id_prompts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['rubric_id'], ['rubrics.id'], name=op.f('fk_rankings_rubric_id_rubrics'), ondelete='RESTRICT'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_rankings')),
    sa.UniqueConstraint('annotator_id', 'client_submission_id', name=op.f('uq_rankings_annotator_id_client_submission_id')),
    sa.UniqueConstraint('prompt_id', 'annotator_id', 'round', name=op.f('uq_rankings_prompt_id_annotator_id_round')),
    sa.UniqueConstraint('prompt_id', 'judge_run_id', 'round', name=op.f('uq_rankings_prompt_id_judge_run_id_round'))
    )
    with op.batch_alter_table('rankings', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_rankings_annotator_id'), ['annotator_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rankings_project_id'), ['project_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_rankings_prompt_id'), ['prompt_id'], unique=False)

    op.create_table('training_runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=10), nullable=False),
    sa.Column('config', sa.JSON().with_variant(postgresql.JSONB(), 'postgresql'), nullable=False),
    sa.Column('export_id', sa.Integer(), nullable=True),
    sa.Column('parent_run_id', sa.Integer(), nullable=True),
    sa.Column('base_model', sa.String(length=500), nullable=True),
    sa.Column('metrics_path', sa.String(length=500), nullable=True),
    sa.Column('model_dir', sa.String(length=500), nullable=True),
    sa.Column('state', sa.String(length=12), nullable=False),
    sa.Column('job_id', sa.Integer(), nullable=True),
    sa.Column('created_by_id', sa.Integer(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("kind IN ('reward', 'ppo', 'grpo')", name=op.f('ck_training_runs_kind')),
    sa.CheckConstraint("state IN ('queued', 'running', 'succeeded', 'failed', 'cancelled')", name=op.f('ck_training_runs_state')),
    sa.ForeignKeyConstraint(['created_by_id'], ['users.id'], name=op.f('fk_training_runs_created_by_id_users'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['export_id'], ['exports.id'], name=op.f('fk_training_runs_export_id_exports'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['job_id'], ['jobs.id'], name=op.f('fk_training_runs_job_id_jobs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['parent_run_id'], ['training_runs.id'], name=op.f('fk_training_runs_parent_run_id_training_runs'), ondelete='SET NULL'),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_training_runs_project_id_projects'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_training_runs'))
    )
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_training_runs_project_id'), ['project_id'], unique=False)

    op.create_table('pairs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('ranking_id', sa.Integer(), nullable=False),
    sa.Column('prompt_id', sa.Integer(), nullable=False),
    sa.Column('chosen_id', sa.Integer(), nullable=False),
    sa.Column('rejected_id', sa.Integer(), nullable=False),
    sa.Column('margin', sa.Integer(), nullable=False),
    sa.Column('source', sa.String(length=10), nullable=False),
    sa.Column('weight', sa.Float(), nullable=False),
    sa.Column('p', sa.Float(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("source IN ('human', 'ai', 'imported')", name=op.f('ck_pairs_source')),
    sa.CheckConstraint('chosen_id <> rejected_id', name=op.f('ck_pairs_distinct')),
    sa.CheckConstraint('margin >= 1', name=op.f('ck_pairs_margin')),
    sa.CheckConstraint('p >= 0 AND p <= 1', name=op.f('ck_pairs_p_range')),
    sa.CheckConstraint('weight >= 0', name=op.f('ck_pairs_weight')),
    sa.ForeignKeyConstraint(['chosen_id'], ['completions.id'], name=op.f('fk_pairs_chosen_id_completions'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['prompt_id'], ['prompts.id'], name=op.f('fk_pairs_prompt_id_prompts'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['ranking_id'], ['rankings.id'], name=op.f('fk_pairs_ranking_id_rankings'), ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['rejected_id'], ['completions.id'], name=op.f('fk_pairs_rejected_id_completions'), ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_pairs')),
    sa.UniqueConstraint('ranking_id', 'chosen_id', 'rejected_id', name=op.f('uq_pairs_ranking_id_chosen_id_rejected_id'))
    )
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_pairs_prompt_id'), ['prompt_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_pairs_ranking_id'), ['ranking_id'], unique=False)


    # projects ↔ rubrics/constitutions form a cycle: the "current version" keys are added last.
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.create_foreign_key(batch_op.f('fk_projects_current_rubric_id_rubrics'), 'rubrics',
                                    ['current_rubric_id'], ['id'], ondelete='SET NULL')
        batch_op.create_foreign_key(batch_op.f('fk_projects_current_constitution_id_constitutions'),
                                    'constitutions', ['current_constitution_id'], ['id'], ondelete='SET NULL')


def downgrade() -> None:
    with op.batch_alter_table('projects', schema=None) as batch_op:
        batch_op.drop_constraint(batch_op.f('fk_projects_current_rubric_id_rubrics'), type_='foreignkey')
        batch_op.drop_constraint(batch_op.f('fk_projects_current_constitution_id_constitutions'), type_='foreignkey')
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_pairs_ranking_id'))
        batch_op.drop_index(batch_op.f('ix_pairs_prompt_id'))

    op.drop_table('pairs')
    with op.batch_alter_table('training_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_training_runs_project_id'))

    op.drop_table('training_runs')
    with op.batch_alter_table('rankings', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rankings_prompt_id'))
        batch_op.drop_index(batch_op.f('ix_rankings_project_id'))
        batch_op.drop_index(batch_op.f('ix_rankings_annotator_id'))

    op.drop_table('rankings')
    with op.batch_alter_table('judge_runs', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_judge_runs_project_id'))

    op.drop_table('judge_runs')
    with op.batch_alter_table('exports', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_exports_project_id'))

    op.drop_table('exports')
    with op.batch_alter_table('completions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_completions_prompt_id'))

    op.drop_table('completions')
    with op.batch_alter_table('assignments', schema=None) as batch_op:
        batch_op.drop_index('ix_assignments_state_leased_until')
        batch_op.drop_index(batch_op.f('ix_assignments_prompt_id'))
        batch_op.drop_index(batch_op.f('ix_assignments_project_id'))
        batch_op.drop_index(batch_op.f('ix_assignments_annotator_id'))

    op.drop_table('assignments')
    with op.batch_alter_table('rubrics', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_rubrics_project_id'))

    op.drop_table('rubrics')
    with op.batch_alter_table('prompts', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_prompts_project_id'))

    op.drop_table('prompts')
    with op.batch_alter_table('project_members', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_project_members_user_id'))
        batch_op.drop_index(batch_op.f('ix_project_members_project_id'))

    op.drop_table('project_members')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_index('ix_jobs_state_created_at')
        batch_op.drop_index(batch_op.f('ix_jobs_project_id'))

    op.drop_table('jobs')
    with op.batch_alter_table('constitutions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_constitutions_project_id'))

    op.drop_table('constitutions')
    with op.batch_alter_table('audit_events', schema=None) as batch_op:
        batch_op.drop_index('ix_audit_events_project_id_created_at')

    op.drop_table('audit_events')
    with op.batch_alter_table('user_sessions', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_user_sessions_user_id'))

    op.drop_table('user_sessions')
    op.drop_table('projects')
    with op.batch_alter_table('api_tokens', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_api_tokens_user_id'))

    op.drop_table('api_tokens')
    op.drop_table('users')
