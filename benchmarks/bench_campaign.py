"""A lead's pages on a campaign-sized project, and whether a lead slows the annotators.

The database is rebuilt and seeded by benchmarks/seed_campaign.py (`--rankings` human rankings, 3 per prompt, K=4, 200
annotators, gold, three rubric versions, a judge run) plus open prompts for annotators to draw from. One server
process (uvicorn, as `preflab serve` runs it) and one `preflab worker` are started against it; the bench waits for the
kept agreement figures and for the project's rollup of counts and judge figures, which the first project view queues
(both times and the worker's peak RSS are reported). Then, for each page, `--views` sequential views by a logged-in
lead after two warm-ups: p50/p95/max and the server's RSS after them. Last, side by side in one run: 32 annotators
doing next → submit without think time, alone and then beside 5 leads reloading the agreement page in a loop, in turn
`--rounds` times (`--seconds` measured per side in all); the p95 rise of next and submit over the pooled turns, and
each side's CPU seconds (server, worker, every Postgres process, the load generator), which say what the leads' views
and the worker's upkeep of the figures cost. Then 20 rankings submitted through the API one at a time, each followed
by the lead's agreement API every 0.1 s until the figures count it: the time from submit to visible.

Last, once nothing waits to be folded in, the kept figures of every scope are compared with a recomputation from the
rankings table (to 1e-9).

Budget, checked at the end (the last JSON line; the exit status is 1 when it is missed): the leads raise the
annotators' p95 of next and of submit by at most `--max-rise-pct` (10 %), every ranking is visible in the figures
within `--max-visible-s` (10 s) of its submit, and the kept figures equal the recomputation.

    PREFLAB_BENCH_DATABASE_URL=postgresql://postgres@127.0.0.1:5432/preflab_campaign \\
        .venv/bin/python benchmarks/bench_campaign.py --rankings 1000000 [--views 20] [--seconds 40] [--rounds 8] \\
        [--template preflab_campaign_1m]

Prints one JSON line per page, one for the rollup, one for the side-by-side (and the machine's load average), one
for submit-to-visible, one for the figures check and one for the budget.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from _http import KeepAliveClient  # noqa: E402
from bench_annotation import SECRET, _ms, _percentile, check_database, load, start_server  # noqa: E402
from seed_campaign import PASSWORD, seed_campaign  # noqa: E402

from app.quality.rollups import COUNT_LIVE_LIMIT  # noqa: E402

DEFAULT_URL = "postgresql://postgres@127.0.0.1:5432/preflab_campaign"
LEAD = "lead@campaign.example"
PAGES = (("agreement_page", "/projects/{id}/agreement"), ("agreement_api", "/api/projects/{id}/agreement"),
         ("project_page", "/projects/{id}"), ("exports_page", "/projects/{id}/exports"),
         ("judge_page", "/projects/{id}/judge"), ("training_page", "/projects/{id}/training"))
LEADS = 5
ANNOTATORS = 32


def _rss_mb(pid: int, key: str = "VmRSS") -> float:
    """A process's resident memory (VmRSS) or its peak (VmHWM), in MB, from /proc."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return round(int(line.split()[1]) / 1024, 1)
    return float("nan")


def _login(base: str) -> httpx.Client:
    client = httpx.Client(base_url=base, timeout=120, follow_redirects=False)
    token = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', client.get("/login").text)
    assert token, "no CSRF token on the login page"
    r = client.post("/login", data={"email": LEAD, "password": PASSWORD, "csrf_token": token.group(1)})
    assert r.status_code == 303, f"login failed: {r.status_code}"
    return client


