"""The crash drill: annotators keep ranking against a real server process while it is SIGKILLed and restarted and
(Postgres) while every database connection is terminated. No acknowledged ranking may be lost or stored twice.

One `preflab serve` process on a free port, a migrated database and a project with K=4 and overlap 2; eight
annotator clients (threads, httpx, API tokens) loop next task → submit a strict order of the four completions with
a submission id, and send the same request again, same submission id, after a connection error or a 5xx. Every
201/200 answer is an acknowledged ranking. The kill lands once enough rankings are acknowledged and a submit is in
flight (a condition, never a sleep); a new server process starts on the same port and the clients carry on. On
Postgres, `pg_terminate_backend` then ends every connection to the database while the load continues: the same
server process must answer again within RECOVERY_DEADLINE_S.

Afterwards, from the database: every acknowledged ranking exists exactly once, under its submission id, with the
order sent and its K*(K-1)/2 pairs; no ranking exists that no client was told about; no prompt holds more rankings
or tasks than its overlap; on SQLite, `PRAGMA integrity_check` says ok. Timings print as one JSON line (`-s`).
"""

from __future__ import annotations

import json
import os
import random
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from sqlalchemy import insert, text
from sqlalchemy.engine import make_url

from app.annotation.pairs import expand_tiers
from app.models import Completion, Prompt
from app.platform.db import make_engine
from app.projects import projects
from tests.support.server import Server, wait_for

pytestmark = [pytest.mark.crash, pytest.mark.timeout(300)]

K, OVERLAP, PROMPTS, CLIENTS = 4, 2, 500, 8
BEFORE_KILL = 40
"""Rankings acknowledged before the server is killed."""
AFTER_RESTART = 40
"""Rankings acknowledged by the restarted server before the connections are terminated (or the drill ends)."""
AFTER_TERMINATE = 30
"""Rankings acknowledged after every database connection was terminated."""
START_DEADLINE_S = 90.0
"""A server process starts and answers /healthz/live within this (a busy shared machine is slow to import)."""
RECOVERY_DEADLINE_S = 15.0
"""After the connections are terminated, the same server acknowledges rankings and is ready again within this."""
CLIENT_RETRY_DEADLINE_S = 60.0
"""A client sends a request again for at most this long before the drill fails."""


# ------------------------------------------------------------------------------------------------
# the annotators


@dataclass
class Ack:
    annotator_id: int
    submission_id: str
    ranking_id: int
    prompt_id: int
    tiers: list[list[int]]
    status: int
    at: float


@dataclass
class Drill:
    """What the clients saw, shared between their threads (a lock guards every change)."""

    acks: list[Ack] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    """Answers no retry can fix (a 4xx, a malformed body): any one fails the drill."""
    retries: dict[str, int] = field(default_factory=dict)
    submits_in_flight: int = 0
    stop: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def acked(self) -> int:
        with self.lock:
            return len(self.acks)

    def acked_since(self, t: float) -> int:
        with self.lock:
            return sum(a.at >= t for a in self.acks)

    def count_retry(self, why: str) -> None:
        with self.lock:
            self.retries[why] = self.retries.get(why, 0) + 1

    def fail(self, what: str) -> None:
        with self.lock:
            self.unexpected.append(what)
        self.stop.set()


class GaveUp(Exception):
    pass


def _send(http: httpx.Client, drill: Drill, method: str, url: str, body: dict[str, Any] | None = None
          ) -> httpx.Response:
    """The request, sent again unchanged after a connection error or a 5xx (the server died, restarted, or lost its
    database connection): next-task returns the caller's own lease and submit is idempotent by submission id."""
    deadline = time.monotonic() + CLIENT_RETRY_DEADLINE_S
    delay = 0.02
    while True:
        try:
            r = http.request(method, url, json=body)
            if r.status_code < 500:
                return r
            why = f"{method} {r.status_code}"
        except httpx.TransportError as exc:
            why = f"{method} {type(exc).__name__}"
        drill.count_retry(why)
        if time.monotonic() > deadline:
            raise GaveUp(f"{method} {url}: still failing after {CLIENT_RETRY_DEADLINE_S:.0f} s ({why})")
        time.sleep(delay)
        delay = min(delay * 2, 0.5)  # no faster: while the server starts, the clients' retries share its CPU


