"""Liveness and database health for load balancers and the README's first check."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse
from sqlalchemy import text

from app.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", summary="Service and database health",
            responses={503: {"model": Health, "description": "The database is unreachable"}})
def healthz(request: Request) -> JSONResponse:
    try:
        with request.app.state.engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except Exception:  # any driver error means the database is down for our purposes
        return JSONResponse({"status": "degraded", "database": "down"}, status_code=503)
    return JSONResponse({"status": "ok", "database": "ok"})
