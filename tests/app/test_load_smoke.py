"""The 200-annotator load test in small (20 annotators, ~10 s, Postgres): no errors and no duplicate assignments.

It runs `benchmarks/load_annotators.py`'s own code (fresh database, uvicorn and an export worker as processes, the
annotators' loop, the lead's export and training enqueue, the database checks). No timing is asserted here: speed
budgets live in the benchmark, whose figures depend on the machine.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine, text

from tests.conftest import pg_url

pytestmark = pytest.mark.postgres


@pytest.mark.timeout(300)
def test_twenty_annotators_with_an_export_and_a_training_enqueue() -> None:
    from benchmarks.load_annotators import LoadConfig, run

    url = pg_url() + "_load"
    cfg = LoadConfig(annotators=20, seconds=8.0, warmup=2.0, think=0.1, resubmit=0.1, export_at=0.25)
    try:
        result = run(url, cfg, prompts=300, overlap=2, workers=1)
    finally:
        base, _, name = url.rpartition("/")
        admin = create_engine(f"{base}/postgres", isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()

    assert result["errors"] == 0, result["error_kinds"]
    assert result["rankings"] > 0 and result["resubmits_answered_200"] > 0, result
    db = result["database"]
    assert result["duplicate_assignments"] == 0, db
    assert db["rankings_with_wrong_pair_count"] == 0, db
    lead = result["export_and_training"]
    assert lead.get("export_status") == "ready" and lead.get("export_rows", 0) > 0, lead
    assert lead.get("training_request_status") == 202 and lead.get("training_state") == "queued", lead
    assert lead.get("training_cancel_status") == 200, lead