def _wait_for_rollup(client: httpx.Client, url: str, project_id: int, deadline_s: float,
                     rollup: bool) -> tuple[float, float | None]:
    """Seconds until the agreement API answers 200 (the kept figures are there), and until the project's rollup of
    counts and judge figures is stored (the project page queues it; `rollup` False: a project small enough to be
    counted on each view has none, None): the pages are then timed as they answer every day, not while a large
    project's first rollup is computed on the view."""
    from sqlalchemy import create_engine, text

    t0 = time.perf_counter()
    figures, queued = None, False
    engine = create_engine(url)
    try:
        while time.perf_counter() - t0 < deadline_s:
            if figures is None:
                r = client.get(f"/api/projects/{project_id}/agreement")
                assert r.status_code in (200, 503), f"agreement API: {r.status_code} {r.text[:200]}"
                figures = time.perf_counter() - t0 if r.status_code == 200 else None
            if figures is not None and not rollup:
                return figures, None
            if figures is not None:
                if not queued:  # the project page queues the rollup of counts (it counts live until then)
                    queued = client.get(f"/projects/{project_id}").status_code == 200
                with engine.connect() as conn:
                    if conn.execute(text("SELECT count(*) FROM project_rollups WHERE project_id = :p"),
                                    {"p": project_id}).scalar_one():
                        return figures, time.perf_counter() - t0
            time.sleep(1.0)
    finally:
        engine.dispose()
    raise RuntimeError(f"no rollup after {deadline_s:.0f} s: is the worker running?")


def measure_pages(client: httpx.Client, project_id: int, server_pid: int, views: int, rankings: int
                  ) -> list[dict[str, Any]]:
    out = []
    for name, path in PAGES:
        url = path.format(id=project_id)
        for _ in range(2):
            client.get(url)
        lat, statuses = [], set()
        for _ in range(views):
            t0 = time.perf_counter()
            r = client.get(url)
            lat.append(time.perf_counter() - t0)
            statuses.add(r.status_code)
        line = {"bench": "campaign", "page": name, "rankings": rankings, "views": views,
                "p50_ms": round(_percentile(lat, 0.5) * 1e3, 1), "p95_ms": round(_percentile(lat, 0.95) * 1e3, 1),
                "max_ms": round(max(lat) * 1e3, 1), "status": sorted(statuses),
                "server_rss_mb": _rss_mb(server_pid), "server_peak_rss_mb": _rss_mb(server_pid, "VmHWM")}
        if name == "agreement_api":
            body = r.json()
            line |= {"computed": body.get("computed"), "age_s": body.get("age_seconds")}
        out.append(line)
    return out


async def _leads_reloading(base: str, cookies: httpx.Cookies, project_id: int, until: float,
                           lat: list[float]) -> None:
    """5 leads reloading the agreement page until `until`; each view's time is appended to `lat`."""
    # The annotators' lean client, with the lead's session cookie: httpx in this process would spend ~5 ms of the
    # shared cores per view (more on a 120 kB page), in the event loop that times the annotators.
    cookie = "; ".join(f"{name}={value}" for name, value in cookies.items())

    async def lead() -> None:
        async with KeepAliveClient(base, headers={"Cookie": cookie}, timeout=120) as http:
            while time.perf_counter() < until:
                t0 = time.perf_counter()
                r = await http.request("GET", f"/projects/{project_id}/agreement")
                lat.append(time.perf_counter() - t0)
                assert r.status_code == 200, f"agreement page: {r.status_code}"

    await asyncio.gather(*(lead() for _ in range(LEADS)))


async def _side(base: str, project_id: int, tokens: list[str], seconds: float, warmup: float,
                cookies: httpx.Cookies | None, run_id: str, raw: dict[str, list[float]]) -> dict[str, Any]:
    """One turn of one side: the annotators (with the leads, given their cookies); latencies also go to `raw`."""
    annotators = load(base, project_id, tokens, warmup=warmup, seconds=seconds, run_id=run_id, raw=raw)
    if cookies is None:
        return await annotators
    leads = _leads_reloading(base, cookies, project_id, time.perf_counter() + warmup + seconds, raw["lead"])
    result, _ = await asyncio.gather(annotators, leads)
    return result


