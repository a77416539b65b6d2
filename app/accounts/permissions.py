"""Who may do what: the one table of actions and the roles allowed each, and the checks every route and service asks.

Two kinds of action. A *project action* is allowed by the caller's role in that project (lead, engineer,
annotator); a caller who is not a member does not see the project at all (404), a member whose role lacks the
action gets 403. An *account action* is allowed by the account's own role. Admins may do everything everywhere.
The docs' "Who may do what" table (docs/reference/roles.md) is printed from `ACTIONS` (`role_table_markdown`) and a
test keeps it so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlalchemy import event, select
from sqlalchemy.orm import Session

from app.models import Project, ProjectMember, User
from app.platform.errors import Forbidden, NotFound

ADMIN = "admin"
PROJECT_ROLES = ("lead", "engineer", "annotator")


@dataclass(frozen=True)
class Action:
    roles: frozenset[str]
    # How a refusal names it: "you may not <verb> in this project".
    verb: str
    # The docs table's wording.
    summary: str
    scope: Literal["project", "account"] = "project"


def _project(roles: set[str], verb: str, summary: str) -> Action:
    return Action(frozenset(roles), verb, summary)


def _account(roles: set[str], refusal: str, summary: str) -> Action:
    return Action(frozenset(roles), refusal, summary, scope="account")


LEAD, ENGINEER, ANNOTATOR = "lead", "engineer", "annotator"

ACTIONS: dict[str, Action] = {
    # Project actions.
    "project.see": _project({LEAD, ENGINEER, ANNOTATOR}, "see", "see the project, its rubric, jobs and exports"),
    "annotate": _project({ANNOTATOR, LEAD}, "annotate", "rank completions in the queue"),
    "rubric.edit": _project({LEAD}, "edit the rubric", "write a new rubric version"),
    "members.manage": _project({LEAD}, "manage members", "add, change and remove members"),
    "constitution.edit": _project({LEAD}, "edit the constitution", "write a new constitution version"),
    "steps.configure": _project({LEAD}, "configure step labels",
                                "turn step labels on or off and set the step separator"),
    "gold.manage": _project({LEAD}, "set gold tasks", "set and clear gold tasks"),
    "labels.decide": _project({LEAD}, "decide on AI labels", "accept or reject AI judge labels and revisions"),
    "agreement.see": _project({LEAD, ENGINEER}, "see agreement figures", "see agreement and annotator quality"),
    "data.import": _project({LEAD, ENGINEER}, "import data", "import prompts, completions and pairs"),
    "sampling.start": _project({LEAD, ENGINEER}, "sample completions", "sample completions and cancel jobs"),
    "judge.start": _project({LEAD, ENGINEER}, "run the AI judge", "run the AI judge"),
    "revisions.start": _project({LEAD, ENGINEER}, "ask for revisions", "ask for constitutional revisions"),
    "export.create": _project({LEAD, ENGINEER}, "export data", "export pair datasets"),
    "export.delete": _project({LEAD}, "delete exports", "delete an export"),
    "training.start": _project({LEAD, ENGINEER}, "start training runs",
                               "start and cancel training runs and iterations"),
    "selection.manage": _project({LEAD}, "choose the queue order",
                                 "choose the queue's selection (random, uncertainty, disagreement) and compute "
                                 "priorities"),
    "cluster.choose": _project({LEAD}, "choose the default cluster",
                               "choose the cluster the project's training runs go to by default"),
    "webhooks.manage": _project({LEAD}, "manage webhooks", "add and remove webhooks and see their deliveries"),
    "webhooks.allow_private": _project(set(), "point a webhook at a private or loopback address",
                                       "let a webhook call a private or loopback host (admins only)"),
    # Account actions (the account's own role).
    "project.create": _account({LEAD}, "only admins and leads create projects", "create a project"),
    "users.manage": _account(set(), "this needs the admin role", "create, change and deactivate accounts"),
    "endpoints.manage": _account(set(), "only admins configure model endpoints", "configure model endpoints"),
    "clusters.manage": _account(set(), "only admins configure clusters", "configure the Slurm and Ray clusters runs "
                                                                         "are sent to"),
}


def _action(name: str) -> Action:
    try:
        return ACTIONS[name]
    except KeyError:
        raise ValueError(f"unknown action {name!r}; the actions are {', '.join(ACTIONS)}") from None


_ROLES = "preflab.member_roles"
"""The key of a session's `info` under which member_role keeps the roles it read."""


