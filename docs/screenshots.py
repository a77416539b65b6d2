"""Takes the screenshots the README and the docs show, from the demo as a user sees it (`make screenshots`).

Seeds the demo on a throwaway SQLite database, serves it with a job worker beside it, has the two demo annotators
rank through the JSON API (one careful, one fast and led by the cards' order, so the agreement page has something
to flag), exports the pairs and trains a small reward model as the engineer would, then drives Debian's Chromium
(headless, never a downloaded browser) over the pages and writes the PNGs:

- `ranking.png`: an annotator's ranking page, with the rubric beside the task;
- `agreement.png`: the lead's agreement and quality page, flags included;
- `training-run.png`: the finished reward run's page with its curves.

    .venv/bin/python docs/screenshots.py [--out docs/img] [--chromium /usr/bin/chromium]
"""

from __future__ import annotations

import argparse
import io
import json
import logging
import os
import random
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from a checkout: the app and training packages are the tree's
    sys.path.insert(0, str(ROOT))

VIEWPORT = {"width": 1280, "height": 800}
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--no-first-run", "--disable-sync"]
REWARD_CONFIG = {"steps": 20, "batch_size": 8, "max_length": 64, "eval_every": 4, "lr": 5e-5}
"""A reward run small enough for a laptop's CPU, long enough to draw curves."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, done: Callable[[], Any], timeout_s: float) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        result = done()
        if result:
            return result
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not done after {timeout_s:.0f} s")


@contextmanager
def demo_server(data_dir: Path) -> Iterator[tuple[Any, str, dict[str, str], int]]:
    """The demo on SQLite under `data_dir`, served on a free port with a worker: (app, base URL, passwords, project)."""
    import uvicorn

    from app.demo.seed import setup_demo
    from app.main import create_app
    from app.platform.settings import Settings
    from app.worker import Worker

    settings = Settings(env="demo", database_url=f"sqlite:///{data_dir}/demo.db", data_dir=data_dir,
                        secret_key="screenshots-" + "s" * 40)
    accounts, project_id = setup_demo(settings)
    app = create_app(settings)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    serving = threading.Thread(target=server.run, daemon=True)
    serving.start()
    worker = Worker(settings, session_factory=app.state.session_factory, poll_s=0.3, heartbeat_s=1.0)
    working = threading.Thread(target=worker.run, daemon=True)
    working.start()
    try:
        _wait("the server", lambda: server.started, 30)
        yield app, f"http://127.0.0.1:{port}", {email: password for _, email, password in accounts}, project_id
    finally:
        worker.terminating = True
        server.should_exit = True
        working.join(timeout=60)
        serving.join(timeout=15)
        app.state.engine.dispose()


def _api(app: Any, base: str, email: str) -> Any:
    import httpx

    from app.accounts import users

    with app.state.session_factory() as db:
        _, token = users.create_token(db, users.get_by_email(db, email), name="screenshots")
        db.commit()
    return httpx.Client(base_url=f"{base}/api/v1", headers={"Authorization": f"Bearer {token}"}, timeout=60)


def _correct_by_text() -> dict[str, bool]:
    """Each demo solution's text → whether its final answer is right (GSM8K's own judgement, shipped with it)."""
    from app.demo.seed import DEMO_DATA

    known: dict[str, bool] = {}
    for line in DEMO_DATA.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        known.update(zip(row["completions"], row["metadata"]["is_correct"], strict=True))
    return known


def rank(app: Any, base: str, project_id: int, tasks: int = 36) -> None:
    """annotator1 reads: right answers first, 40–90 s a task. annotator2 skims: the cards' order, 2–4 s a task."""
    from sqlalchemy import update

    from app.models import Ranking

    correct, rng, seconds_of = _correct_by_text(), random.Random(0), {}
    for email in ("annotator1@example.org", "annotator2@example.org"):
        api, careful = _api(app, base, email), email.startswith("annotator1")
        for n in range(tasks):
            answer = api.get(f"/projects/{project_id}/tasks/next")
            if answer.status_code == 204:
                break
            task = answer.json()
            shown = [c["id"] for c in task["completions"]]
            if careful:
                order = sorted(shown, key=lambda cid: (not correct.get(_text(task, cid), False), rng.random()))
                seconds = rng.uniform(40, 90)
            else:
                order = shown if rng.random() < 0.8 else rng.sample(shown, len(shown))
                seconds = rng.uniform(2, 4)
            body = {"assignment_id": task["assignment_id"], "tiers": [[cid] for cid in order],
                    "rubric_version": task["rubric"]["version"], "submission_id": f"{email}-{n}"}
            answer = api.post(f"/projects/{project_id}/rankings", json=body)
            answer.raise_for_status()
            seconds_of[answer.json()["ranking_id"]] = round(seconds, 1)
    # The server records no more time than the task was held, and a script holds it for milliseconds: the time is
    # set afterwards to what a reader and a skimmer take, so the speed figures show the difference.
    with app.state.session_factory() as db:
        for ranking_id, seconds in seconds_of.items():
            db.execute(update(Ranking).where(Ranking.id == ranking_id).values(seconds_spent=seconds))
        db.commit()


