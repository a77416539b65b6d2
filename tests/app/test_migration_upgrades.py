"""Every Alembic revision upgrades a database full of data without losing or changing a value, on SQLite and
Postgres; and every revision can be downgraded, or its docstring says why not.

For each revision N (found by walking the migrations, so a new one is covered without editing this file): a
database is migrated to head, filled with realistic rows in every table (`seed`), downgraded to N−1 (which keeps
what the schema at N−1 can hold), read whole, upgraded to N, and read again. Every row that existed at N−1 must
still be there with the same values in the columns that existed at N−1.

A revision that adds a table must add rows for it to `seed`: the test fails while any table is left empty,
because an empty table proves nothing about an upgrade.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import MetaData, create_engine, select

from app.platform.migrate import MIGRATIONS_DIR, downgrade, revisions, upgrade
from tests.app.test_backup import scratch_postgres
from tests.conftest import PASSWORD

STEPS = list(zip(revisions()[:-1], revisions()[1:], strict=True))


@pytest.fixture(params=["sqlite", "postgres"])
def empty_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path}/upgrades.db"
    return scratch_postgres("upgrades")


def seed(url: str) -> None:
    """Rows in every table, as a team's months of work leave them (at head, through services where they exist)."""
    from datetime import UTC, datetime, timedelta

    from app.accounts import users
    from app.annotation.pairs import expand_tiers
    from app.models import (
        AgreementMark,
        Assignment,
        AssignmentDraft,
        AuditEvent,
        Completion,
        ComputeCluster,
        Constitution,
        Export,
        Job,
        JudgeRun,
        ModelEndpoint,
        Pair,
        ProjectRollup,
        Prompt,
        Ranking,
        StepLabel,
        TrainingRun,
        UserSession,
        Webhook,
        WebhookDelivery,
    )
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.projects import projects
    from app.quality import upkeep

    now = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as db:
        admin = users.create_user(db, "admin@example.org", PASSWORD, "admin", name="Ada")
        lead = users.create_user(db, "lead@example.org", PASSWORD, "lead", name="Lee")
        people = [users.create_user(db, f"ann{i}@example.org", PASSWORD, "annotator", name=f"Ann {i} ✓")
                  for i in range(2)]
        users.create_token(db, lead, "script")
        db.add(UserSession(token_hash="s" * 64, user_id=people[0].id, expires_at=now + timedelta(hours=12),
                           ip="10.0.0.7", user_agent="Firefox"))
        project = projects.create_project(db, lead, name="GSM8K é", completions_per_prompt=3, overlap=2,
                                          rubric_text="Correct answers first.", criteria=["Correctness", "Clarity"])
        project.lease_minutes, project.settings = 45, {"judge": {"temperature": 0.2}}
        for person in people:
            projects.add_member(db, project, lead, email=person.email, role="annotator")
        constitution = Constitution(project_id=project.id, version=1, author_id=lead.id,
                                    principles=[{"name": "honest", "rationale": "say so", "priority": 1}])
        db.add(constitution)
        db.flush()
        project.current_constitution_id = constitution.id
        endpoint = ModelEndpoint(name="vllm", base_url="http://10.0.0.5:8000/v1", model="qwen", api_key_stored="sk-test",
                                 allow_private=True, created_by_id=admin.id)
        judge = JudgeRun(project_id=project.id, constitution_id=constitution.id, name="judge 1",
                         params={"endpoint_id": 1}, state="succeeded", created_by_id=lead.id)
        db.add_all([endpoint, judge])
        db.flush()
        for i in range(4):
            prompt = Prompt(project_id=project.id, text=f"Q{i}: what is {i} × 7?", text_hash=f"{i:064x}",
                            split="heldout" if i == 3 else "train", reference=str(7 * i), meta={"row": i},
                            messages=[{"role": "user", "content": f"what is {i} × 7?"}])
            db.add(prompt)
            db.flush()
            texts = [str(7 * i), f"{7 * i} (I think)", "no idea"]
            completions = [Completion(prompt_id=prompt.id, text=t, source="sampled", generator_name="qwen",
                                      generator_params={"temperature": 0.8}, seed=j,
                                      steps=t.split(" ") if i == 0 else None) for j, t in enumerate(texts)]
            db.add_all(completions)
            db.flush()
            ids = [c.id for c in completions]
            if i == 0:
                prompt.gold_tiers = [[ids[0]], [ids[1]], [ids[2]]]
            for person in people:
                db.add(Assignment(project_id=project.id, prompt_id=prompt.id, annotator_id=person.id,
                                  state="submitted", leased_until=now, completed_at=now))
                human = Ranking(project_id=project.id, prompt_id=prompt.id, source="human", annotator_id=person.id,
                                rubric_id=project.current_rubric_id, tiers=[[ids[0]], [ids[1], ids[2]]],
                                display_order=ids[::-1], flags={str(ids[2]): ["off-topic"]}, seconds_spent=14.0,
                                client_submission_id=f"sub-{i}-{person.id}")
                _rank(db, human, Pair, expand_tiers)
                if i == 0:  # step labels (0010): the first answer right, the second wrong at its first step
                    db.add_all([StepLabel(ranking_id=human.id, completion_id=ids[0], step_index=0, label=1),
                                StepLabel(ranking_id=human.id, completion_id=ids[1], step_index=0, label=-1)])
            _rank(db, Ranking(project_id=project.id, prompt_id=prompt.id, source="ai", judge_run_id=judge.id,
                              constitution_id=constitution.id, tiers=[[ids[0]], [ids[1]], [ids[2]]],
                              meta={"method": "pairwise", "confidence": 0.8}), Pair, expand_tiers,
                  meta={"p_ab": 0.9, "p_ba": 0.2})
        # Monte-Carlo step labels (0017): a run's ranking of source mc, its step labels with the share right, no pairs.
        mc_run = JudgeRun(project_id=project.id, name="Monte-Carlo steps", params={"method": "monte_carlo", "n": 8},
                          state="succeeded", created_by_id=lead.id)
        db.add(mc_run)
        db.flush()
        mc = Ranking(project_id=project.id, prompt_id=prompt.id, source="mc", judge_run_id=mc_run.id, tiers=[],
                     display_order=ids, meta={"method": "monte_carlo"})
        db.add(mc)
        db.flush()
        db.add_all([StepLabel(ranking_id=mc.id, completion_id=ids[0], step_index=0, label=1, p=0.75),
                    StepLabel(ranking_id=mc.id, completion_id=ids[1], step_index=0, label=-1, p=0.0)])
        # A task still being ranked, with a draft kept on the server (0008).
        leased = Assignment(project_id=project.id, prompt_id=prompt.id, annotator_id=lead.id, state="leased",
                            leased_until=now + timedelta(minutes=45))
        db.add(leased)
        db.flush()
        db.add(AssignmentDraft(assignment_id=leased.id, tiers=[[ids[2]], [ids[0]]], flags={str(ids[1]): ["unsafe"]},
                               seconds_spent=5.5, edited_at=now, saved_at=now, step_labels={str(ids[0]): [1, None]}))
        job = Job(kind="export", project_id=project.id, payload={"export_id": 1}, state="succeeded", progress=1.0,
                  attempts=1, log_path="/srv/preflab/jobs/1.log", result={"rows": 30}, created_by_id=lead.id,
                  started_at=now, finished_at=now)
        db.add(job)
        db.flush()
        export = Export(project_id=project.id, kind="pairs", format="jsonl", filters={"source": ["human"]},
                        row_count=30, row_counts={"source.human": 30}, sha256="0" * 64, files={"pairs.jsonl": "1" * 64},
                        path="/srv/preflab/exports/1", snapshot="812:812:", job_id=job.id, created_by_id=lead.id)
        db.add(export)
        db.flush()
        # reward: a kind every revision allows (0007's downgrade refuses the kinds it added, by design).
        db.add(TrainingRun(project_id=project.id, kind="reward", config={"epochs": 1}, export_id=export.id,
                           metrics_path="/srv/preflab/runs/1/metrics.jsonl", model_dir="/srv/preflab/runs/1/model",
                           state="succeeded", job_id=job.id, created_by_id=lead.id))
        db.add(AuditEvent(actor_id=lead.id, project_id=project.id, action="export.create", object_type="export",
                          object_id=export.id, data={"rows": 30}, ip="10.0.0.7"))
        # The agreement figures as the rollup job stored them (0013).
        db.add(ProjectRollup(project_id=project.id, reports={"all": {"project_id": project.id, "human_rankings": 6}},
                               counts={"prompts": 2, "pairs": 30}, rankings=6, seconds=0.25, computed_at=now))
        # The agreement figures kept as rankings arrive (0018): the rankings above folded in, one change waiting.
        upkeep.drain(db, project)
        db.add(AgreementMark(project_id=project.id, prompt_id=prompt.id, round=1))
        # A Ray cluster an admin configured, capped, with a token stored (0020).
        db.add(ComputeCluster(name="lab", kind="ray", address="http://ray-head:8265", shared_dir="/shared/preflab",
                              resources={"cpus": 4}, env={"HF_HOME": "/shared/hf"}, job_prefix="preflab",
                              max_running=2, secret_stored="fernet:gAAAA-not-a-real-token", created_by_id=lead.id,
                              created_at=now, updated_at=now))
        # A webhook, one delivery that took a retry, and its job waiting out a backoff (0011).
        hook = Webhook(project_id=project.id, url="https://hooks.example.org/preflab", events=["export.ready"],
                       secret_stored="fernet:gAAAA-not-a-real-token", allow_private=False, created_by_id=lead.id,
                       created_at=now)
        db.add(hook)
        db.flush()
        retry = Job(kind="webhook_delivery", project_id=project.id, payload={"delivery_id": 1}, state="queued",
                    attempts=1, max_attempts=6, error="HTTP 500", run_after=now + timedelta(seconds=30))
        db.add(retry)
        db.flush()
        db.add(WebhookDelivery(webhook_id=hook.id, uid="7f8e6a52-3c1d-4b8e-9d1a-0c2b3e4f5a6b", event="export.ready",
                               payload={"event": "export.ready", "data": {"export_id": export.id}}, state="pending",
                               attempts=1, status_code=500, error="HTTP 500: oops", job_id=retry.id, created_at=now,
                               log=[{"attempt": 1, "at": now.isoformat(), "status_code": 500, "error": "HTTP 500",
                                     "seconds": 0.02}]))
    engine.dispose()


