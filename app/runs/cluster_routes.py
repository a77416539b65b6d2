"""Clusters (admins only): the JSON API under /api/admin/clusters and the admin page, each with a connection test
that submits a trivial job. Clusters of PREFLAB_CLUSTERS_FILE are listed and tested, never edited here."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Form, Request
from fastapi.responses import RedirectResponse, Response

from app.platform.crypto import Keyring
from app.runs import cluster_config
from app.runs.backends.base import Resources
from app.schemas import ClusterIn, ClusterOut, ClusterPatch, ClusterTestOut
from app.web.deps import ClusterAdmin, ClusterAdminPage, Id, KeyringDep, SessionDep
from app.web.form_pages import FormPage
from app.web.forms import ClusterForm, ClusterUpdateForm
from app.web.rendering import render

router = APIRouter()
NAME_PATH = r"[A-Za-z][A-Za-z0-9_-]{0,39}"


def _out(item: cluster_config.Listed, keyring: Keyring, running: dict[str, int]) -> ClusterOut:
    c = item.cluster
    return ClusterOut(id=item.row.id if item.row else None, name=c.name, kind=c.kind, source=c.source,
                      address=c.resources.address, partition=c.resources.partition, login=c.login,
                      shared_dir=str(c.shared_dir) if c.shared_dir else None,
                      resources=_given(c.resources),
                      env_names=sorted(c.env), job_prefix=c.job_prefix, max_running=c.max_running,
                      running=running.get(c.name, 0), secret=cluster_config.secret_status(item.row, keyring))


def _given(resources: Resources) -> dict[str, Any]:
    """The default resources a cluster sets (those that differ from a run's own defaults), address and partition
    aside (fields of their own)."""
    unset = Resources()
    return {k: v for k, v in resources.as_dict().items()
            if k not in ("address", "partition") and v != getattr(unset, k)}


def _fields(body: ClusterIn | ClusterPatch) -> cluster_config.Fields:
    return cluster_config.Fields(**body.model_dump(exclude_unset=isinstance(body, ClusterPatch)))


def _one(request: Request, db, keyring: Keyring, name: str) -> ClusterOut:
    settings = request.app.state.settings
    item = next(i for i in cluster_config.listed(db, settings.clusters_file) if i.cluster.name == name)
    return _out(item, keyring, cluster_config.running_counts(db))


@router.get("/api/admin/clusters", tags=["clusters"],
            summary="The clusters runs may be sent to, the app's and PREFLAB_CLUSTERS_FILE's (admin; secrets never)")
def list_clusters(request: Request, db: SessionDep, admin: ClusterAdmin, keyring: KeyringDep) -> list[ClusterOut]:
    items = cluster_config.listed(db, request.app.state.settings.clusters_file)
    running = cluster_config.running_counts(db)
    return [_out(item, keyring, running) for item in items]


@router.post("/api/admin/clusters", status_code=201, tags=["clusters"], summary="Add a Slurm or Ray cluster (admin)")
def create_cluster(request: Request, body: ClusterIn, db: SessionDep, admin: ClusterAdmin,
                   keyring: KeyringDep) -> ClusterOut:
    row = cluster_config.create(db, admin, keyring, _fields(body),
                                clusters_file=request.app.state.settings.clusters_file)
    return _one(request, db, keyring, row.name)


@router.patch("/api/admin/clusters/{cluster_id}", tags=["clusters"], summary="Change a cluster (admin)")
def update_cluster(request: Request, cluster_id: Id, body: ClusterPatch, db: SessionDep, admin: ClusterAdmin,
                   keyring: KeyringDep) -> ClusterOut:
    row = cluster_config.update(db, admin, keyring, cluster_config.get(db, cluster_id), _fields(body),
                                clusters_file=request.app.state.settings.clusters_file)
    return _one(request, db, keyring, row.name)


@router.delete("/api/admin/clusters/{cluster_id}", status_code=204, tags=["clusters"],
               summary="Remove a cluster (admin)")
def delete_cluster(cluster_id: Id, db: SessionDep, admin: ClusterAdmin) -> Response:
    cluster_config.delete(db, admin, cluster_config.get(db, cluster_id))
    return Response(status_code=204)


@router.post("/api/admin/clusters/{cluster_name}/test", tags=["clusters"],
             summary="Test a cluster's connection: submit a trivial job and wait for it (admin)")
def test_cluster(request: Request, cluster_name: str, db: SessionDep, admin: ClusterAdmin,
                 keyring: KeyringDep) -> ClusterTestOut:
    probe = cluster_config.run_connection_test(db, admin, keyring, request.app.state.settings.clusters_file,
                                               cluster_name)
    return ClusterTestOut(ok=probe.ok, seconds=round(probe.seconds, 2), detail=probe.detail)


# --- the admin page ------------------------------------------------------------------------------------------------


def _page(request: Request, keyring: Keyring) -> FormPage:
    clusters_file = request.app.state.settings.clusters_file

    def context(db: SessionDep) -> dict:
        items = cluster_config.listed(db, clusters_file)
        running = cluster_config.running_counts(db)
        return {"clusters": [_out(item, keyring, running) for item in items], "form": {},
                "from_file": cluster_config.FROM_FILE, "tested": None}

    return FormPage("admin_clusters.html", context, redirect="/admin/clusters")


@router.get("/admin/clusters", include_in_schema=False)
def clusters_page(request: Request, db: SessionDep, admin: ClusterAdminPage, keyring: KeyringDep) -> Response:
    return _page(request, keyring).show(request, db)


@router.post("/admin/clusters", include_in_schema=False)
def create_from_page(request: Request, db: SessionDep, admin: ClusterAdminPage, keyring: KeyringDep,
                     form: Annotated[ClusterForm, Form()]) -> Response:
    clusters_file = request.app.state.settings.clusters_file
    return _page(request, keyring).submit(  # the secret is not echoed back (ClusterForm.SECRET)
        request, db, form, lambda body: cluster_config.create(db, admin, keyring, _fields(body),
                                                              clusters_file=clusters_file))


@router.post("/admin/clusters/{cluster_id}", include_in_schema=False)
def update_from_page(request: Request, cluster_id: Id, db: SessionDep, admin: ClusterAdminPage, keyring: KeyringDep,
                     form: Annotated[ClusterUpdateForm, Form()]) -> Response:
    clusters_file = request.app.state.settings.clusters_file
    row = cluster_config.get(db, cluster_id)
    return _page(request, keyring).submit(
        request, db, form, lambda body: cluster_config.update(db, admin, keyring, row, _fields(body),
                                                              clusters_file=clusters_file))


@router.post("/admin/clusters/{cluster_id}/delete", include_in_schema=False)
def delete_from_page(cluster_id: Id, db: SessionDep, admin: ClusterAdminPage) -> Response:
    cluster_config.delete(db, admin, cluster_config.get(db, cluster_id))
    return RedirectResponse("/admin/clusters", status_code=303)


@router.post("/admin/clusters/{cluster_name}/test", include_in_schema=False)
def test_from_page(request: Request, cluster_name: str, db: SessionDep, admin: ClusterAdminPage,
                   keyring: KeyringDep) -> Response:
    probe = cluster_config.run_connection_test(db, admin, keyring, request.app.state.settings.clusters_file,
                                               cluster_name)
    page = _page(request, keyring)
    tested = {"name": cluster_name, "ok": probe.ok, "seconds": round(probe.seconds, 2), "detail": probe.detail}
    return render(request, page.template, page.context(db) | {"tested": tested})
