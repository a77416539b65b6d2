"""The whole table in app/accounts/permissions.py, walked against the real app: every action × every kind of caller.

For each action one real JSON API call performs it. Its body is well formed (so FastAPI's own validation passes)
but fails the service's checks that come after the permission check, so an allowed caller gets a 4xx that is not
403/404 and nothing is written, while a refused caller gets 403 (or 404 for a project they are not a member of).
A refusal before validation is what this proves: were validation first, refused callers would get 422 too.

Every member holds an account role different from their role in the project, so a call site that checks the
wrong one (the account role for a project action, or the reverse) fails here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from app.accounts import permissions
from app.accounts.permissions import ACTIONS

REPO = Path(__file__).resolve().parent.parent

# name → (account role, role in project A or None). No member's two roles agree.
PEOPLE: dict[str, tuple[str, str | None]] = {
    "admin": ("admin", None),
    "project-lead": ("annotator", "lead"),
    "project-engineer": ("lead", "engineer"),
    "project-annotator": ("engineer", "annotator"),
    "outsider": ("lead", None),  # leads project B, not a member of A
}
CALLERS = ("admin", "lead", "engineer", "annotator", "non-member")


def person_for(action: str, caller: str) -> str:
    """Who plays `caller`: for a project action the holder of that project role, for an account action the holder
    of that account role; the non-member is the outsider either way."""
    if caller in ("admin", "non-member"):
        return {"admin": "admin", "non-member": "outsider"}[caller]
    slot = 1 if ACTIONS[action].scope == "project" else 0
    return next(name for name, roles in PEOPLE.items() if roles[slot] == caller and name != "outsider")


def expected(action: str, person: str) -> str:
    """"allowed", "403" or "404", read off the table."""
    rule = ACTIONS[action]
    account_role, project_role = PEOPLE[person]
    if account_role == permissions.ADMIN:
        return "allowed"
    if rule.scope == "account":
        return "allowed" if account_role in rule.roles else "403"
    if project_role is None:
        return "404"
    return "allowed" if project_role in rule.roles else "403"


@dataclass
class World:
    tokens: dict[str, str]
    ids: dict[str, int]


@dataclass(frozen=True)
class Call:
    method: str
    path: str
    """With {project}, {prompt} and {export} filled in from the world."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    doing: str | None = None
    """The step the call site names in its refusal, where it names one more exactly than the action's verb."""


# An openai generator naming an endpoint that does not exist: refused by `endpoints.prepare`, after the permission
# check and before anything is queued (no model is loaded, no URL fetched).
NO_ENDPOINT = {"backend": "openai", "endpoint_id": 999_999}

REQUESTS: dict[str, Call] = {
    "project.see": Call("GET", "/api/projects/{project}"),
    # neither assignment_id nor prompt_id: Invalid once the annotator's role is checked
    "annotate": Call("POST", "/api/projects/{project}/rankings",
                     {"json": {"rubric_version": 1, "submission_id": "permission-walk"}}),
    "rubric.edit": Call("POST", "/api/projects/{project}/rubrics", {"json": {"text": "   ", "base_version": 1}}),
    "members.manage": Call("POST", "/api/projects/{project}/members",
                           {"json": {"email": "nobody@example.org", "role": "annotator"}}, doing="add members"),
    "constitution.edit": Call("POST", "/api/projects/{project}/constitutions",
                              {"json": {"principles": [{"name": "x", "comparison": "Which?"}] * 2,
                                        "base_version": 1}}),  # valid JSON, refused by the service: names repeat
    "gold.manage": Call("PUT", "/api/projects/{project}/prompts/{prompt}/gold",
                        {"json": {"tiers": [[999_998], [999_999]]}}),  # not this prompt's completions
    # a separator that is no regular expression: Invalid after the permission check
    "steps.configure": Call("PUT", "/api/projects/{project}/step-options",
                            {"json": {"enabled": True, "separator": "("}}),
    # the default decision again: allowed callers change nothing
    "labels.decide": Call("PUT", "/api/projects/{project}/ai-labels", {"json": {"enabled": False}}),
    # the default order again: allowed callers change nothing
    "selection.manage": Call("PUT", "/api/projects/{project}/selection", {"json": {"selection": "random"}}),
    "agreement.see": Call("GET", "/api/projects/{project}/agreement"),
    "data.import": Call("POST", "/api/projects/{project}/imports",
                        {"files": {"file": ("empty.jsonl", b"", "application/x-ndjson")}}),
    "sampling.start": Call("POST", "/api/projects/{project}/sampling-jobs", {"json": {"generator": NO_ENDPOINT}}),
    "judge.start": Call("POST", "/api/projects/{project}/judge-runs", {"json": {"generator": NO_ENDPOINT}}),
    "revisions.start": Call("POST", "/api/projects/{project}/revision-jobs", {"json": {"generator": NO_ENDPOINT}}),
    "export.create": Call("POST", "/api/projects/{project}/exports",
                          {"json": {"format": "jsonl", "filters": {"no_such_filter": 1}}}),
    # an export already deleted: deleting it again is allowed and changes nothing
    "export.delete": Call("DELETE", "/api/exports/{export}"),
    "training.start": Call("POST", "/api/projects/{project}/training-runs",
                           {"json": {"kind": "reward", "export_id": 999_999}}),
    # the default cluster cleared again: allowed callers change nothing
    "cluster.choose": Call("PUT", "/api/projects/{project}/default-cluster", {"json": {"default_cluster": None}}),
    "webhooks.manage": Call("GET", "/api/projects/{project}/webhooks"),
    # an unknown event: allowed callers get a 422 naming the field, and nothing is registered
    "webhooks.allow_private": Call("POST", "/api/projects/{project}/webhooks",
                                   {"json": {"url": "http://10.1.2.3/hook", "events": ["no.such"],
                                             "allow_private": True}}),
    "project.create": Call("POST", "/api/projects",
                           {"json": {"name": "   ", "completions_per_prompt": 2, "rubric": {"text": "Rank."}}}),
    "users.manage": Call("GET", "/api/users"),
    "endpoints.manage": Call("POST", "/api/model-endpoints",
                             {"json": {"name": "Walk", "base_url": "http://10.1.2.3:8000/v1", "model": "   "}}),
    "clusters.manage": Call("GET", "/api/admin/clusters"),
}