def member_role(db: Session, project: Project | int, user: User) -> str | None:
    """The user's role in the project (None: not a member). A request asks several times (the project's
    visibility, then each action and control on the page: the project page asked eight times), so the answer is kept
    in the session until it next writes or ends its transaction (`_forget_roles`)."""
    project_id = project if isinstance(project, int) else project.id
    roles = db.info.setdefault(_ROLES, {})
    key = (project_id, user.id)
    # Unflushed changes (a member added or removed in the same session) are what the query would autoflush and see.
    if key not in roles or db.new or db.deleted or db.dirty:
        roles[key] = db.scalar(select(ProjectMember.role).where(ProjectMember.project_id == project_id,
                                                                ProjectMember.user_id == user.id))
    return roles[key]


def remember_role(db: Session, project_id: int, user: User, role: str | None) -> None:
    """A role the caller read along with the project (one query instead of two), for member_role to answer."""
    db.info.setdefault(_ROLES, {})[(project_id, user.id)] = role


@event.listens_for(Session, "after_flush")
@event.listens_for(Session, "after_commit")
@event.listens_for(Session, "after_soft_rollback")
def _forget_roles(session: Session, *_: object) -> None:
    """A write may change a membership, and another transaction may have changed one since: read again."""
    session.info.pop(_ROLES, None)


def role_allows(account_role: str, project_role: str | None, action: str) -> bool:
    """The table itself, for a caller whose project role is already known (None: not a member)."""
    rule = _action(action)
    if account_role == ADMIN:
        return True
    held = account_role if rule.scope == "account" else project_role
    return held in rule.roles


def may(db: Session, user: User, project: Project, action: str) -> bool:
    return role_allows(user.role, member_role(db, project, user), action)


def refusal(action: str, doing: str | None = None) -> Forbidden:
    """`doing` names the step more exactly than the action's verb, e.g. "cancel training runs"."""
    rule = _action(action)
    return Forbidden(rule.verb if rule.scope == "account" else f"you may not {doing or rule.verb} in this project")


def check_role(account_role: str, project_role: str | None, action: str, doing: str | None = None) -> None:
    """404 for a project the caller cannot see, 403 for an action their role lacks."""
    if account_role != ADMIN and project_role is None:
        raise NotFound("no such project")
    if not role_allows(account_role, project_role, action):
        raise refusal(action, doing)


def require(db: Session, user: User, project: Project, action: str, *, doing: str | None = None) -> None:
    check_role(user.role, None if user.role == ADMIN else member_role(db, project, user), action, doing)


def may_account(user: User, action: str) -> bool:
    return role_allows(user.role, None, action)


def require_account(user: User, action: str) -> None:
    if not may_account(user, action):
        raise refusal(action)


def project_capabilities(db: Session, user: User, project: Project) -> dict[str, bool]:
    """Every project action, allowed or not, for templates that show or hide controls."""
    role = member_role(db, project, user)
    return {name: role_allows(user.role, role, name) for name, rule in ACTIONS.items() if rule.scope == "project"}


def role_table_markdown() -> str:
    """The docs' "Who may do what" table (docs/reference/roles.md)."""
    head = "| action | what it covers | " + " | ".join(("admin", *PROJECT_ROLES)) + " |"
    rows = [head, "|---|---|" + "---|" * (1 + len(PROJECT_ROLES))]
    for name, rule in ACTIONS.items():
        marks = ["✓"] + ["✓" if role in rule.roles else "" for role in PROJECT_ROLES]
        scope = "" if rule.scope == "project" else " (account role)"
        rows.append(f"| `{name}`{scope} | {rule.summary} | " + " | ".join(marks) + " |")
    return "\n".join(rows)
