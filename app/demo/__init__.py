"""The demo: a ready SQLite instance with an account per role and a GSM8K project from shipped data.

The `preflab demo` command uses `seed`.
"""

__all__ = ["seed"]
