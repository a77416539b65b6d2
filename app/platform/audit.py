"""The audit trail: who did what to which object, written in the caller's transaction."""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from app.models import AuditEvent, User


def record(db: Session, actor: User | None, action: str, *, project_id: int | None = None,
           object_type: str = "", object_id: int | None = None, ip: str = "", **data: Any) -> AuditEvent:
    event = AuditEvent(actor_id=actor.id if actor else None, project_id=project_id, action=action,
                       object_type=object_type, object_id=object_id, ip=ip, data=data)
    db.add(event)
    return event
