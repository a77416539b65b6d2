"""What the Slurm and Ray tests share: a clusters file the app and its workers read, a reward run sent to a
cluster, a worker in its own process (to be killed), and the engines' "cannot run here" rule (fail in CI)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import tomli_w

from tests.conftest import IN_CI, TEST_SECRET


def unavailable(engine: str, reason: str) -> None:
    """An engine that cannot start here: the test fails in CI (which installs and starts both), else skips."""
    if IN_CI:
        pytest.fail(f"{engine} is required in CI: {reason}", pytrace=False)
    pytest.skip(reason=f"{engine} tests skipped: {reason}")


def use_clusters(app: Any, monkeypatch: pytest.MonkeyPatch, path: Path, clusters: dict[str, dict[str, Any]]) -> Path:
    """Write `clusters` as PREFLAB_CLUSTERS_FILE and point the test app's settings at it, with a data directory of
    the test's own beside it (until the test ends): ids start again with every test's database, and a run directory
    (and the cluster's job in it) of an earlier test must not pass for this test's."""
    path.write_text(tomli_w.dumps({"clusters": clusters}), encoding="utf-8")
    data_dir = path.parent / "data"
    data_dir.mkdir(exist_ok=True)
    settings = app.state.settings.model_copy(update={"clusters_file": path, "data_dir": data_dir})
    monkeypatch.setitem(app.state._state, "settings", settings)  # Starlette's State keeps its values in _state
    return path


def reward_run(client: Any, project_id: int, export_id: int, base: Path, where: str,
               resources: dict[str, Any] | None = None, **config: Any) -> dict[str, Any]:
    body = {"kind": "reward", "export_id": export_id, "base_model": str(base), "where": where, "resources": resources,
            "config": {"steps": 4, "batch_size": 4, "lr": 1e-3, "log_every": 1, "eval_every": 1000000} | config}
    r = client.post(f"/api/projects/{project_id}/training-runs", json=body)
    assert r.status_code == 202, r.text
    return dict(r.json())


def spawn_worker(app: Any, *, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    """`preflab worker` in its own process on the test app's database, data directory and clusters file."""
    settings = app.state.settings
    full = {k: v for k, v in os.environ.items() if not k.startswith("PREFLAB_")}
    full.update(PREFLAB_DATABASE_URL=settings.database_url, PREFLAB_DATA_DIR=str(settings.data_dir),
                PREFLAB_SECRET_KEY=TEST_SECRET, PREFLAB_CLUSTERS_FILE=str(settings.clusters_file))
    full.update(env or {})
    with open(Path(settings.data_dir) / "worker-output.log", "ab") as output:
        return subprocess.Popen([sys.executable, "-m", "app.cli", "worker", "--poll", "0.1", "--heartbeat", "0.1"],
                                env=full, stdout=output, stderr=subprocess.STDOUT)
