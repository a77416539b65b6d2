"""axe-core on every main page of each role, on the demo's data in headless Chromium: no serious or critical
violation anywhere, one h1 per page, every checkbox beside its words, and no console error (the CSP is strict) on
the way.

axe.min.js is pinned in package.json and copied by `make vendor` into app/static/vendor for this test only; no
page loads it. The test evaluates its source in the page (as devtools would), so the page's CSP is not loosened.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from app.accounts import users
from app.demo.seed import setup_demo
from app.exports import service as exports
from app.models import Job, Project, TrainingRun
from app.projects import constitutions, rubrics
from tests.app.test_training_demo import _rank_some
from tests.browser.conftest import IN_CI, settle
from tests.browser.test_annotate_page import assert_console_clean, new_page  # noqa: F401 - fixture
from tests.browser.test_training_page import _step

pytestmark = pytest.mark.slow
PHONE = {"width": 390, "height": 844, "has_touch": True, "is_mobile": True}
AXE = Path(__file__).resolve().parents[2] / "app" / "static" / "vendor" / "axe.min.js"
# What each role opens on its day ({p}: the demo project, {u}: an annotator, {r}: a run, {j}: a job).
PAGES = {
    "annotator on a phone": ["/projects", "/projects/{p}/annotate"],
    "annotator": ["/projects", "/projects/{p}", "/projects/{p}/annotate", "/account"],
    "lead": ["/projects/{p}", "/projects/{p}/rubric", "/projects/{p}/rubric/history", "/projects/{p}/import",
             "/projects/{p}/agreement", "/projects/{p}/agreement/prompts", "/projects/{p}/agreement/annotators/{u}",
             "/projects/{p}/judge", "/projects/{p}/constitution", "/projects/{p}/constitution/history",
             "/projects/{p}/revisions", "/projects/{p}/jobs"],
    "engineer": ["/projects/{p}", "/projects/{p}/exports", "/projects/{p}/training", "/training-runs/{r}", "/training-runs/{live}",
                 "/projects/{p}/training/compare?a={r}&b={r}", "/jobs/{j}"],
    "admin": ["/projects", "/admin/users", "/admin/endpoints", "/admin/clusters"],
}


# Checkboxes and radios whose words do not start on their line, just after the box (a label laid out as a column
# puts the box alone above its text).
APART = """() => [...document.querySelectorAll('label > input[type=checkbox], label > input[type=radio]')]
  .filter(box => box.offsetParent !== null).filter(box => {
    const words = [...box.parentElement.childNodes].find(n => n.nodeType === 3 && n.textContent.trim());
    if (!words) return false;
    const range = document.createRange(); range.selectNodeContents(words);
    const w = range.getClientRects()[0], b = box.getBoundingClientRect();
    return !w || w.left - b.right > 24 || w.top > b.bottom || w.bottom < b.top;
  }).map(box => box.name)"""


def axe_violations(page, levels: tuple[str, ...] = ("serious", "critical")) -> list[str]:  # type: ignore[no-untyped-def]
    """axe's violations at `levels` on the page as it is now, one line each: rule, impact, the first nodes."""
    if not page.evaluate("() => typeof window.axe === 'object'"):
        page.evaluate(AXE.read_text(encoding="utf-8"))
    result = page.evaluate("() => axe.run(document, {resultTypes: ['violations']})")
    return [f"{v['id']} ({v['impact']}, {len(v['nodes'])}×): {v['help']}: "
            + " | ".join(n["html"][:100] for n in v["nodes"][:3])
            for v in result["violations"] if v["impact"] in levels]