def _rank(db: Any, ranking: Any, pair_model: Any, expand: Any, meta: dict | None = None) -> None:
    db.add(ranking)
    db.flush()
    db.add_all([pair_model(ranking_id=ranking.id, prompt_id=ranking.prompt_id, chosen_id=s.chosen,
                           rejected_id=s.rejected, margin=s.margin, source=ranking.source, meta=meta or {},
                           p=0.85 if ranking.source == "ai" else 1.0) for s in expand(ranking.tiers)])


def contents(url: str) -> dict[str, dict[tuple, dict[str, Any]]]:
    """Every table's rows by primary key, each as {column: value}, read by reflection (no model involved)."""
    engine = create_engine(url)
    meta = MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        out = {}
        for name, table in meta.tables.items():
            if name == "alembic_version":
                continue
            keys = list(table.primary_key.columns)
            out[name] = {tuple(row[k.name] for k in keys): dict(row)
                         for row in conn.execute(select(table)).mappings()}
    engine.dispose()
    return out


def test_the_seed_fills_every_table(empty_url: str) -> None:
    upgrade(empty_url)
    seed(empty_url)
    empty = sorted(name for name, rows in contents(empty_url).items() if not rows)
    assert not empty, (f"no seed rows for {', '.join(empty)}: add some to seed() in {Path(__file__).name}, so "
                       "each revision's upgrade is tested with data in these tables")


