"""label metadata: provenance of AI rankings and pairs (raw judge probabilities, principles, confidence)

Data migration: existing rankings and pairs get `{}` as their metadata.
Downgrade: drops rankings.metadata and pairs.metadata; the AI labels' provenance is lost, the labels stay.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30 07:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0004'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON().with_variant(postgresql.JSONB(), 'postgresql')


def upgrade() -> None:
    # Existing rows get an empty object, so the columns can be NOT NULL like the other JSON columns.
    with op.batch_alter_table('rankings', schema=None) as batch_op:
        batch_op.add_column(sa.Column('metadata', JSON, nullable=False, server_default=sa.text("'{}'")))
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('metadata', JSON, nullable=False, server_default=sa.text("'{}'")))


def downgrade() -> None:
    with op.batch_alter_table('pairs', schema=None) as batch_op:
        batch_op.drop_column('metadata')
    with op.batch_alter_table('rankings', schema=None) as batch_op:
        batch_op.drop_column('metadata')
