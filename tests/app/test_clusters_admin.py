"""Clusters configured in the app: admins add, change, list and remove them (API and page), nobody else may; the
secret is stored encrypted and never shown back; the file's clusters are listed read-only and their names cannot be
taken; a project's default cluster is where its runs go when they name none. (Runs on the real engines, the cap and
the connection test: tests/app/test_clusters_engines.py.)"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select

from app.models import AuditEvent, ComputeCluster
from tests.app.test_training_runs import _export, _ranked_project, models_dir  # noqa: F401 (a fixture)
from tests.support.clusters import use_clusters

SECRET = "ray-token-7d1e-super-secret"


def _body(**over: Any) -> dict[str, Any]:
    return {"name": "lab", "kind": "ray", "address": "http://127.0.0.1:9", "shared_dir": "/shared/preflab",
            "resources": {"cpus": 2}, "max_running": 2, "secret": SECRET} | over


def _admin_and_lead(db, make_user, api, token_for):  # type: ignore[no-untyped-def]
    admin, lead = make_user(db, "admin"), make_user(db, "lead")
    clients = api(token_for(db, admin)), api(token_for(db, lead))
    db.commit()
    return clients


def test_admins_add_change_and_remove_clusters_and_nobody_else_may(db, app, make_user, api, token_for) -> None:
    admin, lead = _admin_and_lead(db, make_user, api, token_for)
    assert lead.post("/api/v1/admin/clusters", json=_body()).status_code == 403
    assert lead.get("/api/v1/admin/clusters").status_code == 403
    assert api(None).get("/api/v1/admin/clusters").status_code == 401
    created = admin.post("/api/v1/admin/clusters", json=_body())
    assert created.status_code == 201, created.text
    out = created.json()
    assert out | {"id": None} == {"id": None, "name": "lab", "kind": "ray", "source": "app",
                                  "address": "http://127.0.0.1:9", "partition": None, "login": None, "shared_dir": "/shared/preflab",
                                  "resources": {"cpus": 2}, "env_names": [], "job_prefix": "preflab",
                                  "max_running": 2, "running": 0, "secret": "set"}
    assert lead.patch(f"/api/v1/admin/clusters/{out['id']}", json={"max_running": 1}).status_code == 403
    changed = admin.patch(f"/api/v1/admin/clusters/{out['id']}", json={"max_running": 1, "resources": {"gpus": 1}})
    assert changed.status_code == 200 and changed.json()["max_running"] == 1
    assert changed.json()["resources"] == {"gpus": 1} and changed.json()["secret"] == "set"  # kept when not given
    uncapped = admin.patch(f"/api/v1/admin/clusters/{out['id']}", json={"no_cap": True, "clear_secret": True})
    assert uncapped.json()["max_running"] is None and uncapped.json()["secret"] == "not set"
    assert lead.delete(f"/api/v1/admin/clusters/{out['id']}").status_code == 403
    assert admin.delete(f"/api/v1/admin/clusters/{out['id']}").status_code == 204
    assert admin.get("/api/v1/admin/clusters").json() == []
    db.rollback()
    actions = [e.action for e in db.scalars(select(AuditEvent).where(AuditEvent.object_type == "cluster"))]
    assert actions == ["cluster.create", "cluster.update", "cluster.update", "cluster.delete"]


def test_bad_clusters_are_refused_naming_the_field(db, app, make_user, api, token_for) -> None:
    admin, _ = _admin_and_lead(db, make_user, api, token_for)
    for body, field in ((_body(name="local"), "name"), (_body(name="9 lives"), "name"),
                        (_body(address=None), "address"), (_body(kind="slurm"), "address"),
                        (_body(shared_dir="relative/path"), "shared_dir"),
                        (_body(resources={"gpus": -1}), "resources.gpus"),
                        (_body(resources={"address": "http://elsewhere:8265"}), "resources.address"),
                        (_body(login="preflab@login.hpc"), "login"),  # a login node is Slurm's
                        (_body(kind="slurm", address=None, login="-oProxyCommand=sh@x"), "login"),
                        (_body(kind="slurm", address=None, login="login.hpc"), "login")):
        r = admin.post("/api/v1/admin/clusters", json=body)
        assert r.status_code == 422, (body, r.text)
        assert field in r.text, (field, r.text)
    assert admin.post("/api/v1/admin/clusters", json=_body()).status_code == 201
    again = admin.post("/api/v1/admin/clusters", json=_body())
    assert again.status_code == 409 and "already exists" in again.text


def test_the_secret_is_stored_encrypted_and_never_shown_back(db, app, make_user, api, token_for, browser) -> None:
    admin_user = make_user(db, "admin")
    admin, email = api(token_for(db, admin_user)), admin_user.email
    db.commit()
    created = admin.post("/api/v1/admin/clusters", json=_body())
    assert SECRET not in created.text
    stored = db.scalar(select(ComputeCluster.secret_stored))
    assert stored is not None and stored.startswith("fernet:") and SECRET not in stored
    assert app.state.keyring.decrypt(stored) == SECRET
    db.rollback()  # SQLite: the test's read must not hold the database while the app writes
    assert SECRET not in admin.get("/api/v1/admin/clusters").text
    page = browser()
    page.login(email)
    shown = page.get("/admin/clusters")
    assert shown.status_code == 200 and SECRET not in shown.text and "secret set" in shown.text
    # A refused form is shown again with what was typed, the secret left out.
    refused = page.post("/admin/clusters", {"name": "lab", "kind": "ray", "address": "http://127.0.0.1:9",
                                            "shared_dir": "/shared", "secret": SECRET})
    assert refused.status_code == 409 and SECRET not in refused.text and "already exists" in refused.text
    audit = db.scalars(select(AuditEvent.data).where(AuditEvent.object_type == "cluster")).all()
    assert audit and all(SECRET not in str(data) for data in audit)


def test_the_admin_page_adds_a_cluster_with_its_csrf_token_only(db, app, make_user, browser) -> None:
    admin_user, lead_user = make_user(db, "admin"), make_user(db, "lead")
    emails = admin_user.email, lead_user.email
    db.commit()
    page = browser()
    page.login(emails[0])
    form = {"name": "hpc", "kind": "slurm", "partition": "gpu", "shared_dir": "/shared/preflab",
            "resources": "gpus=1, time_limit_min=240", "max_running": "3"}
    assert page.post("/admin/clusters", form, csrf=False).status_code == 403
    added = page.post("/admin/clusters", form)
    assert added.status_code == 303, added.text
    shown = page.get("/admin/clusters").text
    assert "hpc" in shown and "gpus=1, time_limit_min=240" in shown and "0 running of at most 3" in shown
    row = db.scalar(select(ComputeCluster).where(ComputeCluster.name == "hpc"))
    assert row is not None and row.partition == "gpu" and row.resources == {"gpus": 1, "time_limit_min": 240}
    db.rollback()
    as_lead = browser()
    as_lead.login(emails[1])
    assert "/admin/clusters" not in as_lead.get("/projects").text
    assert as_lead.get("/admin/clusters").status_code == 403


def test_the_files_clusters_are_listed_read_only_and_their_names_cannot_be_taken(db, app, make_user, api, token_for,
                                                                                  monkeypatch, tmp_path) -> None:
    use_clusters(app, monkeypatch, tmp_path / "clusters.toml",
                 {"hpc": {"kind": "slurm", "shared_dir": "/shared", "max_running": 2,
                          "resources": {"partition": "gpu"}}})
    admin, _ = _admin_and_lead(db, make_user, api, token_for)
    [item] = admin.get("/api/v1/admin/clusters").json()
    assert item["name"] == "hpc" and item["source"] == "file" and item["id"] is None and item["max_running"] == 2
    taken = admin.post("/api/v1/admin/clusters", json=_body(name="hpc"))
    assert taken.status_code == 409 and "PREFLAB_CLUSTERS_FILE" in taken.text


def test_a_projects_runs_go_to_its_default_cluster_when_they_name_none(db, app, make_user, make_project, api,
                                                                       token_for, models_dir, tmp_path) -> None:  # noqa: F811
    project_id, eng = _ranked_project(db, make_user, make_project, api, token_for, n=4)
    lead_user = make_user(db, "lead")
    admin_user = make_user(db, "admin")
    from app.models import Project
    from app.projects import projects

    project = db.get(Project, project_id)
    projects.add_member(db, project, admin_user, email=lead_user.email, role="lead")
    lead, admin = api(token_for(db, lead_user)), api(token_for(db, admin_user))
    db.commit()
    shared = str(tmp_path)
    assert admin.post("/api/v1/admin/clusters", json=_body(shared_dir=shared)).status_code == 201
    assert eng.put(f"/api/projects/{project_id}/default-cluster", json={"default_cluster": "lab"}).status_code == 403
    unknown = lead.put(f"/api/projects/{project_id}/default-cluster", json={"default_cluster": "nowhere"})
    assert unknown.status_code == 422 and "default_cluster" in unknown.text
    chosen = lead.put(f"/api/projects/{project_id}/default-cluster", json={"default_cluster": "lab"})
    assert chosen.status_code == 200 and chosen.json() == {"default_cluster": "lab"}
    pairs = _export(eng, app, project_id, "pairs")
    body = {"kind": "reward", "export_id": pairs, "base_model": str(models_dir["reward"]), "config": {"steps": 2}}
    run = eng.post(f"/api/projects/{project_id}/training-runs", json=body).json()
    assert eng.get(f"/api/training-runs/{run['run_id']}").json()["config"]["where"]["cluster"] == "lab"
    local = eng.post(f"/api/projects/{project_id}/training-runs", json=body | {"where": "local"}).json()
    assert "where" not in eng.get(f"/api/training-runs/{local['run_id']}").json()["config"]
    # The training form preselects the default.
    page = eng.get(f"/projects/{project_id}/training").text
    assert '<option value="lab" selected>' in page


def test_a_full_cluster_says_what_a_run_waits_for_and_a_free_slot_lets_it_go(db, make_project) -> None:
    from app.models import TrainingRun
    from app.runs import cluster_config
    from app.runs.backends.base import Cluster

    project = make_project(db)
    lab = {"where": {"cluster": "lab", "kind": "ray", "resources": {}}}
    going, other, waiting = (TrainingRun(project_id=project.id, kind="reward", state=state, config=config)
                             for state, config in (("running", lab), ("running", {}), ("queued", lab)))
    db.add_all([going, other, waiting])
    db.flush()
    capped = Cluster("lab", "ray", max_running=1)
    assert cluster_config.slot_wait(db, capped, waiting.id) == "waiting for a slot on lab (1 of 1 running)"
    assert cluster_config.slot_wait(db, capped, going.id) is None  # a run never waits for its own slot
    assert cluster_config.slot_wait(db, Cluster("lab", "ray", max_running=2), waiting.id) is None
    assert cluster_config.slot_wait(db, Cluster("lab", "ray"), waiting.id) is None  # no cap
    going.state = "succeeded"
    db.flush()
    assert cluster_config.slot_wait(db, capped, waiting.id) is None
    db.rollback()


def test_a_secret_no_key_opens_is_shown_unreadable_and_the_test_says_so(db, app, make_user, api, token_for) -> None:
    from cryptography.fernet import Fernet

    from app.platform.crypto import Keyring
    from app.platform.settings import Settings

    admin, _ = _admin_and_lead(db, make_user, api, token_for)
    created = admin.post("/api/v1/admin/clusters", json=_body()).json()
    lost = Keyring(Settings(encryption_key=Fernet.generate_key().decode())).encrypt(SECRET)
    db.get(ComputeCluster, created["id"]).secret_stored = lost
    db.commit()
    assert admin.get("/api/v1/admin/clusters").json()[0]["secret"] == "unreadable"
    tested = admin.post("/api/v1/admin/clusters/lab/test")
    assert tested.status_code == 422 and "cannot be read" in tested.text and "secret" in tested.text
    renewed = admin.patch(f"/api/v1/admin/clusters/{created['id']}", json={"secret": "a new token"})
    assert renewed.json()["secret"] == "set"
