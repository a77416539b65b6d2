"""Quality: agreement between annotators and its flags, gold tasks, step agreement, the judge against humans, rollups.

Other packages use `rollups` (the figures a page shows, live or from the rollup), `agreement`, `judge_agreement`,
`gold` and `charts`; the app mounts `routes`; the worker runs `rollup_job`.
"""

__all__ = ["agreement", "charts", "gold", "judge_agreement", "rollup_job", "rollups", "routes"]
