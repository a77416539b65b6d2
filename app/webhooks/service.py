"""Webhooks: a project's HTTPS URLs told of events, each delivery signed, retried with backoff and logged.

`fire(db, project_id, event, data)` writes one delivery row and one `webhook_delivery` job per subscribed hook in
the caller's transaction, so an event is announced only if the work it announces commits. The worker sends the
body (`attempt`), signed with the hook's secret: `X-Preflab-Signature: sha256=<hex HMAC-SHA256 of the raw body>`,
with `X-Preflab-Event` and `X-Preflab-Delivery` (the same id on every retry). Any 2xx answer delivers; anything
else (or no answer) is retried after a doubling backoff until the job's attempts run out.

Outbound rules are the model endpoints' (app/platform/outbound.py): https only, never a metadata or link-local
address, and a private or loopback host (or plain http to one) only when an admin trusted the hook
(`allow_private`). Every connection is checked again when it opens, so DNS rebinding is refused too.
Secrets are stored encrypted (app/platform/crypto.py) and shown once, in the answer that created the hook.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import secrets
import time
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from urllib.parse import urlsplit

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import permissions
from app.jobs import queue as jobs
from app.models import Project, TrainingRun, User, Webhook, WebhookDelivery, utcnow
from app.platform import audit, outbound
from app.platform.crypto import Keyring, KeyringError
from app.platform.errors import Invalid, NotFound
from training.shared.net import checked_transport

EVENTS = ("export.ready", "training_run.finished", "training_run.failed", "judge_run.finished",
          "overlap.reached", "annotator.flagged")
SIGNATURE_HEADER = "X-Preflab-Signature"
EVENT_HEADER = "X-Preflab-Event"
DELIVERY_HEADER = "X-Preflab-Delivery"
MAX_ATTEMPTS = 6
"""One delivery is tried this often (first try and five retries) before it is marked failed."""
MAX_HOOKS = 20
ERROR_MAX = 500


@dataclass(frozen=True)
class Created:
    hook: Webhook
    secret: str
    """The signing secret in plain text: only the answer that created the hook carries it."""


def _clean_events(events: list[str]) -> list[str]:
    wanted = list(dict.fromkeys(e.strip() for e in events if e.strip()))
    if not wanted:
        raise Invalid(f"name at least one event: {', '.join(EVENTS)}", field="events")
    unknown = [e for e in wanted if e not in EVENTS]
    if unknown:
        raise Invalid(f"unknown event {unknown[0]!r}; one of {', '.join(EVENTS)}", field="events")
    return wanted


def _clean_url(url: str, allow_private: bool) -> str:
    checked = outbound.check_base_url(url, field="url", allow_private=allow_private)
    if urlsplit(checked).scheme != "https" and not allow_private:
        raise Invalid("must be an https:// URL (plain http only to a private host an admin trusts)", field="url")
    return checked


def create(db: Session, actor: User, keyring: Keyring, project: Project, *, url: str, events: list[str],
           allow_private: bool = False) -> Created:
    """A new hook and its secret, or Invalid / Forbidden naming the field. The URL is checked (and resolved) now."""
    if allow_private:  # asked first: a lead asking for it is told that it takes an admin
        permissions.require(db, actor, project, "webhooks.allow_private")
    permissions.require(db, actor, project, "webhooks.manage")
    count = len(db.scalars(select(Webhook.id).where(Webhook.project_id == project.id)).all())
    if count >= MAX_HOOKS:
        raise Invalid(f"a project has at most {MAX_HOOKS} webhooks; remove one first", field="url")
    secret = "whsec_" + secrets.token_urlsafe(32)
    try:
        sealed = keyring.encrypt(secret)
    except KeyringError as exc:
        raise Invalid(str(exc), field="secret") from None
    hook = Webhook(project_id=project.id, url=_clean_url(url, bool(allow_private)), events=_clean_events(events),
                   secret_stored=sealed, allow_private=bool(allow_private), created_by_id=actor.id)
    db.add(hook)
    db.flush()
    audit.record(db, actor, "webhook.create", project_id=project.id, object_type="webhook", object_id=hook.id,
                 url=hook.url, events=hook.events, allow_private=hook.allow_private)
    return Created(hook, secret)


def list_hooks(db: Session, actor: User, project: Project) -> list[Webhook]:
    permissions.require(db, actor, project, "webhooks.manage")
    return list(db.scalars(select(Webhook).where(Webhook.project_id == project.id).order_by(Webhook.id)))


def get(db: Session, actor: User, project: Project, hook_id: int) -> Webhook:
    """The project's hook, or NotFound (a hook of another project is not found, not forbidden)."""
    permissions.require(db, actor, project, "webhooks.manage")
    hook = db.get(Webhook, hook_id)
    if hook is None or hook.project_id != project.id:
        raise NotFound("no such webhook")
    return hook


def delete(db: Session, actor: User, project: Project, hook: Webhook) -> None:
    """Removes the hook and its delivery log; queued deliveries find no hook and end without sending."""
    permissions.require(db, actor, project, "webhooks.manage")
    audit.record(db, actor, "webhook.delete", project_id=project.id, object_type="webhook", object_id=hook.id,
                 url=hook.url)
    db.delete(hook)
    db.flush()


def list_deliveries(db: Session, actor: User, project: Project, hook: Webhook,
                    limit: int = 50) -> list[WebhookDelivery]:
    permissions.require(db, actor, project, "webhooks.manage")
    return list(db.scalars(select(WebhookDelivery).where(WebhookDelivery.webhook_id == hook.id)
                           .order_by(WebhookDelivery.id.desc()).limit(limit)))