def _text(task: dict[str, Any], completion_id: int) -> str:
    return next(c["text"] for c in task["completions"] if c["id"] == completion_id)


def train_reward_model(app: Any, base: str, project_id: int) -> int:
    """The engineer's path: a pairs export, then a small reward run on it; the finished run's id."""
    api = _api(app, base, "engineer@example.org")
    export = api.post(f"/projects/{project_id}/exports", json={"kind": "pairs", "format": "jsonl"})
    export.raise_for_status()
    export_id = export.json()["export_id"]
    _wait("the export", lambda: api.get(f"/exports/{export_id}").json()["status"] == "ready", 120)
    run = api.post(f"/projects/{project_id}/training-runs",
                   json={"kind": "reward", "export_id": export_id, "config": REWARD_CONFIG})
    run.raise_for_status()
    run_id = run.json()["run_id"]

    def finished() -> bool:
        state = api.get(f"/training-runs/{run_id}").json()["state"]
        if state in ("failed", "cancelled"):
            raise RuntimeError(f"the reward run {run_id} {state}; its log is under the data directory's jobs/")
        return state == "succeeded"

    _wait("the reward run", finished, 600)
    return run_id


def _log_in(page: Any, base: str, email: str, password: str) -> None:
    page.goto(f"{base}/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/projects**")


def _save(page: Any, path: Path) -> None:
    """The viewport as a 256-colour PNG: a UI screenshot keeps its look at a third of the size."""
    from PIL import Image

    image = Image.open(io.BytesIO(page.screenshot())).convert("RGB")
    image.quantize(colors=256, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"wrote {path} ({path.stat().st_size // 1024} KB)")


def shoot(chromium: str, base: str, passwords: dict[str, str], project_id: int, run_id: int, out: Path) -> None:
    from playwright.sync_api import sync_playwright

    out.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)
        try:
            for email, url, name, ready in (
                    ("annotator1@example.org", f"/projects/{project_id}/annotate", "ranking.png", "#task"),
                    ("lead@example.org", f"/projects/{project_id}/agreement", "agreement.png", "main"),
                    ("engineer@example.org", f"/training-runs/{run_id}", "training-run.png",
                     'figure.chart[data-metric="loss"] svg')):
                context = browser.new_context(viewport=VIEWPORT)
                page = context.new_page()
                _log_in(page, base, email, passwords[email])
                page.goto(f"{base}{url}")
                page.wait_for_selector(ready)
                page.wait_for_load_state("networkidle")
                _save(page, out / name)
                context.close()
        finally:
            browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img", help="where the PNGs go")
    parser.add_argument("--chromium", default=os.environ.get("PREFLAB_CHROMIUM", "/usr/bin/chromium"),
                        help="the Chromium executable Playwright drives")
    args = parser.parse_args(argv)
    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request would bury what the script says
    if not Path(args.chromium).exists():
        parser.error(f"--chromium: {args.chromium} not found (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="preflab-screenshots-") as tmp, demo_server(Path(tmp)) as served:
        app, base, passwords, project_id = served
        rank(app, base, project_id)
        run_id = train_reward_model(app, base, project_id)
        shoot(args.chromium, base, passwords, project_id, run_id, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
