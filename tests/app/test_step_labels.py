"""Step labels (process supervision): the project option, completions split into stored steps, and step labels
submitted with a ranking through the JSON API and kept in drafts, on SQLite and Postgres."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from app.annotation import steps
from app.imports import service as imports
from app.models import Completion, Prompt, Ranking, StepLabel
from app.platform.errors import Invalid
from app.projects import projects

SOLUTION = "Add 2 and 3.\n\n  That gives 5.  \nSo the answer is 5."


def test_one_step_per_non_empty_line_by_default() -> None:
    assert steps.split(SOLUTION) == ["Add 2 and 3.", "That gives 5.", "So the answer is 5."]


def test_a_regex_separator_splits_between_its_matches_and_groups_add_nothing() -> None:
    text = "Step 1: add. Step 2: carry. Step 3: done."
    assert steps.split(text, r"(?=Step \d+:)") == ["Step 1: add.", "Step 2: carry.", "Step 3: done."]
    assert steps.split("a ## b ##c", r"\s*(##)\s*") == ["a", "b", "c"]


def test_a_very_long_completion_keeps_its_tail_in_the_last_step() -> None:
    text = "\n".join(f"line {i}" for i in range(150))
    split = steps.split(text)
    assert len(split) == steps.MAX_STEPS and split[-1].startswith("line 99\nline 100") and split[-1].endswith("149")


@pytest.mark.parametrize(("separator", "why"), [("(", "not a valid regular expression"),
                                                (r"\s*", "empty string"), ("x" * 201, "at most")])
def test_a_bad_separator_is_refused_naming_the_field(separator: str, why: str) -> None:
    with pytest.raises(Invalid) as info:
        steps.check_separator(separator)
    assert info.value.field == "step_separator" and why in info.value.message


def _project_with_steps(db, make_user, make_project, *, k=2, separator=None):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k)
    steps.set_options(db, project, lead, enabled=True, separator=separator)
    ann = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=ann.email, role="annotator")
    return lead, project, ann


def _import(db, project, lead, rows: list[tuple[str, list[str]]]) -> None:  # type: ignore[no-untyped-def]
    import json
    data = "".join(json.dumps({"prompt": p, "completions": c}) + "\n" for p, c in rows).encode()
    imports.import_file(db, project, "p.jsonl", data, actor=lead)


def test_imported_completions_are_split_when_the_project_labels_steps(db, make_user, make_project) -> None:
    lead, project, _ = _project_with_steps(db, make_user, make_project)
    _import(db, project, lead, [("2+3?", [SOLUTION, "It is 6."])])
    stored = dict(db.execute(select(Completion.text, Completion.steps)).all())
    assert stored == {SOLUTION: ["Add 2 and 3.", "That gives 5.", "So the answer is 5."], "It is 6.": ["It is 6."]}


def test_without_the_option_nothing_is_split(db, make_user, make_project) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    _import(db, project, lead, [("2+3?", [SOLUTION, "It is 6."])])
    assert db.scalars(select(Completion.steps)).all() == [None, None]


def test_a_new_separator_resplits_only_completions_nobody_labelled(db, make_user, make_project, token_for,
                                                                   api) -> None:
    lead, project, ann = _project_with_steps(db, make_user, make_project)
    _import(db, project, lead, [("2+3?", ["a. b.\nc.", "d. e."]), ("1+1?", ["f. g.", "h."])])
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    first = task["completions"][0]
    r = client.post(f"/api/projects/{project.id}/rankings",
                    json=_ranking(task, step_labels={str(first["id"]): [1] * len(first["steps"])}))
    assert r.status_code == 201, r.text

    lead_client = api(token_for(db, lead))
    pid = project.id
    db.commit()
    r = lead_client.put(f"/api/projects/{project.id}/step-options", json={"enabled": True, "separator": r"\.\s*"})
    assert r.status_code == 200 and r.json() == {"enabled": True, "separator": r"\.\s*"}
    db.expire_all()
    by_id = {c.id: c.steps for c in db.scalars(select(Completion))}
    assert by_id[first["id"]] == first["steps"]  # labelled: its steps stay as they were labelled
    texts = dict(db.execute(select(Completion.id, Completion.text)).all())
    new = {"a. b.\nc.": ["a", "b", "c"], "d. e.": ["d", "e"], "f. g.": ["f", "g"], "h.": ["h"]}
    assert {cid: s for cid, s in by_id.items() if cid != first["id"]} == {
        cid: new[texts[cid]] for cid in by_id if cid != first["id"]}
    db.rollback()
    project_out = lead_client.get(f"/api/projects/{pid}").json()
    assert project_out["step_labels"] is True and project_out["step_separator"] == r"\.\s*"


def test_only_leads_configure_steps_and_a_bad_separator_changes_nothing(db, make_user, make_project, token_for,
                                                                        api) -> None:
    lead, project, ann = _project_with_steps(db, make_user, make_project)
    annotator, leader = api(token_for(db, ann)), api(token_for(db, lead))
    db.commit()
    assert annotator.put(f"/api/projects/{project.id}/step-options", json={"enabled": False}).status_code == 403
    r = leader.put(f"/api/projects/{project.id}/step-options", json={"enabled": True, "separator": "(("})
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "step_separator"
    assert leader.get(f"/api/projects/{project.id}").json()["step_separator"] is None


def _ranking(task: dict, **over: object) -> dict:
    body = {"assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
            "rubric_version": task["rubric"]["version"], "submission_id": f"sub-{task['assignment_id']}"}
    body.update(over)
    return body


def _labelled_task(db, make_user, make_project, token_for, api):  # type: ignore[no-untyped-def]
    lead, project, ann = _project_with_steps(db, make_user, make_project)
    _import(db, project, lead, [("2+3?", [SOLUTION, "Two plus three.\nIs six."])])
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    return project, client, task


def test_next_task_gives_each_completion_its_steps(db, make_user, make_project, token_for, api) -> None:
    _, _, task = _labelled_task(db, make_user, make_project, token_for, api)
    assert task["step_labels"] is True
    assert sorted(c["steps"] for c in task["completions"]) == [
        ["Add 2 and 3.", "That gives 5.", "So the answer is 5."], ["Two plus three.", "Is six."]]


def test_step_labels_are_stored_with_the_ranking_once_under_one_submission(db, make_user, make_project, token_for,
                                                                           api) -> None:
    project, client, task = _labelled_task(db, make_user, make_project, token_for, api)
    by_len = {len(c["steps"]): c["id"] for c in task["completions"]}
    good, bad = by_len[3], by_len[2]
    body = _ranking(task, tiers=[[good], [bad]], step_labels={str(good): [1, 0, 1], str(bad): [1, -1]})
    first = client.post(f"/api/projects/{project.id}/rankings", json=body)
    again = client.post(f"/api/projects/{project.id}/rankings", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["ranking_id"] == first.json()["ranking_id"]
    db.expire_all()
    rows = db.execute(select(StepLabel.completion_id, StepLabel.step_index, StepLabel.label)
                      .order_by(StepLabel.completion_id, StepLabel.step_index)).all()
    assert sorted(rows) == sorted([(good, 0, 1), (good, 1, 0), (good, 2, 1), (bad, 0, 1), (bad, 1, -1)])
    assert steps.of_ranking(db, first.json()["ranking_id"]) == {good: [1, 0, 1], bad: [1, -1]}
    db.rollback()


def test_a_list_may_stop_at_the_first_wrong_step(db, make_user, make_project, token_for, api) -> None:
    project, client, task = _labelled_task(db, make_user, make_project, token_for, api)
    long_one = next(c["id"] for c in task["completions"] if len(c["steps"]) == 3)
    r = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task, step_labels={str(long_one): [1, -1]}))
    assert r.status_code == 201, r.text
    db.expire_all()
    assert steps.of_ranking(db, r.json()["ranking_id"]) == {long_one: [1, -1]}
    db.rollback()


@pytest.mark.parametrize("case", ["too_long", "too_short", "foreign", "bad_value", "bool", "not_a_list"])
def test_bad_step_labels_are_a_422_naming_step_labels_and_store_nothing(db, make_user, make_project, token_for,
                                                                        api, case: str) -> None:
    project, client, task = _labelled_task(db, make_user, make_project, token_for, api)
    pid = project.id
    three = next(c["id"] for c in task["completions"] if len(c["steps"]) == 3)
    other = 10**6  # no completion of this task (nor of any other)
    labels = {"too_long": {str(three): [1, 1, 1, 1]}, "too_short": {str(three): [1, 0]},
              "foreign": {str(other): [1]}, "bad_value": {str(three): [1, 2, 1]}, "bool": {str(three): [True, 1, 1]},
              "not_a_list": {str(three): 1}}[case]
    r = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task, step_labels=labels))
    assert r.status_code == 422, r.text
    assert all(d["field"].startswith("step_labels") for d in r.json()["detail"]), r.json()
    db.expire_all()
    assert db.scalar(select(func.count(Ranking.id))) == 0 and db.scalar(select(func.count(StepLabel.id))) == 0
    db.rollback()
    # The task is still open: the corrected submission goes through.
    ok = client.post(f"/api/projects/{pid}/rankings", json=_ranking(task, step_labels={str(three): [1, 1, 1]}))
    assert ok.status_code == 201


def test_step_labels_in_a_project_without_the_option_are_refused(db, make_user, make_project, token_for,
                                                                 api) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    ann = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=ann.email, role="annotator")
    _import(db, project, lead, [("q", ["a", "b"])])
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert task["step_labels"] is False and all(c["steps"] is None for c in task["completions"])
    cid = task["completions"][0]["id"]
    r = client.post(f"/api/projects/{project.id}/rankings", json=_ranking(task, step_labels={str(cid): [1]}))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == "step_labels"


def test_completions_from_before_the_option_get_steps_when_first_shown(db, make_user, make_project, token_for,
                                                                       api) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    ann = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=ann.email, role="annotator")
    prompt = Prompt(project_id=project.id, text="q", text_hash="q-hash", split="train")
    db.add(prompt)
    db.flush()
    db.add_all([Completion(prompt_id=prompt.id, text="x\ny"), Completion(prompt_id=prompt.id, text="z")])
    db.flush()
    project.settings = {"step_labels": True}  # switched on behind the service's back: nothing split yet
    client = api(token_for(db, ann))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert sorted(c["steps"] for c in task["completions"]) == [["x", "y"], ["z"]]
    db.expire_all()
    assert sorted(db.scalars(select(Completion.steps)).all()) == [["x", "y"], ["z"]]
    db.rollback()


def test_a_draft_keeps_unfinished_step_labels(db, make_user, make_project, token_for, api) -> None:
    project, client, task = _labelled_task(db, make_user, make_project, token_for, api)
    three = next(c["id"] for c in task["completions"] if len(c["steps"]) == 3)
    url = f"/api/assignments/{task['assignment_id']}/draft"
    r = client.put(url, json={"tiers": [], "step_labels": {str(three): [1, None, -1]}})
    assert r.status_code == 200, r.text
    assert client.get(url).json()["step_labels"] == {str(three): [1, None, -1]}
    bad = client.put(url, json={"tiers": [], "step_labels": {str(three): [1, 1, 1, 1]}})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == f"step_labels.{three}"
    # Submitting clears the draft, as for tiers.
    r = client.post(f"/api/projects/{project.id}/rankings",
                    json=_ranking(task, step_labels={str(three): [1, 1, -1]}))
    assert r.status_code == 201
    assert client.get(url).status_code == 404


def test_the_project_page_turns_step_labels_on_and_shows_a_bad_separator(db, make_user, make_project,
                                                                          app) -> None:
    from tests.conftest import Browser

    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    pid, email = project.id, lead.email
    db.commit()
    browser = Browser(app)
    browser.login(email)
    page = browser.get(f"/projects/{pid}")
    assert page.status_code == 200 and "Step labels" in page.text and "Off." in page.text
    bad = browser.post(f"/projects/{pid}/step-options", {"enabled": "yes", "separator": "(("})
    assert bad.status_code == 422 and "Step separator" in bad.text and "regular expression" in bad.text
    ok = browser.post(f"/projects/{pid}/step-options", {"enabled": "yes", "separator": ""})
    assert ok.status_code == 303
    assert "one per non-empty line" in browser.get(f"/projects/{pid}").text


def test_the_ranking_page_form_sends_step_labels_without_javascript(db, make_user, make_project, app) -> None:
    import re

    from tests.conftest import Browser

    lead, project, ann = _project_with_steps(db, make_user, make_project)
    _import(db, project, lead, [("2+3?", [SOLUTION, "It is 6."])])
    pid, email = project.id, ann.email
    db.commit()
    browser = Browser(app)
    browser.login(email)
    page = browser.get(f"/projects/{pid}/annotate").text
    assignment = re.search(r'data-assignment="(\d+)"', page).group(1)
    cids = re.findall(r'<ol class="steps" data-cid="(\d+)"', page)
    by_steps = {int(cid): len(re.findall(rf'name="step_{cid}_\d+" value="1"', page)) for cid in cids}
    three = next(cid for cid, n in by_steps.items() if n == 3)
    one = next(cid for cid, n in by_steps.items() if n == 1)
    form = {"assignment_id": assignment, "submission_id": "page-1", "rubric_version": "1", "action": "rank",
            f"rank_{three}": "1", f"rank_{one}": "2"}
    gap = browser.post(f"/projects/{pid}/annotate", form | {f"step_{three}_0": "1", f"step_{three}_2": "1"})
    assert gap.status_code == 422 and "step 2 has no label" in gap.text
    ok = browser.post(f"/projects/{pid}/annotate", form | {f"step_{three}_0": "1", f"step_{three}_1": "-1",
                                                          f"step_{three}_2": "1", f"step_{one}_0": "0"})
    assert ok.status_code == 303
    ranking_id = db.scalar(select(Ranking.id))
    # After the first −1 nothing is kept: the list stops there.
    assert steps.of_ranking(db, ranking_id) == {three: [1, -1], one: [0]}
    db.rollback()


def test_gold_step_labels_keep_their_steps_and_need_the_option(db, make_user, make_project) -> None:
    from app.quality import gold

    lead, project, _ = _project_with_steps(db, make_user, make_project)
    _import(db, project, lead, [("2+3?", ["a. b.\nc.", "d. e."])])
    prompt = db.scalar(select(Prompt).where(Prompt.project_id == project.id))
    ids = dict(db.execute(select(Completion.text, Completion.id)).all())
    tiers = [[ids["a. b.\nc."]], [ids["d. e."]]]
    gold.set_gold(db, project, prompt.id, tiers, lead, step_labels={str(ids["a. b.\nc."]): [1, -1]})
    assert prompt.gold_step_labels == {str(ids["a. b.\nc."]): [1, -1]}
    # A new separator leaves the gold completion's steps as they were given labels on, like a labelled one.
    steps.set_options(db, project, lead, enabled=True, separator=r"\.\s*")
    db.expire_all()
    by_text = dict(db.execute(select(Completion.text, Completion.steps)).all())
    assert by_text == {"a. b.\nc.": ["a. b.", "c."], "d. e.": ["d", "e"]}
    with pytest.raises(Invalid) as bad:
        gold.set_gold(db, project, prompt.id, tiers, lead, step_labels={str(ids["d. e."]): [1, 1, 1]})
    assert bad.value.field == f"step_labels.{ids['d. e.']}" and "3 labels for 2 steps" in str(bad.value)
    steps.set_options(db, project, lead, enabled=False, separator=None)
    with pytest.raises(Invalid) as off:
        gold.set_gold(db, project, prompt.id, tiers, lead, step_labels={str(ids["d. e."]): [1, 1]})
    assert off.value.field == "step_labels"
    gold.clear_gold(db, project, prompt.id, lead)
    assert db.get(Prompt, prompt.id).gold_step_labels is None
