"""Webhooks: a project's HTTPS URLs told of its events, each delivery signed, retried and logged.

Other packages use `service` (fire an event); the app mounts `routes`; the worker runs `delivery_job`.
"""

__all__ = ["delivery_job", "routes", "service"]