def _cpu_s(pid: int) -> float:
    """A process's CPU time so far (user + system, its threads included), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_cpu_s() -> float:
    """CPU time of every Postgres process on this host (the server shares the cores with the bench)."""
    total = 0.0
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == "postgres":
                total += _cpu_s(int(proc.name))
        except (OSError, IndexError):  # gone meanwhile
            continue
    return total


def _cpu(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds so far of the named processes, of Postgres and of this process (the load generator)."""
    return {name: _cpu_s(pid) for name, pid in pids.items()} | {"postgres": _postgres_cpu_s(),
                                                                "load_generator": sum(os.times()[:2])}


def _now() -> Any:
    from app.models import utcnow

    return utcnow()


def _rollups_between(url: str, start: Any, end: Any) -> int:
    """Rollup jobs the worker ran (even partly) in [start, end]: the CPU the leads' views cost beside the server."""
    from sqlalchemy import create_engine, text

    engine = create_engine(url)
    with engine.connect() as conn:
        n = conn.execute(text("SELECT count(*) FROM jobs WHERE kind = 'project_rollup' AND started_at < :end"
                              " AND (finished_at IS NULL OR finished_at > :start)"),
                         {"start": start, "end": end}).scalar_one()
    engine.dispose()
    return int(n)


def side_by_side(base: str, client: httpx.Client, project_id: int, tokens: list[str], seconds: float,
                 rankings: int, url: str, rounds: int, pids: dict[str, int]) -> dict[str, Any]:
    """32 annotators alone, then beside the leads, in turn `rounds` times (`seconds` / `rounds` measured each, after
    a 2 s warm-up); the rise compares each side's latencies pooled over its turns. In turn, because this machine's
    speed drifts by ±10 % within minutes: one turn per side put the drift into the rise (+1 to +47 % for the same
    code). Two sets of 32 annotators, one per side, and every turn's submission ids its own (a repeated id is an
    idempotent resend)."""
    sides = {"alone": (tokens[:ANNOTATORS], None), "with_leads": (tokens[ANNOTATORS:], client.cookies)}
    raw = {side: {"next": [], "submit": [], "lead": []} for side in sides}
    turns: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
    cpu: dict[str, dict[str, float]] = {side: {} for side in sides}
    for turn in range(rounds):
        for side, (people, cookies) in sides.items():
            start, before = _now(), _cpu(pids)
            run = asyncio.run(_side(base, project_id, people, seconds / rounds, 2.0, cookies, f"{side}{turn}-",
                                    raw[side]))
            for name, used in _cpu(pids).items():  # warm-up included: the CPU of the whole turn
                cpu[side][name] = cpu[side].get(name, 0.0) + used - before[name]
            turns[side].append(run | {"rollup_jobs_running": _rollups_between(url, start, _now())})
    alone, with_leads = (_pooled(turns[side], raw[side], seconds) | {"cpu_s": _rounded(cpu[side])} for side in sides)

    def rise(a: float, b: float) -> float | None:
        return round(100 * (b - a) / a, 1) if a else None

    return {"bench": "campaign", "case": "leads_beside_annotators", "rankings": rankings, "annotators": ANNOTATORS,
            "leads": LEADS, "seconds": seconds, "rounds": rounds, "alone": alone, "with_leads": with_leads,
            "p95_rise_pct": {key: rise(alone[key]["p95_ms"], with_leads[key]["p95_ms"])
                             for key in ("next", "submit")},
            "p95_rise_pct_per_round": {key: [rise(a[key]["p95_ms"], b[key]["p95_ms"])
                                             for a, b in zip(turns["alone"], turns["with_leads"], strict=True)]
                                       for key in ("next", "submit")}}


def _rounded(cpu: dict[str, float]) -> dict[str, float]:
    return {name: round(seconds, 2) for name, seconds in cpu.items()}


def _human_rankings(engine: Any, project_id: int) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM rankings WHERE project_id = :p AND source = 'human'"),
                                {"p": project_id}).scalar_one())


