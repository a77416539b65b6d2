"""Push a finished export (its files and dataset card) to a Hugging Face Hub-compatible server as a dataset repo.

One `create_commit` carries every file, so the repo gets the whole export or nothing of it; the repo is created
first when it does not exist (`exist_ok`). The endpoint is the caller's (a self-hosted Hub works the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from app.exports import service as exports
from app.models import Export
from app.platform.errors import DomainError, Invalid, NotFound


class PushRefused(DomainError):
    """The Hub answered with an error: the message names the repo and the HTTP status."""

    status_code = 502


@dataclass(frozen=True)
class Pushed:
    repo: str
    revision: str
    commit_url: str
    files: list[str]


def ready_files(db: Session, export_id: int) -> list[tuple[str, Path]]:
    """(name in the repo, path on disk) for every file of a ready export, README.md included, or a clear error."""
    export = db.get(Export, export_id)
    if export is None:
        raise NotFound(f"no export {export_id}")
    state = exports.status(db, export)
    if state != "ready":
        raise Invalid(f"export {export_id} is {state}, not ready: only a finished export can be pushed",
                      field="export_id")
    return [(name, exports.file_path(export, name)) for name in sorted(export.files or {})]


def push(files: list[tuple[str, Path]], *, repo: str, endpoint: str, token: str | None, private: bool = False,
         revision: str | None = None, message: str = "Upload a preflab export") -> Pushed:
    """Create the dataset repo if needed and commit every file in one commit; PushRefused when the Hub says no."""
    import httpx
    from huggingface_hub import CommitOperationAdd, HfApi
    from huggingface_hub.errors import HfHubHTTPError

    if repo.count("/") > 1 or not repo.strip("/"):
        raise Invalid("must be NAME or NAMESPACE/NAME", field="repo")
    api = HfApi(endpoint=endpoint.rstrip("/"), token=token or False)
    step = "creating"
    try:
        api.create_repo(repo, repo_type="dataset", private=private, exist_ok=True)
        step = "committing to"
        info = api.create_commit(repo, repo_type="dataset", revision=revision, commit_message=message,
                                 operations=[CommitOperationAdd(path_in_repo=name, path_or_fileobj=str(path))
                                             for name, path in files])
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        raise PushRefused(f"{endpoint} refused {step} dataset repo {repo!r}: HTTP {status}"
                          f"{' (check the token and its write access)' if status in (401, 403) else ''}: "
                          f"{str(exc).splitlines()[0][:300]}") from None
    except (OSError, ValueError, httpx.HTTPError) as exc:  # no answer at all, or an answer that is not the Hub's
        raise PushRefused(f"pushing dataset repo {repo!r} to {endpoint} failed: {exc}") from None
    return Pushed(repo, revision or "main", str(info.commit_url), [name for name, _ in files])