def _annotate(base: str, project_id: int, token: str, annotator_id: int, k: int, drill: Drill) -> None:
    rng = random.Random(k)
    n = 0
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=10) as http:
        try:
            while not drill.stop.is_set():  # checked between rankings only: a submit is always seen through
                r = _send(http, drill, "GET", f"/api/projects/{project_id}/tasks/next")
                if r.status_code == 204:
                    drill.fail(f"client {k}: the queue ran dry (raise PROMPTS)")
                    return
                if r.status_code != 200:
                    drill.fail(f"client {k}: next task answered {r.status_code}: {r.text[:200]}")
                    return
                task = r.json()
                ids = [c["id"] for c in task["completions"]]
                rng.shuffle(ids)
                tiers = [[i] for i in ids]  # a strict order: K*(K-1)/2 pairs
                body = {"assignment_id": task["assignment_id"], "tiers": tiers, "submission_id": f"drill-{k}-{n}",
                        "rubric_version": task["rubric"]["version"], "seconds_spent": 1.0}
                n += 1
                with drill.lock:
                    drill.submits_in_flight += 1
                try:
                    s = _send(http, drill, "POST", f"/api/projects/{project_id}/rankings", body)
                finally:
                    with drill.lock:
                        drill.submits_in_flight -= 1
                out = s.json() if s.status_code in (200, 201) else {}
                if s.status_code not in (200, 201) or out.get("pairs_created") != K * (K - 1) // 2:
                    drill.fail(f"client {k}: submit {body['submission_id']} answered {s.status_code}: {s.text[:200]}")
                    return
                with drill.lock:
                    drill.acks.append(Ack(annotator_id, body["submission_id"], out["ranking_id"], task["prompt"]["id"],
                                          tiers, s.status_code, time.monotonic()))
        except GaveUp as exc:
            drill.fail(f"client {k}: {exc}")
        except Exception as exc:  # a thread's exception would vanish: fail the drill with it instead
            drill.fail(f"client {k}: {exc.__class__.__name__}: {exc}")


# ------------------------------------------------------------------------------------------------
# set-up and checks


def _seed(db, make_user, make_project, token_for) -> tuple[int, list[tuple[int, str]]]:  # type: ignore[no-untyped-def]
    """A project (K=4, overlap 2) with PROMPTS prompts and CLIENTS annotators; (project id, [(user id, token)])."""
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=K, overlap=OVERLAP)
    people = []
    for _ in range(CLIENTS):
        person = make_user(db, "annotator")
        projects.add_member(db, project, lead, email=person.email, role="annotator")
        people.append((person.id, token_for(db, person)))
    prompt_ids = db.scalars(insert(Prompt).returning(Prompt.id, sort_by_parameter_order=True), [
        {"project_id": project.id, "text": f"drill question {i}", "text_hash": f"drill-{project.id}-{i}",
         "split": "train"} for i in range(PROMPTS)]).all()
    db.execute(insert(Completion), [{"prompt_id": pid, "text": f"answer {j} to question {pid}"}
                                    for pid in prompt_ids for j in range(K)])
    project_id = project.id
    db.commit()
    return project_id, people