def wanted(db: Session, project_id: int, event: str) -> bool:
    """Whether any hook of the project wants `event`: a caller whose event costs work to find skips that work
    where nobody listens."""
    return bool(_hooks(db, project_id, event))


def _hooks(db: Session, project_id: int, event: str) -> list[Webhook]:
    if event not in EVENTS:
        raise ValueError(f"unknown webhook event {event!r}")
    return [h for h in db.scalars(select(Webhook).where(Webhook.project_id == project_id)) if event in h.events]


def fire(db: Session, project_id: int, event: str, data: dict[str, Any]) -> list[WebhookDelivery]:
    """A delivery (and its job) for every hook of the project that wants `event`, in the caller's transaction."""
    hooks = _hooks(db, project_id, event)
    if not hooks:
        return []
    project = db.get(Project, project_id)
    out = []
    for hook in hooks:
        uid = str(uuid.uuid4())
        body = {"id": uid, "event": event, "project_id": project_id, "created_at": utcnow().isoformat(),
                "data": data}
        delivery = WebhookDelivery(webhook_id=hook.id, uid=uid, event=event, payload=body, state="pending",
                                   attempts=0, log=[])
        db.add(delivery)
        db.flush()
        job = jobs.enqueue(db, "webhook_delivery", {"delivery_id": delivery.id}, project=project, actor=None,
                           max_attempts=MAX_ATTEMPTS)
        delivery.job_id = job.id
        out.append(delivery)
    return out


def training_run_ended(db: Session, run: TrainingRun) -> list[WebhookDelivery]:
    """`training_run.finished` or `.failed` for a run that just ended (the caller records the end, once)."""
    event = "training_run.finished" if run.state == "succeeded" else "training_run.failed"
    return fire(db, run.project_id, event, {"training_run_id": run.id, "kind": run.kind, "state": run.state,
                                            "export_id": run.export_id, "url": f"/api/training-runs/{run.id}"})


def body_bytes(delivery: WebhookDelivery) -> bytes:
    """The exact bytes sent (and signed): the same on every retry."""
    return json.dumps(delivery.payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


def sign(secret: str, body: bytes) -> str:
    """`sha256=<hex>`: HMAC-SHA256 of the raw body under the hook's secret."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def backoff(attempt: int, base_s: float) -> timedelta:
    """The wait after failed attempt `attempt` (1-based): base, 2·base, 4·base, …, at most an hour."""
    return timedelta(seconds=min(3600.0, base_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class Request:
    """What one attempt sends: read in a short transaction, sent outside any."""

    url: str
    allow_private: bool
    body: bytes
    headers: dict[str, str]


def prepare(db: Session, keyring: Keyring, delivery_id: int) -> Request | None:
    """The signed request for a delivery, or None when its hook was removed or it already ended."""
    delivery = db.get(WebhookDelivery, delivery_id)
    if delivery is None or delivery.state != "pending":
        return None
    hook = db.get(Webhook, delivery.webhook_id)
    if hook is None:
        return None
    body = body_bytes(delivery)
    headers = {"Content-Type": "application/json", "User-Agent": "preflab-webhooks",
               SIGNATURE_HEADER: sign(keyring.decrypt(hook.secret_stored), body),
               EVENT_HEADER: delivery.event, DELIVERY_HEADER: delivery.uid}
    return Request(hook.url, hook.allow_private, body, headers)


@dataclass(frozen=True)
class Outcome:
    status_code: int | None
    error: str | None
    seconds: float

    @property
    def ok(self) -> bool:
        return self.status_code is not None and 200 <= self.status_code < 300


def send(request: Request, *, timeout_s: float) -> Outcome:
    """POST the body once; never raises for the receiver's faults (refused address, timeout, non-2xx)."""
    import httpx

    start = time.monotonic()
    try:
        outbound.check_base_url(request.url, field="url", allow_private=request.allow_private)
        transport = checked_transport(outbound.address_guard(request.allow_private), 1)
        with httpx.Client(transport=transport, timeout=timeout_s, follow_redirects=False) as client, \
                client.stream("POST", request.url, content=request.body, headers=request.headers) as answer:
            status = answer.status_code
            head = next(answer.iter_bytes(), b"")[:200]  # the start of the answer only: a huge body is not read
    except Invalid as exc:
        return Outcome(None, f"refused: {exc.message}", time.monotonic() - start)
    except Exception as exc:  # connection refused, timeout, TLS, refused address at connect time
        return Outcome(None, f"{exc.__class__.__name__}: {exc}"[:ERROR_MAX], time.monotonic() - start)
    error = None if 200 <= status < 300 else f"HTTP {status}: {head.decode('utf-8', errors='replace')}"
    return Outcome(status, error, time.monotonic() - start)


def record(db: Session, delivery_id: int, attempt: int, outcome: Outcome, *, final: bool) -> str | None:
    """Log the attempt on the delivery; its state becomes delivered, failed (`final`) or stays pending."""
    delivery = db.get(WebhookDelivery, delivery_id)
    if delivery is None:
        return None
    delivery.attempts = attempt
    delivery.status_code = outcome.status_code
    delivery.error = outcome.error
    delivery.log = [*delivery.log, {"attempt": attempt, "at": utcnow().isoformat(), "status_code": outcome.status_code,
                                    "error": outcome.error, "seconds": round(outcome.seconds, 3)}]
    if outcome.ok:
        delivery.state = "delivered"
        delivery.delivered_at = utcnow()
    elif final:
        delivery.state = "failed"
    return delivery.state
