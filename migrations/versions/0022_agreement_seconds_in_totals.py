"""agreement_totals.seconds: each totals key's histogram of seconds (tenth → rankings) kept in its own row, in place
of the agreement_seconds table's row per (key, tenth), so a drain reads and writes a key's histogram with its totals
and computes its median there, instead of upserting a row per tenth and asking the database for the median

The histograms move as they are (no figure changes, nothing to rebuild).

Downgrade: the agreement_seconds table comes back, filled from the column, which is dropped.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-11 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0022'
down_revision: str | None = '0021'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), 'postgresql')
_KEY = ("agreement_seconds.project_id = agreement_totals.project_id AND agreement_seconds.version = "
        "agreement_totals.version AND agreement_seconds.kind = agreement_totals.kind AND agreement_seconds.key = "
        "agreement_totals.key")


def upgrade() -> None:
    with op.batch_alter_table('agreement_totals') as batch:
        batch.add_column(sa.Column('seconds', JSON, nullable=True))
    if op.get_bind().dialect.name == 'postgresql':
        op.execute("UPDATE agreement_totals SET seconds = h.seconds FROM (SELECT project_id, version, kind, key, "
                   "jsonb_object_agg(tenth::text, n) AS seconds FROM agreement_seconds WHERE n > 0 "
                   "GROUP BY project_id, version, kind, key) AS h WHERE h.project_id = agreement_totals.project_id "
                   "AND h.version = agreement_totals.version AND h.kind = agreement_totals.kind "
                   "AND h.key = agreement_totals.key")
    else:
        op.execute("UPDATE agreement_totals SET seconds = (SELECT json_group_object(CAST(tenth AS TEXT), n) "
                   f"FROM agreement_seconds WHERE {_KEY} AND n > 0) "
                   f"WHERE EXISTS (SELECT 1 FROM agreement_seconds WHERE {_KEY} AND n > 0)")
    op.drop_table('agreement_seconds')


def downgrade() -> None:
    op.create_table('agreement_seconds',
    sa.Column('project_id', sa.Integer(), nullable=False),
    sa.Column('version', sa.Integer(), nullable=False),
    sa.Column('kind', sa.String(length=1), nullable=False),
    sa.Column('key', sa.Integer(), nullable=False),
    sa.Column('tenth', sa.Integer(), nullable=False),
    sa.Column('n', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['project_id'], ['projects.id'], name=op.f('fk_agreement_seconds_project_id_projects'),
                            ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('project_id', 'version', 'kind', 'key', 'tenth', name=op.f('pk_agreement_seconds'))
    )
    each = ("jsonb_each_text(t.seconds)" if op.get_bind().dialect.name == 'postgresql'
            else "json_each(t.seconds)")
    op.execute("INSERT INTO agreement_seconds (project_id, version, kind, key, tenth, n) "
               "SELECT t.project_id, t.version, t.kind, t.key, CAST(e.key AS INTEGER), CAST(e.value AS INTEGER) "
               f"FROM agreement_totals AS t, {each} AS e WHERE t.seconds IS NOT NULL")
    with op.batch_alter_table('agreement_totals') as batch:
        batch.drop_column('seconds')
