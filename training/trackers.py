"""Experiment trackers (accelerate's: TensorBoard, MLflow, Weights & Biases) for a run, and where to find it in them.

`start_trackers` starts the trackers a config's `report_to` names and writes OUT/trackers.json: per tracker, where
its records are (a directory, a tracking URI) and, when there is one, a link to the run (MLflow's UI, W&B). The app's
run page reads that file. Without configuration everything stays under OUT, so nothing leaves the machine:
TensorBoard writes OUT/tensorboard/, MLflow a local store OUT/mlflow.db (MLFLOW_TRACKING_URI points it at a server),
W&B needs its own WANDB_* settings (WANDB_MODE=offline keeps it local). A resumed run continues the same
MLflow run.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

from training.run_info import write_json

TRACKERS_FILE = "trackers.json"


def start_trackers(accelerator: Any, config: Any, out: Path, resumed: bool) -> dict[str, Any]:
    """`accelerator.init_trackers` for `config.report_to`, with the run's config as hyper-parameters; what it wrote
    to OUT/trackers.json (on the main process; {} elsewhere)."""
    out = Path(out).resolve()
    name = config.run_name or out.name
    previous = _read(out / TRACKERS_FILE) if resumed else {}
    init_kwargs: dict[str, Any] = {}
    if "mlflow" in config.report_to:
        import mlflow

        if not os.environ.get("MLFLOW_TRACKING_URI"):  # MLflow's local store (its file store is deprecated)
            mlflow.set_tracking_uri(f"sqlite:///{out / 'mlflow.db'}")
        init_kwargs["mlflow"] = {"run_name": name}
        if previous.get("mlflow", {}).get("run_id"):
            init_kwargs["mlflow"]["run_id"] = previous["mlflow"]["run_id"]
    if "wandb" in config.report_to:
        init_kwargs["wandb"] = {"name": name, "dir": str(out), "resume": "allow"}
    accelerator.project_configuration.logging_dir = str(out / "tensorboard")  # TensorBoard: OUT/tensorboard/NAME
    # A resumed run keeps the hyper-parameters it started with (MLflow refuses to change a logged parameter, and a
    # resume changes `resume` itself, `steps` often).
    accelerator.init_trackers(name, config=None if previous else hyperparameters(config), init_kwargs=init_kwargs)
    if not accelerator.is_main_process:
        return {}
    found = {tracker: _where(accelerator, tracker, out, name) for tracker in config.report_to}
    write_json(out / TRACKERS_FILE, found)
    return found


def hyperparameters(config: Any) -> dict[str, Any]:
    """The config's fields as tracker hyper-parameters: scalars as they are, lists and tables as JSON text."""
    is_instance = dataclasses.is_dataclass(config) and not isinstance(config, type)
    values = dataclasses.asdict(config) if is_instance else dict(config)
    return {k: v if isinstance(v, int | float | str | bool) else json.dumps(v)
            for k, v in values.items() if v is not None}


def _where(accelerator: Any, tracker: str, out: Path, name: str) -> dict[str, Any]:
    if tracker == "tensorboard":
        return {"logdir": str(out / "tensorboard" / name), "command": f"tensorboard --logdir {out / 'tensorboard'}"}
    if tracker == "mlflow":
        import mlflow

        run = accelerator.get_tracker("mlflow", unwrap=True)
        info = run.info
        uri = mlflow.get_tracking_uri()
        found: dict[str, Any] = {"tracking_uri": uri, "experiment_id": info.experiment_id, "run_id": info.run_id}
        if uri.startswith(("http://", "https://")):
            found["url"] = f"{uri.rstrip('/')}/#/experiments/{info.experiment_id}/runs/{info.run_id}"
        else:
            found["command"] = f"mlflow ui --backend-store-uri {uri}"
        return found
    run = accelerator.get_tracker("wandb", unwrap=True)
    return {"url": getattr(run, "url", None), "run_id": getattr(run, "id", None)}


def _read(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
