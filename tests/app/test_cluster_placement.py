"""Where a run executes: the clusters file, a run's `where` and `resources` checked before any job exists, and the
local backend as the default that every run without a `where` keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select

from app.models import Job, TrainingRun
from app.runs.backends import clusters
from app.runs.backends.base import Resources, Submission
from tests.app.test_training_progress import _engineer_page
from tests.app.test_training_runs import _export, _ranked_project, models_dir  # noqa: F401 (a fixture)
from tests.support.clusters import use_clusters


def test_resources_refuse_what_no_backend_can_give_naming_the_field() -> None:
    assert Resources.from_dict({"gpus": 2, "nodes": 2, "workers": 4}).per_node == 2
    for given, starts in (({"workers": 3, "nodes": 2}, "workers must be a multiple of nodes"),
                          ({"gpus": -1}, "gpus must be at least 0"), ({"nodes": 0}, "nodes must be at least 1"),
                          ({"cpus": 1.5}, "cpus must be a whole number"), ({"memory_gb": 0}, "memory_gb must be"),
                          ({"partition": "a\nb"}, "partition must be one line"), ({"gpu": 1}, "gpu is not a resource")):
        with pytest.raises(ValueError, match=f"^{starts}"):
            Resources.from_dict(given)
    # a cluster's defaults, with the run's own over them
    assert Resources.from_dict({"gpus": 1}, base=Resources(gpus=4, partition="a100")) == Resources(gpus=1,
                                                                                                   partition="a100")


def test_the_clusters_file_names_the_key_at_fault(tmp_path: Path) -> None:
    assert list(clusters.load(None)) == ["local"]
    path = tmp_path / "clusters.toml"
    for text, said in (('[clusters.a]\nkind = "pbs"\nshared_dir = "/s"', "clusters.a.kind must be slurm or ray"),
                       ('[clusters.a]\nkind = "slurm"', "clusters.a.shared_dir"),
                       ('[clusters.a]\nkind = "ray"\nshared_dir = "/s"', "clusters.a.resources.address"),
                       ('[clusters.a]\nkind = "slurm"\nshared_dir = "/s"\nqueue = "x"', "clusters.a.queue is not"),
                       ('[clusters.a]\nkind = "slurm"\nshared_dir = "/s"\nresources = {gpus = -1}',
                        "clusters.a.resources: gpus must be at least 0"),
                       ('[clusters.local]\nkind = "slurm"', "clusters.local: local is built in"),
                       ("not toml =", str(path))):
        path.write_text(text)
        with pytest.raises(clusters.ClusterError, match=said.replace(".", r"\.")):
            clusters.load(path)


def test_a_submission_record_survives_a_reload_whole(tmp_path: Path) -> None:
    record = Submission("slurm", "42", 2, log_offset=1234, log_file=str(tmp_path / "slurm-2.log"))
    record.save(tmp_path / "submission.json")
    assert Submission.load(tmp_path / "submission.json") == record
    (tmp_path / "submission.json").write_text("{")  # half a file: treated as no record, never as a wrong one
    assert Submission.load(tmp_path / "submission.json") is None


def test_where_and_resources_are_checked_before_any_job_exists(db, app, make_user, make_project, token_for, api,
                                                               models_dir, monkeypatch, tmp_path) -> None:  # noqa: F811
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {
        "hpc": {"kind": "slurm", "shared_dir": str(tmp_path), "resources": {"partition": "gpu", "nodes": 2,
                                                                              "workers": 2}}})
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    pairs = _export(eng, app, project_id, "pairs")
    url = f"/api/projects/{project_id}/training-runs"
    base = {"kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"])}
    before = db.scalar(select(func.count(Job.id)))
    db.rollback()
    for extra, field, said in (({"where": "gpu-farm"}, "where", "no cluster named 'gpu-farm'; configured: local, hpc"),
                               ({"where": "hpc", "resources": {"workers": 3}}, "resources.workers", "multiple of"),
                               ({"where": "hpc", "resources": {"gpu": 1}}, "resources.gpu", "not a resource"),
                               ({"where": "hpc", "resources": {"address": "http://10.0.0.1:8265"}},
                                "resources.address", "the cluster's own"),
                               ({"resources": {"gpus": 1}}, "resources", "a local run takes the worker's host")):
        r = eng.post(url, json=base | extra)
        assert r.status_code == 422, (extra, r.text)
        detail = r.json()["detail"][0]
        assert detail["field"] == field and said in detail["message"], (extra, detail)
    assert db.scalar(select(func.count(Job.id))) == before
    assert db.scalar(select(func.count(TrainingRun.id))) == 0
    db.rollback()  # end the read: on SQLite an open transaction holds the lock the next request writes under
    # accepted: the run records its cluster and what it asked for over the cluster's defaults
    r = eng.post(url, json=base | {"where": "hpc", "resources": {"gpus": 1, "time_limit_min": 30}})
    assert r.status_code == 202, r.text
    config = eng.get(f"/api/training-runs/{r.json()['run_id']}").json()["config"]
    assert config["where"] == {"cluster": "hpc", "kind": "slurm", "resources": {"gpus": 1, "time_limit_min": 30}}
    # a run without `where` is local, and its config is as it always was
    r = eng.post(url, json=base)
    assert "where" not in eng.get(f"/api/training-runs/{r.json()['run_id']}").json()["config"]


def test_the_training_form_offers_the_clusters_and_names_a_bad_resource(db, app, make_user, make_project, browser,
                                                                       monkeypatch, tmp_path) -> None:
    project, export, page = _engineer_page(db, app, make_user, make_project, browser)
    assert 'name="where"' not in page.get(f"/projects/{project.id}/training").text  # only local: nothing to choose
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml", {"hpc": {"kind": "slurm", "shared_dir": str(tmp_path)}})
    form = page.get(f"/projects/{project.id}/training").text
    assert '<option value="hpc"' in form and 'name="resources"' in form
    shown = page.post(f"/projects/{project.id}/training", {
        "kind": "reward", "export_id": str(export.id), "base_model": "", "reward_run_id": "", "where": "hpc",
        "resources": "workers = 3\nnodes = 2"})
    assert shown.status_code == 422, shown.text[-1500:]
    error = shown.text.split('class="error"', 1)[1].split("</p>", 1)[0]
    assert "<strong>Resources (TOML), workers" in error and "multiple of nodes" in error, error
