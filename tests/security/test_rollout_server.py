"""GRPO's `server_base_url` (the rollout server the trainer calls) is checked again when the run starts, with the
model endpoints' outbound rules as they stand then: a name that resolves inward by now, or an endpoint whose
trust was withdrawn, fails the run before any trainer starts."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from app.jobs import queue as jobs
from app.judge import endpoints
from app.models import Job, ModelEndpoint, Project, TrainingRun, User
from app.platform import outbound
from app.runs import training_runs
from tests.security.world import World

HOST = "rollouts.example.test"


class _Dns:
    """What the URL checks resolve HOST to (the rest resolves as usual)."""

    IPPROTO_TCP = socket.IPPROTO_TCP

    def __init__(self, address: str) -> None:
        self.address = address

    def getaddrinfo(self, name: str, port: Any, *args: Any, **kwargs: Any) -> Any:
        if name == HOST:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (self.address, port))]
        return socket.getaddrinfo(name, port, *args, **kwargs)


def _queue_run(app: Any, world: World, url: str, who: str) -> tuple[int, int]:
    """A GRPO run accepted the way `request_run` accepts its server URL (checked now), queued as its job."""
    with app.state.session_factory() as db:
        actor = db.get(User, world.user_ids[who])
        checked = endpoints.check_server_url(db, actor, url, field="config.server_base_url")
        project = db.get(Project, world.a.project_id)
        config = {"server_base_url": checked, "server_model": "m"}
        run = TrainingRun(project_id=project.id, kind="grpo", export_id=world.a.export_id, state="queued",
                          created_by_id=actor.id, config={"user": config, "resolved": config | {"steps": 1}})
        db.add(run)
        db.flush()
        job = jobs.enqueue(db, "train", {"training_run_id": run.id}, project=project, actor=actor, max_attempts=1)
        run.job_id = job.id
        db.commit()
        return run.id, job.id


def _run_worker(app: Any) -> None:
    from app.worker import Worker

    Worker(app.state.settings, session_factory=app.state.session_factory, poll_s=0.05,
           heartbeat_s=0.2).run(exit_when_idle=True)


def _outcome(app: Any, run_id: int, job_id: int) -> tuple[str, str, str]:
    with app.state.session_factory() as db:
        job = db.get(Job, job_id)
        return job.state, job.error or "", db.get(TrainingRun, run_id).state


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_a_rollout_server_whose_name_turns_inward_fails_the_run_at_start(app: Any, world: World,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    dns = _Dns("93.184.216.34")  # public when the admin's run is accepted
    monkeypatch.setattr(outbound, "socket", dns)
    run_id, job_id = _queue_run(app, world, f"http://{HOST}:8000/v1", "admin")
    dns.address = "127.0.0.1"  # by the time the run starts, the name answers loopback
    _run_worker(app)
    state, error, run_state = _outcome(app, run_id, job_id)
    assert state == "failed" and run_state == "failed"
    assert error.startswith("config.server_base_url: points at a private or loopback address (127.0.0.1)"), error
    assert not (training_runs.run_dir(app.state.settings.data_dir, run_id) / "run.toml").exists()  # no trainer ran


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_an_endpoints_withdrawn_trust_fails_a_run_that_samples_from_it(app: Any, world: World) -> None:
    # world's endpoint (10.9.8.7) is a trusted private host: a lead may name its URL for rollouts
    run_id, job_id = _queue_run(app, world, "http://10.9.8.7:8000/v1", "lead")
    with app.state.session_factory() as db:
        db.get(ModelEndpoint, world.endpoint_id).allow_private = False
        db.commit()
    _run_worker(app)
    state, error, run_state = _outcome(app, run_id, job_id)
    assert (state, run_state) == ("failed", "failed")
    assert "config.server_base_url" in error and "private or loopback address (10.9.8.7)" in error, error
