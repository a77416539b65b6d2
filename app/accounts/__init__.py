"""Accounts: users, passwords, sessions and API tokens, and who may do what."""
