"""Quality: agreement between annotators and its flags, gold tasks, step agreement, the judge against humans, rollups.

Other packages use `rollups` (the figures a page shows, and how fresh they are), `agreement`, `judge_agreement`,
`gold`, `charts` and `upkeep` (the kept figures: their drain and rebuild); the app mounts `routes`; the worker runs
`rollup_job` (its jobs, and the Sweeper that keeps the agreement figures fresh).
"""

__all__ = ["agreement", "charts", "gold", "judge_agreement", "rollup_job", "rollups", "routes", "upkeep"]