def _terminate_connections(database_url: str) -> int:
    """End every other connection to the drill's database (the server's pool included); how many there were."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            return len(conn.execute(text(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                " WHERE datname = current_database() AND pid <> pg_backend_pid()")).all())
    finally:
        engine.dispose()


def _stored(database_url: str, project_id: int) -> dict[str, Any]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as conn:
            rankings = conn.execute(text(
                "SELECT id, annotator_id, client_submission_id, prompt_id, tiers FROM rankings"
                " WHERE project_id = :p"), {"p": project_id}).all()
            pairs: dict[int, list[tuple[int, int]]] = {}
            for ranking_id, chosen, rejected in conn.execute(text(
                    "SELECT pairs.ranking_id, pairs.chosen_id, pairs.rejected_id FROM pairs"
                    " JOIN rankings r ON r.id = pairs.ranking_id WHERE r.project_id = :p"), {"p": project_id}):
                pairs.setdefault(ranking_id, []).append((chosen, rejected))
            over_ranked = conn.execute(text(
                "SELECT count(*) FROM (SELECT prompt_id FROM rankings WHERE project_id = :p"
                " GROUP BY prompt_id, round HAVING count(*) > :o) x"), {"p": project_id, "o": OVERLAP}).scalar_one()
            # Leases last 30 minutes: every task of the drill still holds its place in the prompt's overlap.
            over_assigned = conn.execute(text(
                "SELECT count(*) FROM (SELECT prompt_id FROM assignments WHERE project_id = :p"
                " AND state IN ('leased', 'submitted') GROUP BY prompt_id, round HAVING count(*) > :o) x"),
                {"p": project_id, "o": OVERLAP}).scalar_one()
    finally:
        engine.dispose()
    return {"rankings": rankings, "pairs": pairs, "over_ranked": over_ranked, "over_assigned": over_assigned}


def _tiers(value: Any) -> list[list[int]]:
    return json.loads(value) if isinstance(value, str) else value


def _check_every_ack_stored_once(drill: Drill, stored: dict[str, Any]) -> None:
    acks = {(a.annotator_id, a.submission_id): a for a in drill.acks}
    assert len(acks) == len(drill.acks), "a submission id was acknowledged twice"
    by_key: dict[tuple[int, str], list[Any]] = {}
    for row in stored["rankings"]:
        by_key.setdefault((row.annotator_id, row.client_submission_id), []).append(row)
    duplicates = {key: len(rows) for key, rows in by_key.items() if len(rows) > 1}
    assert not duplicates, f"stored more than once: {duplicates}"
    lost = sorted(set(acks) - set(by_key))
    assert not lost, f"{len(lost)} acknowledged rankings are missing: {lost[:10]}"
    # Clients see every submit through, so every ranking in the database was acknowledged to someone.
    unacknowledged = sorted(set(by_key) - set(acks))
    assert not unacknowledged, f"rankings stored that no client was told about: {unacknowledged[:10]}"
    assert len(stored["rankings"]) == len(acks)
    for key, ack in acks.items():
        (row,) = by_key[key]
        assert (row.id, row.prompt_id, _tiers(row.tiers)) == (ack.ranking_id, ack.prompt_id, ack.tiers), key
        expected = sorted((p.chosen, p.rejected) for p in expand_tiers(ack.tiers))
        assert len(expected) == K * (K - 1) // 2
        assert sorted(stored["pairs"].get(row.id, [])) == expected, f"pairs of ranking {row.id}"


def _sqlite_integrity(database_url: str) -> str:
    path = make_url(database_url).database
    conn = sqlite3.connect(path)
    try:
        return ";".join(row[0] for row in conn.execute("PRAGMA integrity_check"))
    finally:
        conn.close()


# ------------------------------------------------------------------------------------------------
# the drill


def test_no_acknowledged_ranking_is_lost_or_doubled_when_the_server_and_database_connections_die(
        database_url, db, make_user, make_project, token_for, tmp_path) -> None:
    postgres = database_url.startswith("postgresql")
    project_id, people = _seed(db, make_user, make_project, token_for)
    db.close()
    # No job worker runs in this drill: readiness is the database and the migrations.
    server = Server(database_url, tmp_path, START_DEADLINE_S, PREFLAB_WORKER_HEARTBEAT_MAX_AGE_S="0")
    drill = Drill()
    figures: dict[str, Any] = {"drill": "crash", "database": "postgres" if postgres else "sqlite",
                               "clients": CLIENTS, "k": K, "overlap": OVERLAP, "load_before": os.getloadavg()[0]}
    t_start = time.monotonic()
    figures["first_start_s"] = round(server.start(), 2)
    clients = [threading.Thread(target=_annotate, args=(server.base, project_id, token, user_id, k, drill),
                                daemon=True) for k, (user_id, token) in enumerate(people)]

    def unless_failed(condition: Callable[[], bool]) -> Callable[[], bool]:
        def check() -> bool:
            assert not drill.unexpected, drill.unexpected
            return condition()
        return check

    try:
        for c in clients:
            c.start()
        # 1. SIGKILL mid-load: enough rankings acknowledged, and a submit on its way.
        wait_for(f"{BEFORE_KILL} rankings and a submit in flight",
                  unless_failed(lambda: drill.acked() >= BEFORE_KILL and drill.submits_in_flight > 0),
                  timeout=60, every=0.001, detail=server.output)
        server.kill()
        figures["acked_at_kill"] = drill.acked()
        t_killed = time.monotonic()
        figures["restart_s"] = round(server.start(), 2)
        wait_for(f"{AFTER_RESTART} rankings from the restarted server",
                  unless_failed(lambda: drill.acked_since(t_killed) >= AFTER_RESTART), timeout=60,
                  detail=server.output)
        figures["first_ack_after_kill_s"] = round(min(a.at for a in drill.acks if a.at >= t_killed) - t_killed, 2)

        # 2. Postgres: every database connection terminated while the load goes on; the same process recovers.
        if postgres:
            pid = server.proc.pid  # type: ignore[union-attr]
            t_cut = time.monotonic()
            figures["connections_terminated"] = _terminate_connections(database_url)
            assert figures["connections_terminated"] > 0, "the server held no database connection to terminate"
            wait_for("/healthz/ready after the connections were terminated", server.ready,
                      timeout=RECOVERY_DEADLINE_S, every=0.05, detail=server.output)
            figures["ready_after_terminate_s"] = round(time.monotonic() - t_cut, 2)
            wait_for(f"{AFTER_TERMINATE} rankings after the connections were terminated",
                      unless_failed(lambda: drill.acked_since(t_cut) >= AFTER_TERMINATE),
                      timeout=max(1.0, t_cut + RECOVERY_DEADLINE_S - time.monotonic()), detail=server.output)
            figures["first_ack_after_terminate_s"] = round(
                min(a.at for a in drill.acks if a.at >= t_cut) - t_cut, 2)
            assert server.proc is not None and server.proc.pid == pid and server.proc.poll() is None, \
                "the server was restarted or died"
    finally:
        drill.stop.set()
        for c in clients:
            c.join(timeout=CLIENT_RETRY_DEADLINE_S + 15)
        server.stop()
    assert not any(c.is_alive() for c in clients), "a client never finished its last submit"
    assert not drill.unexpected, drill.unexpected

    stored = _stored(database_url, project_id)
    _check_every_ack_stored_once(drill, stored)
    assert (stored["over_ranked"], stored["over_assigned"]) == (0, 0), "a prompt went over its overlap"
    assert drill.retries, "no client saw the outage: the kill did not land mid-load"
    if not postgres:
        assert _sqlite_integrity(database_url) == "ok"
    figures.update(acked=len(drill.acks), lost=0, duplicates=0,
                   resubmits_answered_200=sum(a.status == 200 for a in drill.acks), retries=drill.retries,
                   seconds=round(time.monotonic() - t_start, 1), load_after=os.getloadavg()[0])
    print(json.dumps(figures))
