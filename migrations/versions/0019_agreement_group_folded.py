"""agreement groups remember what they hold: the content hashes of their rankings, the gold order's hash and each
completion's mid-ranks as counts, so a drain folds a group's new rankings into its state instead of computing it
from all of them (app.quality.partial.extend)

Existing groups get NULL: each is computed from all its rankings at its next change, as before, and kept from then.

Downgrade: drops the column (the states stay right; drains compute every changed group in full again).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-09 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0019'
down_revision: str | None = '0018'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

JSON = sa.JSON(none_as_null=True).with_variant(postgresql.JSONB(none_as_null=True), 'postgresql')


def upgrade() -> None:
    with op.batch_alter_table('agreement_groups') as batch:
        batch.add_column(sa.Column('folded', JSON, nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('agreement_groups') as batch:
        batch.drop_column('folded')
