"""model_endpoints.api_key becomes TEXT: it holds a Fernet token (`fernet:...`), longer than the key it encrypts

The keys themselves are encrypted by the app, not here: the encryption key is app configuration
(PREFLAB_ENCRYPTION_KEY, or the dev key in the data directory) that a migration run from a bare database URL
does not have. Every app start encrypts the keys still in plain text (app.judge.endpoints.seal_plain_keys).

Downgrade: the column goes back to VARCHAR(500), which the code before this revision reads as the plain key.
An encrypted key would be sent as the key itself, so the downgrade refuses while any is stored; remove the
keys first (an admin enters them again after the downgrade).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02 02:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0009'
down_revision: str | None = '0008'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table('model_endpoints', schema=None) as batch_op:
        batch_op.alter_column('api_key', existing_type=sa.String(length=500), type_=sa.Text(),
                              existing_nullable=True)


def downgrade() -> None:
    encrypted = op.get_bind().execute(sa.text(
        "SELECT count(*) FROM model_endpoints WHERE api_key LIKE 'fernet:%'")).scalar()
    if encrypted:
        raise RuntimeError(f"{encrypted} model-endpoint API key(s) are stored encrypted, which the schema before "
                           "revision 0009 cannot use; remove them (clear_api_key) before downgrading")
    with op.batch_alter_table('model_endpoints', schema=None) as batch_op:
        batch_op.alter_column('api_key', existing_type=sa.Text(), type_=sa.String(length=500),
                              existing_nullable=True)