def _seed(session: Any) -> World:
    from sqlalchemy import select

    from app.accounts import users
    from app.exports import service as exports
    from app.imports import service as imports
    from app.models import Prompt
    from app.projects import constitutions, projects

    people = {name: users.create_user(session, f"{name}@example.org", "correct horse battery staple", account)
              for name, (account, _) in PEOPLE.items()}
    project = projects.create_project(session, people["admin"], name="Walked", completions_per_prompt=2, overlap=1,
                                      rubric_text="Rank.", criteria=["Correctness"])
    for name, (_, role) in PEOPLE.items():
        if role is not None:
            projects.add_member(session, project, people["admin"], email=people[name].email, role=role)
    projects.create_project(session, people["outsider"], name="Elsewhere", completions_per_prompt=2, overlap=1,
                            rubric_text="Rank.", criteria=[])
    imports.import_file(session, project, "p.jsonl", b'{"prompt": "2+2?", "completions": ["4", "5"]}\n',
                        actor=people["admin"])
    constitutions.ensure_default(session, project, people["admin"])
    export = exports.create_export(session, project, people["admin"], kind="pairs", format="jsonl")
    exports.delete(session, export, people["admin"])
    prompt_id = session.scalar(select(Prompt.id).where(Prompt.project_id == project.id))
    tokens = {name: users.create_token(session, person, "walk")[1] for name, person in people.items()}
    session.commit()
    return World(tokens=tokens, ids={"project": project.id, "prompt": prompt_id, "export": export.id})


@pytest.fixture(scope="module")
def walk(app_for: Callable[[str], Any], database_url: str, engine: Any) -> Iterator[tuple[Any, World]]:
    """The app and one seeded world for the whole module (every call leaves the data as it found it)."""
    from fastapi.testclient import TestClient

    from tests.conftest import _empty_tables

    app = app_for(database_url)
    _empty_tables(engine)
    session = app.state.session_factory()
    try:
        world = _seed(session)
    finally:
        session.close()
    yield TestClient(app, base_url="http://testserver"), world
    _empty_tables(engine)


def test_every_action_has_a_request() -> None:
    """A new action in ACTIONS needs a call here, or the walk below would not cover it."""
    assert set(REQUESTS) == set(ACTIONS), (
        f"missing: {sorted(set(ACTIONS) - set(REQUESTS))}, stale: {sorted(set(REQUESTS) - set(ACTIONS))}")


@pytest.mark.parametrize("caller", CALLERS)
@pytest.mark.parametrize("action", list(ACTIONS))
def test_the_table_holds(walk: tuple[Any, World], action: str, caller: str) -> None:
    client, world = walk
    call = REQUESTS.get(action)
    assert call is not None, f"no request for {action!r} in REQUESTS"
    person = person_for(action, caller)
    response = client.request(call.method, call.path.format(**world.ids), **call.kwargs,
                              headers={"Authorization": f"Bearer {world.tokens[person]}"})
    want = expected(action, person)
    where = (f"{action} as {person} {PEOPLE[person]}: {call.method} {call.path} → {response.status_code} "
             f"{response.text[:300]}")
    if want == "allowed":
        assert response.status_code not in (401, 403, 404) and response.status_code < 500, where
    else:
        assert str(response.status_code) == want, where
    if want == "403":
        # The refusal is the table's own, for this action (not another check that happens to refuse too).
        assert response.json()["detail"][0]["message"] == permissions.refusal(action, call.doing).message, where


ROLES_PAGE = REPO / "docs" / "reference" / "roles.md"


def _docs_table() -> str:
    lines = ROLES_PAGE.read_text(encoding="utf-8").splitlines()
    start = lines.index("## The table")
    section = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        section.append(line)
    return "\n".join(line for line in section if line.startswith("|"))


def test_the_docs_table_is_the_table() -> None:
    assert _docs_table() == permissions.role_table_markdown(), (
        "docs/reference/roles.md's table differs from app/accounts/permissions.py; paste "
        "`python -c 'from app.accounts import permissions; print(permissions.role_table_markdown())'` into it")