@pytest.fixture
def demo_world(live_server):  # type: ignore[no-untyped-def]
    """The demo (its accounts, project, gold), plus what a first day leaves: rankings, a second rubric version, a
    constitution, a queued export and a training run with metrics and an evaluation."""
    if not AXE.is_file():
        if IN_CI:
            pytest.fail(f"{AXE} missing: run `make vendor`", pytrace=False)
        pytest.skip(reason="axe.min.js not vendored (make vendor)")
    accounts, pid = setup_demo(live_server.settings, "tiny")
    passwords = {role: password for role, _, password in accounts}
    emails = {role: email for role, email, _ in accounts}
    _rank_some(live_server.app, {email: password for _, email, password in accounts}, pid, per_annotator=6)
    with live_server.session() as db:
        lead = users.get_by_email(db, emails["lead"])
        project = db.get(Project, pid)
        # A rubric long enough that its panel beside the answers scrolls.
        rubrics.create_version(db, project, lead, text=(project.current_rubric.text + "\n") * 3 + "Prefer units.",
                               criteria=[*project.current_rubric.criteria, "Units"], base_version=1)
        constitutions.ensure_default(db, project, lead)
        exports.request_export(db, project, lead, "pairs", "jsonl")
        exports.request_export(db, project, lead, "prompts", "jsonl")  # no filters at all
        runs = {}
        for state in ("succeeded", "running"):  # a finished run, and one the page is following
            job = Job(kind="train", payload={}, state=state, result={}, project_id=pid)
            db.add(job)
            db.flush()
            out = live_server.settings.data_dir / "runs" / state
            out.mkdir(parents=True)
            runs[state] = TrainingRun(project_id=pid, kind="grpo", state=state, config={}, job_id=job.id,
                                      metrics_path=str(out / "metrics.jsonl"), model_dir=str(out / "model"))
            db.add(runs[state])
        annotator = users.get_by_email(db, "annotator1@example.org")
        db.commit()
        ids = {"p": pid, "u": annotator.id, "r": runs["succeeded"].id, "j": runs["succeeded"].job_id,
               "live": runs["running"].id}
        logs = {state: live_server.settings.data_dir / "jobs" / f"{run.job_id}.log" for state, run in runs.items()}
    (live_server.settings.data_dir / "jobs").mkdir(exist_ok=True)
    for state in runs:
        for step in range(1, 4):
            _step(live_server.settings.data_dir / "runs" / state, logs[state], step, total=3 if state == "succeeded" else 20)
    out = live_server.settings.data_dir / "runs" / "succeeded"
    (out / "eval.json").write_text(json.dumps({
        "accuracy": 0.7, "calibration": [{"mean_confidence": c, "accuracy": a, "pairs": 10} for c, a in [(0.6, 0.55), (0.8, 0.7)]],
        "accuracy_by_length": [{"tokens": [0, 64], "accuracy": 0.7, "pairs": 12}],
        "reward_mean": {"policy": 0.6, "reference": 0.2},
        "curves": {"pass_at": {"policy": {"1": 0.2, "2": 0.4}}}}))
    (out / "samples.jsonl").write_text("".join(json.dumps({"prompt": "q", "model": m, "answer": "a", "reward": r})
                                               + "\n" for m, r in [("policy", 0.9), ("reference", 0.1)] * 3))
    return emails, passwords, ids


def _login(pg, base: str, email: str, password: str) -> None:  # type: ignore[no-untyped-def]
    pg.goto(f"{base}/login")
    pg.wait_for_function("() => document.activeElement && document.activeElement.name === 'email'")
    pg.fill("input[name=email]", email)
    pg.fill("input[name=password]", password)
    pg.click("button[type=submit]")
    pg.wait_for_url(lambda url: "/login" not in url)


def test_axe_finds_nothing_serious_on_any_main_page_of_any_role(live_server, demo_world, new_page) -> None:  # type: ignore[no-untyped-def]  # noqa: F811
    emails, passwords, ids = demo_world
    found: dict[str, list[str]] = {}
    login = new_page()
    login.goto(f"{live_server.base}/login")
    settle(login)
    found["anonymous /login"] = axe_violations(login)
    if login.get_by_role("heading", level=1).count() != 1:
        found["anonymous /login"].append("not exactly one h1")
    for who, paths in PAGES.items():
        role = who.split()[0]
        pg = new_page(**PHONE) if who.endswith("phone") else new_page()
        _login(pg, live_server.base, emails[role], passwords[role])
        for path in paths:
            url = path.format(**ids)
            response = pg.goto(live_server.base + url)
            assert response is not None and response.status == 200, f"{who} {url}: {response and response.status}"
            settle(pg)
            problems = axe_violations(pg)
            if pg.get_by_role("heading", level=1).count() != 1:
                problems.append("not exactly one h1")
            problems += [f"checkbox {name!r} stands apart from its label" for name in pg.evaluate(APART)]
            found[f"{who} {url}"] = problems
        assert_console_clean(pg)
    bad = {page: problems for page, problems in found.items() if problems}
    assert bad == {}, "\n".join(f"{page}:\n  " + "\n  ".join(p) for page, p in bad.items())
