"""What a first day's data looks like to an engineer: the training form offers only exports the chosen method can
train on, newest first, and says, with the pair count, when there is too little to learn from; so does the run page,
whose log shows no raw terminal colour codes. A refused form brings its error into view and focuses the field."""

from __future__ import annotations

import pytest

from app.accounts import users
from app.models import Export, Job, TrainingRun
from app.projects import projects
from tests.browser.screens import shoot
from tests.browser.test_annotate_page import PASSWORD, _login, new_page  # noqa: F401 - fixture

pytestmark = pytest.mark.slow
LAPTOP = {"width": 1366, "height": 900}
PHONE = {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}


def _world(live_server) -> dict[str, int]:  # type: ignore[no-untyped-def]
    """A lead's project with ready exports, oldest first: pairs (17 train, 6 held out), prompts, a big pairs export,
    SFT rows; and a reward run on the small pairs export whose log is coloured."""
    with live_server.session() as db:
        lead = users.create_user(db, "eng@example.org", PASSWORD, "lead")
        project = projects.create_project(db, lead, name="First day", completions_per_prompt=4, overlap=1,
                                          rubric_text="r", criteria=[])
        made = {}
        for name, kind, train, heldout in [("small", "pairs", 17, 6), ("prompts", "prompts", 80, 20),
                                           ("big", "pairs", 900, 300), ("sft", "sft", 40, 10)]:
            export = Export(project_id=project.id, kind=kind, format="jsonl", filters={}, row_count=train + heldout,
                            row_counts={"split.train": train, "split.heldout": heldout}, sha256="0" * 64,
                            files={f"{kind}.jsonl": "0" * 64})
            db.add(export)
            db.flush()
            made[name] = export.id
        job = Job(kind="train", payload={}, state="succeeded", result={}, project_id=project.id)
        db.add(job)
        db.flush()
        run = TrainingRun(project_id=project.id, kind="reward", state="succeeded", config={}, job_id=job.id,
                          export_id=made["small"], metrics_path="/nonexistent/metrics.jsonl", model_dir="/nonexistent")
        db.add(run)
        db.commit()
        made |= {"project": project.id, "run": run.id, "job": job.id}
    log = live_server.settings.data_dir / "jobs" / f"{made['job']}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text("\x1b[32mINFO\x1b[0m loading the encoder\n\x1b[1m\x1b[33mstep 1/2\x1b[0m loss 0.69\n"
                   "\x1b]0;preflab\x07step 2/2 loss 0.71\x1b[K\n")
    return made


def _offered(pg) -> list[int]:  # type: ignore[no-untyped-def]
    """The exports the Export list shows, in order."""
    return pg.locator("select[name=export_id] option").evaluate_all(
        "os => os.filter(o => getComputedStyle(o).display !== 'none' && !o.disabled).map(o => +o.value)")


def _chosen(pg) -> int:  # type: ignore[no-untyped-def]
    return int(pg.locator("select[name=export_id]").input_value())


@pytest.mark.parametrize("script", [True, False], ids=["js", "no-js"])
def test_the_form_offers_only_exports_the_method_reads_and_warns_when_they_are_small(
        live_server, new_page, script) -> None:  # noqa: F811
    made = _world(live_server)
    pg = new_page(java_script_enabled=script, **LAPTOP)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/projects/{made['project']}/training")
    # A reward run reads pairs: the two pairs exports, newest first, the newest chosen.
    assert _offered(pg) == [made["big"], made["small"]] and _chosen(pg) == made["big"]
    assert not pg.locator("#small-data").is_visible()
    if not script:
        return  # without a script the server's first choice stands; changing the kind needs the page's script
    pg.select_option("select[name=export_id]", str(made["small"]))
    warning = pg.locator("#small-data")
    assert warning.is_visible() and "17 training pairs (6 more held out): too few to learn from" in warning.inner_text()
    shoot(pg, "training-form")
    pg.select_option("select[name=kind]", "grpo")  # prompts
    assert _offered(pg) == [made["prompts"]] and _chosen(pg) == made["prompts"] and not warning.is_visible()
    pg.select_option("select[name=kind]", "prm")  # steps: none yet
    assert _offered(pg) == [] and pg.locator("#no-export").is_visible()
    assert "No steps export yet" in pg.locator("#no-export").inner_text()
    pg.select_option("select[name=kind]", "sft")
    assert _offered(pg) == [made["sft"]] and "40 training SFT rows" in warning.inner_text()


@pytest.mark.parametrize("size", [LAPTOP, PHONE], ids=["laptop", "phone"])
def test_the_run_page_warns_about_small_data_and_shows_its_log_without_colour_codes(
        live_server, new_page, size) -> None:  # noqa: F811
    made = _world(live_server)
    pg = new_page(**size)
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/training-runs/{made['run']}")
    warning = pg.locator("#small-data")
    assert warning.is_visible() and "17 training pairs (6 more held out)" in warning.inner_text()
    log = pg.locator("#run-log").inner_text()
    assert log == "INFO loading the encoder\nstep 1/2 loss 0.69\nstep 2/2 loss 0.71"
    shoot(pg, "training-run")


def test_a_refused_form_shows_its_error_in_view_and_focuses_the_field(live_server, new_page) -> None:  # noqa: F811
    made = _world(live_server)
    pg = new_page(**LAPTOP)
    pg.allowed_console.append("status of 422")  # the page comes back as the refusal it is
    _login(pg, live_server.base, "eng@example.org")
    pg.goto(f"{live_server.base}/projects/{made['project']}/judge")
    pg.locator("input[name=model]").fill("")
    pg.get_by_role("button", name="Start judge run").click()
    pg.wait_for_load_state()
    error = pg.locator("p.error[role=alert]")
    assert error.count() == 1
    box = error.bounding_box()
    assert 0 <= box["y"] and box["y"] + box["height"] <= LAPTOP["height"], box  # on screen, not 1,700 px down
    assert pg.evaluate("document.activeElement.name") == "model"
    assert pg.locator("input[name=model]").get_attribute("aria-invalid") == "true"
    shoot(pg, "judge-error")
