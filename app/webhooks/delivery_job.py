"""The `webhook_delivery` job: send one signed event to one webhook, log the attempt, retry later with backoff."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.jobs.context import JobContext, JobError, JobRetry
from app.platform.crypto import Keyring, KeyUnreadable
from app.platform.db import run_transaction
from app.webhooks import service as webhooks


def run(ctx: JobContext) -> dict[str, Any]:
    delivery_id = int(ctx.payload["delivery_id"])
    keyring = Keyring(ctx.settings)
    with ctx.session_factory() as db:
        try:
            request = webhooks.prepare(db, keyring, delivery_id)
        except KeyUnreadable:
            problem = ("the webhook's secret cannot be decrypted with the configured keys; "
                       "remove the webhook and add it again")
            webhooks.record(db, delivery_id, ctx.attempts, webhooks.Outcome(None, problem, 0.0), final=True)
            db.commit()
            raise JobError(problem) from None
    if request is None:
        return {"message": "nothing to send: the webhook was removed or the delivery already ended"}
    outcome = webhooks.send(request, timeout_s=ctx.settings.webhook_timeout_s)
    final = ctx.attempts >= webhooks.MAX_ATTEMPTS

    def log_attempt(db: Session) -> str | None:
        return webhooks.record(db, delivery_id, ctx.attempts, outcome, final=final)

    run_transaction(ctx.session_factory, log_attempt, what=f"logging webhook delivery {delivery_id}")
    ctx.log(f"delivery {delivery_id} attempt {ctx.attempts}: {outcome.status_code or '-'} {outcome.error or 'ok'}")
    if outcome.ok:
        return {"status_code": outcome.status_code, "message": f"delivered (HTTP {outcome.status_code})"}
    if final:
        raise JobError(f"gave up after {ctx.attempts} attempts: {outcome.error}")
    raise JobRetry(outcome.error or "not delivered", webhooks.backoff(ctx.attempts, ctx.settings.webhook_retry_base_s))