def submit_to_visible(client: httpx.Client, base: str, database_url: str, project_id: int, token: str, n: int,
                      deadline_s: float) -> dict[str, Any]:
    """`n` rankings submitted one at a time by one annotator through the API; after each, the lead's agreement API
    every 0.1 s until its count of human rankings reaches the database's: seconds from the submit's answer to that
    view."""
    from sqlalchemy import create_engine

    engine = create_engine(database_url)
    api = httpx.Client(base_url=base, timeout=60, headers={"Authorization": f"Bearer {token}"})
    url = f"/api/projects/{project_id}/agreement"
    seen, errors = [], 0
    try:
        for i in range(n):
            task = api.get(f"/api/projects/{project_id}/tasks/next")
            if task.status_code != 200:
                errors += 1
                continue
            body = task.json()
            r = api.post(f"/api/projects/{project_id}/rankings", json={
                "assignment_id": body["assignment_id"], "tiers": [[c["id"]] for c in body["completions"]],
                "rubric_version": body["rubric"]["version"], "submission_id": f"visible-{i}", "seconds_spent": 5.0})
            if r.status_code != 201:
                errors += 1
                continue
            t0 = time.perf_counter()
            written = _human_rankings(engine, project_id)
            while (waited := time.perf_counter() - t0) < deadline_s:
                view = client.get(url)
                if view.status_code == 200 and view.json()["human_rankings"] >= written:
                    break
                time.sleep(0.1)
            seen.append(waited)
    finally:
        api.close()
        engine.dispose()
    return {"bench": "campaign", "case": "submit_to_visible", "submits": n, "errors": errors,
            "p50_s": round(_percentile(seen, 0.5), 2) if seen else None,
            "p95_s": round(_percentile(seen, 0.95), 2) if seen else None,
            "max_s": round(max(seen), 2) if seen else None, "load_avg": os.getloadavg()}


def budget(side: dict[str, Any], visible: dict[str, Any], max_rise_pct: float, max_visible_s: float,
           same: dict[str, Any] | None = None) -> dict[str, Any]:
    """The run's budget, each figure with its limit and whether it was met (and, given the figures check, whether the
    kept figures equal the recomputation)."""
    checks = {f"{key}_p95_rise_pct": (side["p95_rise_pct"][key], max_rise_pct) for key in ("next", "submit")}
    checks["submit_to_visible_max_s"] = (visible["max_s"], max_visible_s)
    out = {name: {"value": value, "limit": limit, "met": value is not None and value <= limit}
           for name, (value, limit) in checks.items()}
    out["submit_to_visible_errors"] = {"value": visible["errors"], "limit": 0, "met": visible["errors"] == 0}
    if same is not None:
        out["figures_equal_recomputation"] = {"value": len(same["differences"]), "limit": 0, "met": same["equal"]}
    return {"bench": "campaign", "case": "budget", "rankings": side["rankings"], "checks": out,
            "met": all(c["met"] for c in out.values())}


def _pooled(turns: list[dict[str, Any]], raw: dict[str, list[float]], seconds: float) -> dict[str, Any]:
    """One side's figures over all its turns."""
    errors: dict[str, int] = {}
    for run in turns:
        for key, n in run["errors"].items():
            errors[key] = errors.get(key, 0) + n
    made = sum(run["rankings"] for run in turns)
    out = {"rankings": made, "rankings_per_s": round(made / seconds, 1),
           "rankings_per_s_per_round": [run["rankings_per_s"] for run in turns],
           "next": _ms(raw["next"]), "submit": _ms(raw["submit"]), "errors": errors,
           "rollup_jobs_running": sum(run["rollup_jobs_running"] for run in turns)}
    return out | ({"lead_agreement_views": _ms(raw["lead"])} if raw["lead"] else {})


