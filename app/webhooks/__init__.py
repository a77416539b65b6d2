"""Webhooks: a project's HTTPS URLs told of its events, each delivery signed, retried and logged."""
