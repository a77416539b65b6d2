"""Training runs from the app: launch on an export, follow them, check a reward model, iterate the loop.

Other packages use `training_runs` and `iteration`; the app mounts `routes` (its run page and API read a process-reward
run's figures per step through `step_figures`); the worker runs `train_job` (which also runs alone as the trainer's
supervisor, so this door imports nothing), and `train_job` submits each run through the execution backend of its
cluster (`backends`: local, Slurm, Ray), with what every job that sends work to a cluster shares (`cluster_job`:
placement, the slot, submit, follow, the log). `cluster_config` holds the clusters an admin configures in the app
(`cluster_routes`: the admin page and API) beside PREFLAB_CLUSTERS_FILE's.
"""

__all__ = ["cluster_config", "cluster_job", "cluster_routes", "estimates", "iteration", "routes", "step_figures",
           "train_job", "training_runs"]