def _check(url: str, project_id: int) -> dict[str, int]:
    """bench_annotation's database check; gold prompts are served to every annotator past the overlap by design,
    so the prompts over their overlap are also counted without them."""
    from sqlalchemy import create_engine, text

    out = check_database(url, project_id, 3)
    engine = create_engine(url)
    with engine.connect() as conn:
        out["over_ranked_non_gold_prompts"] = conn.execute(text(
            "SELECT count(*) FROM (SELECT r.prompt_id FROM rankings r JOIN prompts p ON p.id = r.prompt_id"
            " WHERE r.project_id = :p AND r.annotator_id IS NOT NULL AND NOT r.skipped AND p.gold_tiers IS NULL"
            " GROUP BY r.prompt_id, r.round HAVING count(*) > 3) x"), {"p": project_id}).scalar_one()
    engine.dispose()
    return out


def _differences(a: Any, b: Any, path: str, out: list[str]) -> None:
    """Where two reports differ: floats beyond 1e-9 relative (the same terms summed in another order), else any."""
    import dataclasses
    import math

    if len(out) >= 10:
        return
    if dataclasses.is_dataclass(a) and dataclasses.is_dataclass(b):
        for f in dataclasses.fields(a):
            _differences(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", out)
    elif isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            out.append(f"{path}: keys differ")
            return
        for key in a:
            _differences(a[key], b[key], f"{path}[{key!r}]", out)
    elif isinstance(a, list | tuple) and isinstance(b, list | tuple):
        if len(a) != len(b):
            out.append(f"{path}: {len(a)} != {len(b)} items")
            return
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _differences(x, y, f"{path}[{i}]", out)
    elif isinstance(a, float) and isinstance(b, float):
        if not math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12):
            out.append(f"{path}: {a!r} != {b!r}")
    elif a != b:
        out.append(f"{path}: {a!r} != {b!r}")


def figures_check(url: str, project_id: int, deadline_s: float = 120.0) -> dict[str, Any]:
    """Once nothing waits to be folded in, the kept figures of every scope (all rubric versions, and each) against a
    recomputation from the rankings table (`agreement.project_reports`, one streamed pass over every ranking), with
    the project's drain lock held so the figures cannot move meanwhile."""
    from app.models import Project
    from app.platform.db import make_engine, make_session_factory, session_scope
    from app.quality import agreement, kept_report, upkeep

    engine = make_engine(url)
    t0 = time.perf_counter()
    try:
        with session_scope(make_session_factory(engine)) as db:
            while upkeep.waiting(db, project_id, 1):
                if time.perf_counter() - t0 > deadline_s:
                    raise RuntimeError(f"changes still waiting to be folded in after {deadline_s:.0f} s")
                db.rollback()
                time.sleep(0.2)
            state = upkeep.lock(db, project_id)
            project = db.get(Project, project_id)
            versions = agreement.rubric_versions(db, project)
            started = time.perf_counter()
            expected = agreement.project_reports(db, project, versions=versions)
            seconds = time.perf_counter() - started
            differences: list[str] = []
            for version in [None, *versions]:
                _differences(kept_report.report(db, project, version, versions, state), expected[version],
                             f"v{version or 'all'}", differences)
            rankings = expected[None].human_rankings
            db.rollback()
    finally:
        engine.dispose()
    return {"bench": "campaign", "case": "figures_equal_recomputation", "human_rankings": rankings,
            "scopes": 1 + len(versions), "recompute_s": round(seconds, 1), "equal": not differences,
            "differences": differences}


def _tokens(url: str, n: int) -> list[str]:
    from sqlalchemy import select

    from app.accounts import users
    from app.models import User
    from app.platform.db import make_engine, make_session_factory, session_scope

    engine = make_engine(url)
    with session_scope(make_session_factory(engine)) as db:
        people = list(db.scalars(select(User).where(User.role == "annotator").order_by(User.id).limit(n)))
        tokens = [users.create_token(db, p)[1] for p in people]
    engine.dispose()
    return tokens