@pytest.mark.parametrize(("previous", "revision"), STEPS, ids=[f"{a}-to-{b}" for a, b in STEPS])
def test_each_revision_upgrades_a_full_database_without_losing_a_value(empty_url: str, previous: str,
                                                                       revision: str) -> None:
    upgrade(empty_url)
    seed(empty_url)
    downgrade(empty_url, previous)
    before = contents(empty_url)
    assert len(before["pairs"]) >= 20 and len(before["rankings"]) >= 10  # there really is data to lose
    upgrade(empty_url, revision)
    after = contents(empty_url)
    for table, rows in before.items():
        if (revision, table) in MOVED:
            MOVED[(revision, table)](rows, after)
            continue
        assert table in after, f"{revision} dropped table {table}"
        assert after[table].keys() == rows.keys(), f"{revision} lost or added rows in {table}"
        for key, row in rows.items():
            kept = {column: after[table][key][column] for column in row}
            assert kept == row, f"{revision} changed {table} row {key}"


def _seconds_in_totals(rows: dict[tuple, dict[str, Any]], after: dict[str, dict[tuple, dict[str, Any]]]) -> None:
    """0022: each agreement_seconds row (a key's tenth) is that key's entry in agreement_totals.seconds."""
    assert rows, "no histogram to move"
    for (project_id, version, kind, key, tenth), row in rows.items():
        kept = after["agreement_totals"][(project_id, version, kind, key)]["seconds"] or {}
        assert kept.get(str(tenth), 0) == row["n"], f"0022 lost seconds of {kind}:{key} at tenth {tenth}"
    moved = sum(len(t["seconds"] or {}) for t in after["agreement_totals"].values())
    assert moved == sum(1 for r in rows.values() if r["n"] > 0), "0022 added tenths no row had"


MOVED = {("0022", "agreement_seconds"): _seconds_in_totals}
"""(revision, table) → the check that the revision moved the table's rows elsewhere, whole."""


def _module_docstring_and_downgrade(path: Path) -> tuple[str, list[ast.stmt] | None]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    body = next((node.body for node in tree.body if isinstance(node, ast.FunctionDef) and node.name == "downgrade"),
                None)
    return ast.get_docstring(tree) or "", body


@pytest.mark.parametrize("path", sorted((MIGRATIONS_DIR / "versions").glob("*.py")), ids=lambda p: p.stem)
def test_every_revision_has_a_downgrade_or_says_why_not(path: Path) -> None:
    docstring, body = _module_docstring_and_downgrade(path)
    empty = body is None or all(isinstance(s, ast.Pass) or (isinstance(s, ast.Expr) and isinstance(
        s.value, ast.Constant)) for s in body)
    assert not empty or "No downgrade:" in docstring, (
        f"{path.name}: give it a downgrade(), or say in its docstring `No downgrade: <why>`")
    assert "Downgrade:" in docstring or "No downgrade:" in docstring, (
        f"{path.name}: its docstring must say what a downgrade keeps and loses (`Downgrade: …`)")
