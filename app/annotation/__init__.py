"""Annotation: the queue, a task, rankings and the pairs they expand into, step labels, and which prompt comes next.

Other packages use `rankings` (submit one, with its pairs), `pairs` (tiers → chosen/rejected), `steps`, `queue` and
`selection`; the app mounts `routes`; the worker runs `priority_job`.
"""

__all__ = ["pairs", "priority_job", "queue", "rankings", "routes", "selection", "steps"]
