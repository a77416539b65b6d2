"""Training runs from the app: launch on an export, follow them, check a reward model, iterate the loop.

Other packages use `training_runs` and `iteration`; the app mounts `routes`; the worker runs `train_job` (which also
runs alone as the trainer's supervisor, so this door imports nothing).
"""

__all__ = ["iteration", "routes", "train_job", "training_runs"]
