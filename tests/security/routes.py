"""Every route the app serves, found by walking its router (included routers too), with an access policy each.

A route the policy table does not know fails the suite: new routes get a policy (and so a test) the day they land.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from tests.security.world import IDENTITIES, PASSWORD, World

UNSAFE = {"POST", "PUT", "PATCH", "DELETE"}


@dataclass(frozen=True)
class RouteInfo:
    method: str
    path: str
    endpoint: Any


def all_routes(app: Any) -> list[RouteInfo]:
    """(method, path) of every HTTP route, HEAD/OPTIONS aside, walking included routers of any FastAPI version."""

    def walk(routes: list[Any]) -> Iterator[RouteInfo]:
        for route in routes:
            contexts = getattr(route, "effective_route_contexts", None)
            if contexts is not None:  # FastAPI ≥ 0.16x keeps included routers as objects
                for ctx in (contexts() if callable(contexts) else contexts):
                    for method in ctx.methods or ():
                        yield RouteInfo(method, ctx.path, ctx.endpoint)
                continue
            if hasattr(route, "original_router"):
                yield from walk(route.original_router.routes)
                continue
            methods = getattr(route, "methods", None)
            if methods and hasattr(route, "path"):
                for method in methods:
                    yield RouteInfo(method, route.path, getattr(route, "endpoint", None))

    seen = {(r.method, r.path): r for r in walk(list(app.routes)) if r.method not in ("HEAD", "OPTIONS")}
    return [seen[k] for k in sorted(seen)]


ALL = frozenset(IDENTITIES)
AUTHED = ALL - {"anon"}
MEMBERS = frozenset({"admin", "lead", "annotator", "engineer"})
MANAGE = frozenset({"admin", "lead"})
LEAD_ENG = frozenset({"admin", "lead", "engineer"})
ANNOTATE = frozenset({"admin", "lead", "annotator"})
ADMIN = frozenset({"admin"})
CREATORS = frozenset({"admin", "lead", "outsider"})  # global role admin or lead (outsider is a lead elsewhere)
TOKEN_OWNER = frozenset({"lead"})  # the revoked token is the lead's own


def _tiers(w: World) -> list[list[int]]:
    return [[c] for c in w.a.completion_ids]


def _file(name: str = "p.jsonl") -> dict[str, Any]:
    return {"files": {"file": (name, b'{"prompt": "x", "completions": ["a", "b", "c", "d"]}\n', "application/json")}}


@dataclass(frozen=True)
class Policy:
    allowed: frozenset[str]
    request: Callable[[World], dict[str, Any]] = field(default=lambda w: {})
    """Keyword arguments for the TestClient call (json=, data=, files=, params=): a body valid enough that only
    access rules can refuse it, so a 404 or 403 means "refused", never "malformed"."""
    params: Callable[[World], dict[str, Any]] = field(default=lambda w: {})
    """Path values that differ from the defaults in `a_params` (e.g. a running run for cancel)."""
    object_scoped: bool = True
    """Whether the route's ids name objects of one project (check 5 uses B's ids on it)."""


def _gen() -> dict[str, Any]:
    return {"backend": "hf", "model": "/nonexistent/model"}


def _endpoint(form: bool = False) -> dict[str, Any]:
    """A valid model endpoint body; an IP literal, so no name is resolved."""
    body: dict[str, Any] = {"name": "Another vLLM", "base_url": "http://10.1.2.3:8000/v1", "model": "m"}
    return body | ({"allow_private": "on"} if form else {"allow_private": True})


def _cluster(form: bool = False) -> dict[str, Any]:
    """A valid cluster body (another name than the world's own)."""
    body: dict[str, Any] = {"name": "another", "kind": "ray", "address": "http://127.0.0.1:9",
                            "shared_dir": "/shared/preflab"}
    return body | ({"max_running": "2"} if form else {"max_running": 2})


POLICY: dict[tuple[str, str], Policy] = {
    ("GET", "/openapi.json"): Policy(ALL, object_scoped=False),
    ("GET", "/docs"): Policy(ALL, object_scoped=False),
    ("GET", "/healthz"): Policy(ALL, object_scoped=False),
    ("GET", "/healthz/live"): Policy(ALL, object_scoped=False),
    ("GET", "/healthz/ready"): Policy(ALL, object_scoped=False),  # the world's reseed records a worker heartbeat
    # TestClient's address is in no allowed network, so only an admin may scrape.
    ("GET", "/metrics"): Policy(ADMIN, object_scoped=False),
    ("GET", "/"): Policy(ALL, object_scoped=False),  # a redirect to /projects or /login
    ("GET", "/login"): Policy(ALL, object_scoped=False),
    # Anonymous form posts need the page's CSRF token, which these Bearer-token calls do not carry.
    ("POST", "/login"): Policy(AUTHED, lambda w: {"data": {"email": w.emails["victim"], "password": PASSWORD}},
                               object_scoped=False),
    ("POST", "/logout"): Policy(AUTHED, object_scoped=False),
    ("GET", "/account"): Policy(AUTHED, object_scoped=False),
    ("POST", "/account/password"): Policy(
        AUTHED, lambda w: {"data": {"current_password": "wrong-password-xx", "new_password": "another long one"}},
        object_scoped=False),
    ("POST", "/account/tokens"): Policy(AUTHED, lambda w: {"data": {"name": "t"}}, object_scoped=False),
    ("POST", "/account/tokens/{token_id}/revoke"): Policy(TOKEN_OWNER),
    ("GET", "/api/me"): Policy(AUTHED, object_scoped=False),
    ("GET", "/api/users"): Policy(ADMIN, object_scoped=False),
    ("POST", "/api/users"): Policy(ADMIN, lambda w: {"json": {"email": "new@example.org", "password": PASSWORD,
                                                              "role": "annotator"}}, object_scoped=False),
    ("GET", "/api/users/{user_id}"): Policy(ADMIN, object_scoped=False),
    ("PATCH", "/api/users/{user_id}"): Policy(ADMIN, lambda w: {"json": {"name": "Renamed"}}, object_scoped=False),
    ("GET", "/admin/users"): Policy(ADMIN, object_scoped=False),
    ("POST", "/admin/users"): Policy(ADMIN, lambda w: {"data": {"email": "new@example.org", "password": PASSWORD,
                                                                "role": "annotator"}}, object_scoped=False),
    ("POST", "/admin/users/{user_id}"): Policy(ADMIN, lambda w: {"data": {"role": "engineer", "active": "on"}},
                                               object_scoped=False),
    # model endpoints: global objects; everyone signed in may list (names only), admins manage them
    ("GET", "/api/model-endpoints"): Policy(AUTHED, object_scoped=False),
    ("POST", "/api/model-endpoints"): Policy(ADMIN, lambda w: {"json": _endpoint()}, object_scoped=False),
    ("PATCH", "/api/model-endpoints/{endpoint_id}"): Policy(ADMIN, lambda w: {"json": {"name": "Renamed"}},
                                                            object_scoped=False),
    ("DELETE", "/api/model-endpoints/{endpoint_id}"): Policy(ADMIN, object_scoped=False),
    ("GET", "/admin/endpoints"): Policy(ADMIN, object_scoped=False),
    ("POST", "/admin/endpoints"): Policy(ADMIN, lambda w: {"data": _endpoint(form=True)}, object_scoped=False),
    ("POST", "/admin/endpoints/{endpoint_id}"): Policy(ADMIN, lambda w: {"data": _endpoint(form=True)},
                                                       object_scoped=False),
    ("POST", "/admin/endpoints/{endpoint_id}/delete"): Policy(ADMIN, object_scoped=False),
    # clusters: global objects, admins only; the connection test of the world's Ray cluster (a closed port) fails
    # fast with the client's own words
    ("GET", "/api/admin/clusters"): Policy(ADMIN, object_scoped=False),
    ("POST", "/api/admin/clusters"): Policy(ADMIN, lambda w: {"json": _cluster()}, object_scoped=False),
    ("PATCH", "/api/admin/clusters/{cluster_id}"): Policy(ADMIN, lambda w: {"json": {"max_running": 3}},
                                                         object_scoped=False),
    ("DELETE", "/api/admin/clusters/{cluster_id}"): Policy(ADMIN, object_scoped=False),
    ("POST", "/api/admin/clusters/{cluster_name}/test"): Policy(ADMIN, object_scoped=False),
    ("GET", "/admin/clusters"): Policy(ADMIN, object_scoped=False),
    ("POST", "/admin/clusters"): Policy(ADMIN, lambda w: {"data": _cluster(form=True)}, object_scoped=False),
    ("POST", "/admin/clusters/{cluster_id}"): Policy(ADMIN, lambda w: {"data": _cluster(form=True) | {"name": "world"}},
                                                     object_scoped=False),
    ("POST", "/admin/clusters/{cluster_id}/delete"): Policy(ADMIN, object_scoped=False),
    ("POST", "/admin/clusters/{cluster_name}/test"): Policy(ADMIN, object_scoped=False),
    ("PUT", "/api/projects/{project_id}/default-cluster"): Policy(MANAGE, lambda w: {"json": {"default_cluster": "world"}}),
    ("POST", "/projects/{project_id}/training/default-cluster"): Policy(
        MANAGE, lambda w: {"data": {"default_cluster": "world"}}),
    # projects
    ("GET", "/api/projects"): Policy(AUTHED, object_scoped=False),
    ("POST", "/api/projects"): Policy(CREATORS, lambda w: {"json": {"name": "New", "completions_per_prompt": 2,
                                                                   "rubric": {"text": "Rank."}}},
                                      object_scoped=False),
    ("GET", "/api/projects/{project_id}"): Policy(MEMBERS),
    ("GET", "/api/projects/{project_id}/rubrics"): Policy(MEMBERS),
    ("POST", "/api/projects/{project_id}/rubrics"): Policy(MANAGE, lambda w: {"json": {"text": "v2",
                                                                                       "base_version": 1}}),
    ("GET", "/api/projects/{project_id}/rubrics/{version}"): Policy(MEMBERS),
    ("GET", "/api/projects/{project_id}/members"): Policy(MEMBERS),
    ("POST", "/api/projects/{project_id}/members"): Policy(MANAGE, lambda w: {"json": {"email": w.emails["victim"],
                                                                                       "role": "engineer"}}),
    ("POST", "/api/projects/{project_id}/imports"): Policy(LEAD_ENG, lambda w: _file()),
    ("GET", "/api/projects/{project_id}/selection"): Policy(MEMBERS),
    ("PUT", "/api/projects/{project_id}/selection"): Policy(MANAGE, lambda w: {"json": {"selection": "disagreement"}}),
    ("POST", "/api/projects/{project_id}/priority-jobs"): Policy(MANAGE, lambda w: {"json": {}}),
    ("POST", "/projects/{project_id}/selection"): Policy(MANAGE, lambda w: {"data": {"selection": "disagreement"}}),
    ("POST", "/projects/{project_id}/priorities"): Policy(MANAGE, lambda w: {"data": {}}),
    ("GET", "/projects"): Policy(AUTHED, object_scoped=False),
    ("POST", "/projects"): Policy(CREATORS, lambda w: {"data": {"name": "Page project", "rubric": "Rank."}},
                                  object_scoped=False),
    ("GET", "/projects/{project_id}"): Policy(MEMBERS),
    ("POST", "/projects/{project_id}/members"): Policy(MANAGE, lambda w: {"data": {"email": w.emails["victim"],
                                                                                   "role": "engineer"}}),
    ("POST", "/projects/{project_id}/members/{user_id}/remove"): Policy(MANAGE),
    ("GET", "/projects/{project_id}/rubric"): Policy(MANAGE),
    ("POST", "/projects/{project_id}/rubric/preview"): Policy(MEMBERS, lambda w: {"data": {"text": "*hi*"}}),
    ("POST", "/projects/{project_id}/rubric"): Policy(MANAGE, lambda w: {"data": {"text": "v2", "base_version": 1}}),
    ("GET", "/projects/{project_id}/rubric/history"): Policy(MEMBERS),
    ("GET", "/projects/{project_id}/import"): Policy(LEAD_ENG),
    ("POST", "/projects/{project_id}/import"): Policy(LEAD_ENG, lambda w: _file()),
    # annotation
    ("GET", "/api/projects/{project_id}/tasks/next"): Policy(ANNOTATE),
    ("POST", "/api/projects/{project_id}/rankings"): Policy(
        ANNOTATE, lambda w: {"json": {"prompt_id": w.a.prompt_id, "tiers": _tiers(w), "rubric_version": 1,
                                      "submission_id": "matrix"}}),
    ("GET", "/projects/{project_id}/annotate"): Policy(ANNOTATE),
    ("POST", "/projects/{project_id}/annotate"): Policy(ANNOTATE, lambda w: {"data": {"x": "1"}}),
    # a task's draft: its own annotator's alone (not even an admin or the project's lead)
    ("GET", "/api/assignments/{assignment_id}/draft"): Policy(frozenset({"annotator"})),
    ("PUT", "/api/assignments/{assignment_id}/draft"): Policy(
        frozenset({"annotator"}), lambda w: {"json": {"tiers": [[w.a.completion_ids[0]]]}}),
    # agreement and gold
    ("GET", "/api/projects/{project_id}/agreement"): Policy(LEAD_ENG),
    ("GET", "/api/projects/{project_id}/agreement/steps"): Policy(LEAD_ENG),
    ("PUT", "/api/projects/{project_id}/prompts/{prompt_id}/gold"): Policy(MANAGE, lambda w: {"json": {"tiers": _tiers(w)}}),
    ("DELETE", "/api/projects/{project_id}/prompts/{prompt_id}/gold"): Policy(MANAGE),
    ("GET", "/projects/{project_id}/agreement"): Policy(LEAD_ENG),
    ("POST", "/projects/{project_id}/agreement/gold-from-metadata"): Policy(MANAGE),
    ("GET", "/projects/{project_id}/agreement/prompts"): Policy(LEAD_ENG),
    ("GET", "/projects/{project_id}/agreement/annotators/{user_id}"): Policy(LEAD_ENG),
    ("DELETE", "/api/projects/{project_id}/annotators/{user_id}/rankings"): Policy(MANAGE),
    # jobs
    ("POST", "/api/projects/{project_id}/sampling-jobs"): Policy(LEAD_ENG, lambda w: {"json": {"generator": _gen()}}),
    ("GET", "/api/projects/{project_id}/jobs"): Policy(MEMBERS),
    ("GET", "/api/jobs/{job_id}"): Policy(MEMBERS),
    ("POST", "/api/jobs/{job_id}/cancel"): Policy(LEAD_ENG),
    ("GET", "/projects/{project_id}/jobs"): Policy(MEMBERS),
    ("POST", "/projects/{project_id}/jobs/sample"): Policy(LEAD_ENG, lambda w: {"data": {"model": "/nonexistent"}}),
    ("GET", "/jobs/{job_id}"): Policy(MEMBERS),
    ("POST", "/jobs/{job_id}/cancel"): Policy(LEAD_ENG),
    # constitutions
    ("POST", "/api/projects/{project_id}/constitutions"): Policy(
        MANAGE, lambda w: {"json": {"principles": [{"name": "n", "comparison": "Which is better?"}],
                                    "base_version": 1}}),
    ("GET", "/api/projects/{project_id}/constitutions"): Policy(MEMBERS),
    ("GET", "/api/projects/{project_id}/constitutions/{version}"): Policy(MEMBERS),
    ("GET", "/projects/{project_id}/constitution"): Policy(MANAGE),
    ("POST", "/projects/{project_id}/constitution"): Policy(
        MANAGE, lambda w: {"data": {"base_version": "1", "p-0-name": "n", "p-0-comparison": "Which?"}}),
    ("GET", "/projects/{project_id}/constitution/history"): Policy(MEMBERS),
    # judge
    ("POST", "/api/projects/{project_id}/judge-runs"): Policy(LEAD_ENG, lambda w: {"json": {"generator": _gen()}}),
    ("GET", "/api/projects/{project_id}/judge-agreement"): Policy(MEMBERS),
    ("PUT", "/api/projects/{project_id}/ai-labels"): Policy(MANAGE, lambda w: {"json": {"enabled": True}}),
    ("GET", "/api/projects/{project_id}/judge-agreement/steps"): Policy(MEMBERS),
    ("PUT", "/api/projects/{project_id}/ai-step-labels"): Policy(MANAGE, lambda w: {"json": {"enabled": True}}),
    ("POST", "/api/projects/{project_id}/mc-step-labels"): Policy(LEAD_ENG, lambda w: {"json": {
        "model": "/nonexistent/model"}}),
    ("POST", "/projects/{project_id}/judge/mc-step-labels"): Policy(LEAD_ENG, lambda w: {"data": {
        "model": "/nonexistent/model"}}),
    # step labels (process supervision)
    ("PUT", "/api/projects/{project_id}/step-options"): Policy(MANAGE, lambda w: {"json": {"enabled": True}}),
    ("POST", "/projects/{project_id}/step-options"): Policy(MANAGE, lambda w: {"data": {"enabled": "yes"}}),
    ("GET", "/projects/{project_id}/judge"): Policy(MEMBERS),
    ("GET", "/projects/{project_id}/judge/runs"): Policy(MEMBERS),
    ("POST", "/projects/{project_id}/judge/runs"): Policy(LEAD_ENG, lambda w: {"data": {"model": "/nonexistent"}}),
    ("POST", "/projects/{project_id}/judge/ai-labels"): Policy(MANAGE, lambda w: {"data": {"enabled": "yes"}}),
    ("POST", "/projects/{project_id}/judge/ai-step-labels"): Policy(MANAGE, lambda w: {"data": {"enabled": "yes"}}),
    ("POST", "/api/projects/{project_id}/revision-jobs"): Policy(LEAD_ENG, lambda w: {"json": {"generator": _gen()}}),
    ("GET", "/api/projects/{project_id}/revisions"): Policy(MEMBERS),
    ("POST", "/api/projects/{project_id}/revisions/{revision_id}/decision"): Policy(
        MANAGE, lambda w: {"json": {"accept": True}}),
    ("GET", "/projects/{project_id}/revisions"): Policy(MEMBERS),
    ("POST", "/projects/{project_id}/revisions/start"): Policy(LEAD_ENG, lambda w: {"data": {"model": "/nonexistent"}}),
    ("POST", "/projects/{project_id}/revisions/{revision_id}/decision"): Policy(MANAGE, lambda w: {"data": {"accept": "yes"}}),
    # exports
    ("POST", "/api/projects/{project_id}/exports"): Policy(LEAD_ENG, lambda w: {"json": {"format": "jsonl"}}),
    ("GET", "/api/projects/{project_id}/exports"): Policy(MEMBERS),
    ("GET", "/api/exports/{export_id}"): Policy(MEMBERS),
    ("GET", "/api/exports/{export_id}/files/{name}"): Policy(MEMBERS),
    ("DELETE", "/api/exports/{export_id}"): Policy(MANAGE),
    ("GET", "/projects/{project_id}/exports"): Policy(MEMBERS),
    ("POST", "/projects/{project_id}/exports"): Policy(LEAD_ENG),
    ("POST", "/exports/{export_id}/delete"): Policy(MANAGE),
    # training
    ("POST", "/api/projects/{project_id}/training-runs"): Policy(
        LEAD_ENG, lambda w: {"json": {"kind": "reward", "export_id": w.a.export_id}}),
    ("GET", "/api/projects/{project_id}/training-runs"): Policy(MEMBERS),
    ("GET", "/api/training-runs/{run_id}"): Policy(MEMBERS),
    ("GET", "/api/training-runs/{run_id}/metrics"): Policy(MEMBERS),
    ("POST", "/api/training-runs/{run_id}/cancel"): Policy(LEAD_ENG, params=lambda w: {"run_id": w.a.running_run_id}),
    ("POST", "/api/training-runs/{run_id}/sample-into-project"): Policy(LEAD_ENG, lambda w: {"json": {}}),
    ("POST", "/api/training-runs/{run_id}/human-check"): Policy(LEAD_ENG),
    ("POST", "/api/training-runs/{run_id}/iterate"): Policy(LEAD_ENG, lambda w: {"json": {}}),
    ("GET", "/projects/{project_id}/training"): Policy(MEMBERS),
    ("GET", "/projects/{project_id}/training/estimate"): Policy(MEMBERS),
    ("POST", "/projects/{project_id}/training"): Policy(LEAD_ENG, lambda w: {"data": {"export_id": str(w.a.export_id)}}),
    ("GET", "/training-runs/{run_id}"): Policy(MEMBERS),
    ("POST", "/training-runs/{run_id}/cancel"): Policy(LEAD_ENG, params=lambda w: {"run_id": w.a.running_run_id}),
    ("POST", "/training-runs/{run_id}/sample"): Policy(LEAD_ENG),
    ("POST", "/training-runs/{run_id}/iterate"): Policy(LEAD_ENG),
    ("GET", "/projects/{project_id}/training/compare"): Policy(
        MEMBERS, lambda w: {"params": {"a": w.a.run_id, "b": w.a.running_run_id}}),
    # webhooks: a project's lead manages them (an IP literal, so no name is resolved)
    ("POST", "/api/projects/{project_id}/webhooks"): Policy(
        MANAGE, lambda w: {"json": {"url": "https://93.184.216.34/hook", "events": ["export.ready"]}}),
    ("GET", "/api/projects/{project_id}/webhooks"): Policy(MANAGE),
    ("DELETE", "/api/projects/{project_id}/webhooks/{webhook_id}"): Policy(MANAGE),
    ("GET", "/api/projects/{project_id}/webhooks/{webhook_id}/deliveries"): Policy(MANAGE),
    ("GET", "/projects/{project_id}/webhooks"): Policy(MANAGE),
    ("POST", "/projects/{project_id}/webhooks"): Policy(
        MANAGE, lambda w: {"data": {"url": "https://93.184.216.34/hook", "events": "export.ready"}}),
    ("POST", "/projects/{project_id}/webhooks/{webhook_id}/delete"): Policy(MANAGE),
}


def fill(path: str, params: dict[str, Any]) -> str:
    for key, value in params.items():
        path = path.replace("{" + key + "}", str(value)).replace("{" + key + ":path}", str(value))
    assert "{" not in path, f"no value for a path parameter in {path}"
    return path


def policy_key(route: RouteInfo) -> tuple[str, str]:
    return route.method, route.path.replace(":path}", "}")


def a_params(w: World) -> dict[str, Any]:
    return w.a.params() | {"user_id": w.user_ids["victim"], "token_id": w.lead_token_id, "endpoint_id": w.endpoint_id,
                                 "cluster_id": w.cluster_id, "cluster_name": "world"}


def outcome(response: Any) -> str:
    """"refused" (401/403/404 or a redirect to log in), "error" (5xx) or "ok" (anything else)."""
    location = response.headers.get("location", "")
    if response.status_code in (401, 403, 404) or (response.status_code in (302, 303, 307)
                                                   and location.startswith("/login?next=")):
        return "refused"
    if response.headers.get("hx-redirect", "").startswith("/login"):
        return "refused"
    return "error" if response.status_code >= 500 else "ok"
