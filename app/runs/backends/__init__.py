"""Where a run's command line executes: one interface (`base`), on the worker's host, on Slurm or on Ray Jobs.

`clusters` reads the named clusters an admin configured and hands back the backend for one; the train job submits
through it, polls it, copies new log text from its stored offset and cancels through it. Every module here loads
the standard library alone at import (the trainer's supervisor runs beside a whole training run); the Ray client is
imported when a Ray cluster is first used.
"""

__all__ = ["base", "clusters", "local", "ray_jobs", "slurm"]