def _seeded(url: str, args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """Seed a fresh database, or copy the template seeded with the same sizes (migrated to head after the copy)."""
    from _pg import database_from_template, fresh_database, save_as_template, template_comment

    sizes = {"rankings": args.rankings, "open_prompts": args.open_prompts}
    stored = template_comment(url, args.template) if args.template else None
    if stored:
        seeded = json.loads(stored)
        if seeded.get("requested") == sizes:
            return database_from_template(url, args.template), seeded | {"from_template": args.template}
    url = fresh_database(url)
    seeded = seed_campaign(url, args.rankings, open_prompts=args.open_prompts) | {"requested": sizes}
    if args.template:
        save_as_template(url, args.template, json.dumps(seeded))
    return url, seeded


def main() -> None:

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rankings", type=int, default=1_000_000)
    parser.add_argument("--views", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=40.0,
                        help="annotators' measured time per side of the side-by-side, over all its turns")
    parser.add_argument("--rounds", type=int, default=8,
                        help="turns of each side of the side-by-side, alone and beside the leads in turn")
    parser.add_argument("--open-prompts", type=int, default=20_000)
    parser.add_argument("--rollup-deadline", type=float, default=1800.0)
    parser.add_argument("--max-rise-pct", type=float, default=10.0,
                        help="budget: the most the leads may raise the annotators' p95 of next and of submit, in %%")
    parser.add_argument("--max-visible-s", type=float, default=10.0,
                        help="budget: the most seconds from a ranking's submit to the figures counting it")
    parser.add_argument("--template", metavar="DATABASE",
                        help="keep the seeded campaign as this Postgres database and start later runs from a copy of"
                             " it (seeding 1M rankings takes minutes; a copy seconds); reseeded if --rankings or"
                             " --open-prompts differ")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds: must be at least 1, not {args.rounds}")
    url, seeded = _seeded(os.environ.get("PREFLAB_BENCH_DATABASE_URL", DEFAULT_URL), args)
    print(json.dumps(seeded), flush=True)
    project_id = seeded["project_id"]
    tokens = _tokens(url, 2 * ANNOTATORS)
    with tempfile.TemporaryDirectory() as data_dir:
        server, base = start_server(url, 1, data_dir)
        env = os.environ | {"PREFLAB_DATABASE_URL": url, "PREFLAB_SECRET_KEY": SECRET, "PREFLAB_ENV": "dev",
                            "PREFLAB_DATA_DIR": data_dir}
        worker = subprocess.Popen([sys.executable, "-m", "app.cli", "worker"], cwd=REPO, env=env)
        try:
            client = _login(base)
            figures, counts = _wait_for_rollup(client, url, project_id, args.rollup_deadline,
                                               seeded["human_rankings"] > COUNT_LIVE_LIMIT)
            print(json.dumps({"bench": "campaign", "case": "first_rollup", "rankings": args.rankings,
                              "ready_after_s": round(figures, 1),
                              "counts_after_s": None if counts is None else round(counts, 1),
                              "worker_peak_rss_mb": _rss_mb(worker.pid, "VmHWM"), "load_avg": os.getloadavg()}),
                  flush=True)
            for line in measure_pages(client, project_id, server.pid, args.views, args.rankings):
                print(json.dumps(line), flush=True)
            result = side_by_side(base, client, project_id, tokens, args.seconds, args.rankings, url, args.rounds,
                                  {"server": server.pid, "worker": worker.pid})
            result["database_check"] = _check(url, project_id)
            result["worker_peak_rss_mb"] = _rss_mb(worker.pid, "VmHWM")
            result["server_peak_rss_mb"] = _rss_mb(server.pid, "VmHWM")
            result["load_avg"] = os.getloadavg()
            print(json.dumps(result), flush=True)
            visible = submit_to_visible(client, base, url, project_id, tokens[0], 20, 3 * args.max_visible_s)
            print(json.dumps(visible), flush=True)
            same = figures_check(url, project_id)
            print(json.dumps(same), flush=True)
            verdict = budget(result, visible, args.max_rise_pct, args.max_visible_s, same)
            print(json.dumps(verdict), flush=True)
        finally:
            for proc in (worker, server):
                proc.terminate()
                proc.wait(timeout=30)
    if not verdict["met"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
