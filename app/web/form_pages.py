"""A page and the form it posts, said once: GET shows the page, POST runs the form's action and then redirects,
or shows the page again with the error and what the user typed (app.web.forms.submit). `FormPage` for pages of their
own (the admin's), `ProjectPage` for a project's.

No `from __future__ import annotations` here: `mount` builds handlers whose form parameter's type is only known
at run time, and FastAPI must read the real annotation objects, not strings to resolve in this module.
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Form, Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from app.platform.settings import Settings
from app.projects import projects
from app.web import forms
from app.web.deps import Id, PageUser, SessionDep
from app.web.rendering import render

T = TypeVar("T")
# (db, project, user) → the template's context; the project and user are the ORM objects the services take.
Context = Callable[[Session, Any, Any], dict[str, Any]]
# The app's settings → what a page shows of them (a default model), added to its context.
FromSettings = Callable[[Settings], dict[str, Any]]


def default_model(settings: Settings) -> dict[str, Any]:
    """The local model a model form offers when none is typed: the default policy model (SmolLM2-135M-Instruct once
    prepared, as in the demo), or None."""
    return {"default_model": str(settings.default_policy_model) if settings.default_policy_model else None}


@dataclass(frozen=True)
class FormPage:
    template: str
    context: Callable[[Session], dict[str, Any]]
    redirect: str

    def show(self, request: Request, db: Session) -> Response:
        return render(request, self.template, self.context(db))

    def submit(self, request: Request, db: Session, form: forms.ApiForm, action: Callable[[Any], Any]) -> Response:
        return forms.submit(request, db, form, action, redirect=self.redirect, template=self.template,
                            context=lambda _: self.context(db))


@dataclass(frozen=True)
class ProjectPage:
    template: str
    context: Context
    # The HTMX fragment a poll re-renders (None: the whole page).
    block: str | None = None
    from_settings: FromSettings | None = None

    def show(self, request: Request, db: Session, user: Any, project_id: Id) -> Response:
        project = projects.get_visible(db, project_id, user)
        return render(request, self.template, self._context(request, db, project, user), block=self.block)

    def _context(self, request: Request, db: Session, project: Any, user: Any) -> dict[str, Any]:
        shown = self.from_settings(request.app.state.settings) if self.from_settings else {}
        return self.context(db, project, user) | shown

    def submit(self, request: Request, db: Session, user: Any, project_id: Id, form: forms.ApiForm,
               action: Callable[[Session, Any, Any, Any], T], *, redirect: str | Callable[[T], str],
               shown: dict[str, Any] | None = None) -> Response:
        """`redirect` may name `{project_id}`; `shown` adds to the context when the page is shown again."""
        project = projects.get_visible(db, project_id, user)
        target = redirect.format(project_id=project.id) if isinstance(redirect, str) else redirect
        return forms.submit(request, db, form, lambda body: action(db, project, user, body), redirect=target,
                            template=self.template,
                            context=lambda _: self._context(request, db, project, user) | (shown or {}))

    def mount(self, router: APIRouter, path: str, *, form: type[forms.ApiForm],
              action: Callable[[Session, Any, Any, Any], Any], redirect: str | Callable[[Any], str],
              post_path: str | None = None, shown: dict[str, Any] | None = None) -> None:
        """GET `path` shows the page; POST `post_path` (default: `path`) parses `form` and runs `action`."""
        def page(request: Request, project_id: Id, db: SessionDep, user: PageUser) -> Response:
            return self.show(request, db, user, project_id)

        def post(request: Request, project_id: Id, db: SessionDep, user: PageUser, body: Any) -> Response:
            return self.submit(request, db, user, project_id, body, action, redirect=redirect, shown=shown)

        post.__annotations__["body"] = Annotated[form, Form()]
        name = self.template.removesuffix(".html")
        router.add_api_route(path, page, methods=["GET"], include_in_schema=False, name=f"{name}_page")
        router.add_api_route(post_path or path, post, methods=["POST"], include_in_schema=False,
                             name=f"{name}_submit")
