"""Exports: immutable pair, ranking, prompt, SFT and step datasets written from one database snapshot, with their card.

Other packages use `service` (request, list, read, delete an export), `writer` (write one from a snapshot) and `push`
(to a Hub-compatible server); the app mounts `routes`; the worker runs `job`.
"""

__all__ = ["job", "push", "routes", "service", "writer"]
