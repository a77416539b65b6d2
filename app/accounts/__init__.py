"""Accounts: users, passwords, sessions and API tokens, and who may do what.

Other packages use `permissions` (the one table of who may do what), `users` and `security`; the app mounts `api`,
`pages` and `admin_pages`.
"""

__all__ = ["admin_pages", "api", "pages", "permissions", "security", "users"]
