"""Projects, their members, and who may see or change what inside them."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.accounts import permissions, users
from app.models import MEMBER_ROLES, Completion, Pair, Project, ProjectMember, Prompt, Ranking, Rubric, User
from app.platform import audit
from app.platform.errors import Conflict, Invalid, NotFound
from app.projects import rubrics


def visible_query(user: User):
    query = select(Project).order_by(Project.name)
    if user.role != permissions.ADMIN:
        query = query.join(ProjectMember).where(ProjectMember.user_id == user.id)
    return query


def list_visible(db: Session, user: User) -> list[Project]:
    return list(db.scalars(visible_query(user)))


def find(db: Session, project_id: int) -> Project | None:
    """The project with this id, or None; no permission check (a job acts for whoever queued it)."""
    return db.get(Project, project_id)


def get_visible(db: Session, project_id: int, user: User) -> Project:
    """The project, or NotFound when it does not exist or the user is not a member (admins see all)."""
    # The viewer's role comes with the project: every check on the page after this one reads it from the session.
    row = db.execute(select(Project, ProjectMember.role)
                     .outerjoin(ProjectMember, (ProjectMember.project_id == Project.id)
                                & (ProjectMember.user_id == user.id))
                     .where(Project.id == project_id)).first()
    if row is None:
        raise NotFound("no such project")
    project, role = row
    permissions.remember_role(db, project.id, user, role)
    permissions.require(db, user, project, "project.see")
    return project


def create_project(db: Session, creator: User, *, name: str, completions_per_prompt: int, overlap: int,
                   rubric_text: str, criteria: list[str], description: str = "") -> Project:
    permissions.require_account(creator, "project.create")
    name = name.strip()
    if not name:
        raise Invalid("must not be empty", field="name")
    if len(name) > 200:
        raise Invalid("must be at most 200 characters", field="name")
    if not 2 <= completions_per_prompt <= 16:
        raise Invalid("must be between 2 and 16", field="completions_per_prompt")
    if not 1 <= overlap <= 50:
        raise Invalid("must be between 1 and 50", field="overlap")
    if db.scalar(select(Project.id).where(Project.name == name)) is not None:
        raise Conflict(f"a project named {name!r} already exists", field="name")
    project = Project(name=name, description=description.strip(), completions_per_prompt=completions_per_prompt,
                      overlap=overlap, created_by_id=creator.id)
    db.add(project)
    db.flush()
    if creator.role != permissions.ADMIN:
        db.add(ProjectMember(project_id=project.id, user_id=creator.id, role="lead"))
    rubrics.create_version(db, project, creator, text=rubric_text, criteria=criteria, base_version=None,
                           check_permission=False)
    audit.record(db, creator, "project.create", project_id=project.id, object_type="project",
                 object_id=project.id, name=name)
    return project


def add_member(db: Session, project: Project, actor: User, *, email: str, role: str) -> ProjectMember:
    permissions.require(db, actor, project, "members.manage", doing="add members")
    if role not in MEMBER_ROLES:
        raise Invalid(f"role must be one of {', '.join(MEMBER_ROLES)}", field="role")
    user = users.get_by_email(db, email)
    if user is None:
        raise Invalid(f"no user with email {email.strip().lower()}", field="email")
    member = db.scalar(select(ProjectMember).where(ProjectMember.project_id == project.id,
                                                   ProjectMember.user_id == user.id))
    if member is None:
        member = ProjectMember(project_id=project.id, user_id=user.id, role=role)
        db.add(member)
    else:
        member.role = role
    db.flush()
    audit.record(db, actor, "member.add", project_id=project.id, object_type="user", object_id=user.id, role=role)
    return member


def remove_member(db: Session, project: Project, actor: User, user_id: int) -> None:
    permissions.require(db, actor, project, "members.manage", doing="remove members")
    member = db.scalar(select(ProjectMember).where(ProjectMember.project_id == project.id,
                                                   ProjectMember.user_id == user_id))
    if member is None:
        raise NotFound("no such member")
    db.delete(member)
    audit.record(db, actor, "member.remove", project_id=project.id, object_type="user", object_id=user_id)


@dataclass(frozen=True)
class MemberRow:
    user_id: int
    email: str
    name: str
    role: str


def list_members(db: Session, project: Project) -> list[MemberRow]:
    """The members with their accounts' email and name, by email, in one query of plain rows (loading 200 members
    and their users as ORM objects was a quarter of the project page's CPU)."""
    rows = db.execute(select(ProjectMember.user_id, User.email, User.name, ProjectMember.role)
                      .join(User, User.id == ProjectMember.user_id)
                      .where(ProjectMember.project_id == project.id).order_by(User.email))
    return [MemberRow(*row) for row in rows]


@dataclass(frozen=True)
class ProjectCounts:
    """The project page's counts."""

    prompts: int
    completions: int
    rankings: int
    """Rankings by annotators and the judge; Monte-Carlo step labels, kept in rankings that order nothing, are not
    counted."""
    pairs: int
    """chosen ≻ rejected pairs the rankings expand to."""
    rubric_versions: int
    as_of: datetime | None = None
    """None: counted on this view; else when the rollup job counted them (a large project)."""
    age_seconds: float | None = None


def counts(db: Session, project: Project) -> ProjectCounts:
    def n(stmt) -> int:
        return int(db.scalar(stmt) or 0)

    return ProjectCounts(
        prompts=n(select(func.count(Prompt.id)).where(Prompt.project_id == project.id)),
        completions=n(select(func.count(Completion.id)).join(Prompt).where(Prompt.project_id == project.id)),
        # Monte-Carlo step labelling keeps its labels in rankings that order nothing: not counted as rankings.
        rankings=n(select(func.count(Ranking.id)).where(Ranking.project_id == project.id, Ranking.source != "mc")),
        pairs=n(select(func.count(Pair.id)).join(Prompt, Pair.prompt_id == Prompt.id)
                .where(Prompt.project_id == project.id)),
        rubric_versions=n(select(func.count(Rubric.id)).where(Rubric.project_id == project.id)),
    )


def default_cluster(project: Project) -> str | None:
    """The cluster the project's runs (and its sampling with a local model, its Monte-Carlo labels) go to when they
    name none (a lead's project setting), or None: local, the worker's own host."""
    value = (project.settings or {}).get("default_cluster")
    return value if isinstance(value, str) and value and value != "local" else None
