"""Clusters configured in the app, on the real engines (a local Ray head, a single-node Slurm; never mocked): the
connection test submits a trivial job and says how long it took, or the backend's own words; a cluster's cap holds
a second run queued, saying what it waits for, until the first run ends."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from app.runs.backends.slurm import KNOWN_HOSTS_ENV
from tests.app.test_cluster_ray import head  # noqa: F401 (a fixture: the real Ray head)
from tests.app.test_cluster_slurm import slurm  # noqa: F401 (a fixture: the real Slurm)
from tests.app.test_training_runs import _export, _ranked_project, _work, models_dir  # noqa: F401 (a fixture)
from tests.conftest import only_on
from tests.support import sshd as local_sshd
from tests.support.clusters import reward_run, spawn_worker, unavailable, use_clusters
from tests.support.server import wait_for
from training.hold import ENV as HOLD_ENV


@pytest.fixture
def admin(db, app, make_user, api, token_for, monkeypatch, tmp_path_factory):  # type: ignore[no-untyped-def]
    """An admin's API client, on a data directory of the test's own under the shared path (no clusters file)."""
    use_clusters(app, monkeypatch, tmp_path_factory.mktemp("conf") / "clusters.toml", {})
    client = api(token_for(db, make_user(db, "admin")))
    db.commit()
    return client


def _add(admin: Any, **body: Any) -> dict[str, Any]:
    r = admin.post("/api/v1/admin/clusters", json=body)
    assert r.status_code == 201, r.text
    return dict(r.json())


def test_ray_connection_test_runs_a_job_or_says_what_the_client_said(db, app, admin, head,  # noqa: F811
                                                                     tmp_path) -> None:
    only_on(db, "sqlite", "the engine is the same on both")
    _add(admin, name="lab", kind="ray", address=head.address, shared_dir=str(tmp_path), secret="a-ray-token")
    passed = admin.post("/api/v1/admin/clusters/lab/test")
    assert passed.status_code == 200, passed.text
    out = passed.json()
    assert out["ok"] is True and out["seconds"] > 0 and "printed '1'" in out["detail"], out
    assert "a-ray-token" not in passed.text
    _add(admin, name="gone", kind="ray", address="http://127.0.0.1:9", shared_dir=str(tmp_path))
    failed = admin.post("/api/v1/admin/clusters/gone/test").json()
    assert failed["ok"] is False and "127.0.0.1:9" in failed["detail"], failed
    assert admin.post("/api/v1/admin/clusters/nowhere/test").status_code == 404


def test_slurm_connection_test_runs_sbatch_wrap_true(db, app, admin, slurm, tmp_path) -> None:  # noqa: F811
    only_on(db, "sqlite", "the engine is the same on both")
    _add(admin, name="hpc", kind="slurm", shared_dir=str(tmp_path))
    out = admin.post("/api/v1/admin/clusters/hpc/test").json()
    assert out["ok"] is True and "sbatch --wrap true" in out["detail"] and out["seconds"] > 0, out
    _add(admin, name="nopart", kind="slurm", partition="<b>nope</b>", shared_dir=str(tmp_path))
    refused = admin.post("/api/v1/admin/clusters/nopart/test").json()
    assert refused["ok"] is False and "sbatch failed" in refused["detail"], refused  # Slurm's own words follow
    # The page shows the same words, escaped: the partition Slurm quotes back is text, not markup.
    page = admin.post("/admin/clusters/nopart/test")
    assert page.status_code == 200 and "<b>nope</b>" not in page.text
    shown = page.text.split('id="connection-test"', 1)[1].split("</section>", 1)[0]
    assert "Failed after" in shown and "invalid partition specified: &lt;b&gt;nope&lt;/b&gt;" in shown


def test_ray_cap_holds_a_second_run_queued_until_the_first_ends(db, app, admin, make_user, make_project, api,
                                                                token_for, models_dir, head,  # noqa: F811
                                                                tmp_path, tmp_path_factory) -> None:
    only_on(db, "sqlite", "the engine is the same on both; the cap's lock is Postgres's own")
    release = tmp_path / "release"
    _add(admin, name="lab", kind="ray", address=head.address, shared_dir=str(tmp_path_factory.getbasetemp()),
         resources={"cpus": 1}, env={HOLD_ENV: f"train.step.2={release}"}, max_running=1,
         job_prefix=f"preflab-{tmp_path.name}"[:40].replace(".", "-"))
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    first = reward_run(eng, project_id, pairs, models_dir["reward"], "lab")
    second = reward_run(eng, project_id, pairs, models_dir["reward"], "lab")
    worker = spawn_worker(app)
    try:
        wait_for("the first run to reach step 2 on Ray", Path(f"{release}.held").exists, timeout=600, every=0.1)
        _work(app)  # a second worker takes the second run, and gives it back: the cluster is full
        job = eng.get(f"/api/jobs/{second['job_id']}").json()
        assert job["state"] == "queued" and job["message"] == "waiting for a slot on lab (1 of 1 running)", job
        assert eng.get(f"/api/training-runs/{second['run_id']}").json()["state"] == "queued"
        assert 'id="run-waiting">waiting for a slot on lab (1 of 1 running)<' in eng.get(
            f"/training-runs/{second['run_id']}").text
        [listed] = admin.get("/api/v1/admin/clusters").json()
        assert listed["running"] == 1 and listed["max_running"] == 1
        release.touch()
        wait_for("the second run to end", lambda: eng.get(f"/api/jobs/{second['job_id']}").json()["state"]
                 in ("succeeded", "failed"), timeout=600)
    finally:
        release.touch()
        worker.send_signal(signal.SIGTERM)
        worker.wait(timeout=60)
    for run in (first, second):
        assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "succeeded"
    log = (Path(app.state.settings.data_dir) / "jobs" / f"{second['job_id']}.log").read_text()
    # However often a worker looked again, the log says once that the run waits and once that it got its slot.
    assert log.count("waiting for a slot on lab (1 of 1 running)") == 1 and log.count("got a slot on lab") == 1
    assert log.count("claimed by") == 2


@pytest.fixture(scope="module")
def sshd(slurm) -> Iterator[local_sshd.Sshd]:  # type: ignore[no-untyped-def]  # noqa: F811
    """A real sshd on 127.0.0.1 standing in for the cluster's login node: its sessions see the test's Slurm."""
    if local_sshd.missing():
        unavailable("sshd", f"not installed: {', '.join(local_sshd.missing())} (apt-get install openssh-server)")
    try:
        server = local_sshd.start(slurm.env)
    except (RuntimeError, subprocess.SubprocessError) as exc:
        unavailable("sshd", f"it did not start: {exc}")
    yield server
    server.stop()


def test_slurm_through_a_login_node_runs_every_command_over_ssh_with_the_stored_key(
        db, app, admin, make_user, make_project, api, token_for, models_dir, slurm, sshd,  # noqa: F811
        tmp_path, tmp_path_factory, monkeypatch) -> None:
    only_on(db, "sqlite", "the engine is the same on both")
    monkeypatch.setenv(KNOWN_HOSTS_ENV, str(sshd.known_hosts))
    shared = str(tmp_path_factory.getbasetemp())
    _add(admin, name="login", kind="slurm", login=sshd.login, secret=sshd.private_key, shared_dir=shared,
         resources={"cpus": 1})
    [listed] = admin.get("/api/v1/admin/clusters").json()
    assert listed["login"] == sshd.login and listed["secret"] == "set" and "PRIVATE KEY" not in str(listed)
    out = admin.post("/api/v1/admin/clusters/login/test").json()
    assert out["ok"] is True and f"through {sshd.login}" in out["detail"], out
    # The login node's host key was taken on first contact and is checked from now on.
    assert sshd.known_hosts.read_text().rstrip().endswith(sshd.host_key)
    logins = sshd.log().count("Accepted publickey")
    assert logins >= 2  # sbatch, then scontrol until the job ended

    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=8)
    pairs = _export(eng, app, project_id, "pairs")
    run = reward_run(eng, project_id, pairs, models_dir["reward"], "login")
    _work(app)
    job = eng.get(f"/api/jobs/{run['job_id']}").json()
    assert job["state"] == "succeeded", job
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["state"] == "succeeded"
    log = (Path(app.state.settings.data_dir) / "jobs" / f"{run['job_id']}.log").read_text()
    assert f"(through {sshd.login})" in log and "progress: step 4/4" in log
    assert sshd.log().count("Accepted publickey") > logins  # the run's sbatch and polls went over SSH too

    # A key the login node does not accept: the test says so in ssh's words, naming the node; nothing runs.
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(tmp_path / "stranger")], check=True)
    _add(admin, name="stranger", kind="slurm", login=sshd.login, secret=(tmp_path / "stranger").read_text(),
         shared_dir=shared)
    refused = admin.post("/api/v1/admin/clusters/stranger/test").json()
    assert refused["ok"] is False, refused
    assert f"ssh to the login node {sshd.login} of cluster stranger failed" in refused["detail"], refused
    assert "Permission denied" in refused["detail"], refused
    # A login node is Slurm's: a Ray cluster given one is refused, naming the field.
    bad = admin.post("/api/v1/admin/clusters", json={"name": "rayish", "kind": "ray", "address": "http://h:8265",
                                                      "login": sshd.login, "shared_dir": shared})
    assert bad.status_code == 422 and '"field":"login"' in bad.text.replace(" ", ""), bad.text
