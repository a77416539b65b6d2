"""Other tools' files, each read with one choice of preset (or detected): chats, extra columns, scores, and
Label Studio / Argilla annotations arriving as rankings by pseudonymous users."""

from __future__ import annotations

import gzip
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from app.annotation import steps
from app.imports.formats import MAX_METADATA_CHARS
from app.imports.service import ImportRejected, import_file, parse_import
from app.models import Completion, Pair, Project, ProjectMember, Prompt, Ranking, StepLabel, User
from app.quality import step_agreement
from tests.support.chat import assistant, user

PRESETS = Path(__file__).parent / "data" / "imports" / "presets"
HH_REAL = Path("/work/shared/datasets/hh-rlhf/harmless-base-test.jsonl.gz")


def jsonl(*rows: Any) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def sample(name: str) -> bytes:
    return (PRESETS / name).read_bytes()


def errors(call: Callable[[], Any]) -> list[tuple[int, str, str]]:
    with pytest.raises(ImportRejected) as info:
        call()
    return [(e.line, e.field, e.message) for e in info.value.errors]





# --- reading: every layout with its preset, and detection -------------------------------------


@pytest.mark.parametrize(
    ("name", "detected"),
    [
        ("ultrafeedback.jsonl", "ultrafeedback"),
        ("trl_standard_explicit.jsonl", "preflab"),
        ("trl_conversational_explicit.jsonl", "trl"),
        ("trl_conversational_implicit.jsonl", "trl"),
        ("label_studio_pairwise.json", "label-studio"),
        ("label_studio_ranker.json", "label-studio"),
        ("argilla_ranking.jsonl", "argilla"),
        ("argilla_rating.jsonl", "argilla"),
        ("trl_stepwise.jsonl", "trl-stepwise"),
        ("prm800k.jsonl", "prm800k"),
    ],
)
def test_each_sample_file_reads_with_its_preset_and_without_one(name: str, detected: str):
    assert parse_import(name, sample(name)).preset == detected
    preset = {"preflab": "trl"}.get(detected, detected)
    assert parse_import(name, sample(name), preset=preset).rows == parse_import(name, sample(name)).rows


def test_trl_standard_implicit_prompt_needs_the_preset_and_is_cut_as_trl_cuts_it():
    data = sample("trl_standard_implicit.jsonl")
    assert errors(lambda: parse_import("t.jsonl", data))[0][1] == "prompt"
    first, second = parse_import("t.jsonl", data, preset="trl").pairs
    assert (first.text, first.chosen, first.rejected) == ("The sky is", " blue.", " green.")
    assert (second.text, second.chosen, second.rejected) == ("Water boils at", " 100 °C at sea level.", " 50 °C.")


def test_trl_conversational_layouts_store_the_prompt_as_a_chat():
    explicit = parse_import("e.jsonl", sample("trl_conversational_explicit.jsonl"), preset="trl").pairs
    implicit = parse_import("i.jsonl", sample("trl_conversational_implicit.jsonl"), preset="trl").pairs
    assert explicit[0].messages == [user("What color is the sky?")]
    assert (explicit[0].chosen, explicit[0].rejected) == ("It is blue.", "It is green.")
    assert explicit[1].messages[0] == {"role": "system", "content": "Answer briefly."}
    # The same pair written both ways is the same prompt (one text_hash), so it would not be imported twice.
    assert implicit[0].text_hash == explicit[0].text_hash
    assert implicit[1].messages == [user("Hi"), assistant("Hello! How can I help?"), user("Tell me a fact.")]
    assert implicit[1].chosen == "Octopuses have three hearts."


def test_ultrafeedback_scores_become_a_soft_label_and_prompt_id_is_kept():
    parsed = parse_import("uf.jsonl", sample("ultrafeedback.jsonl"), preset="ultrafeedback")
    first = parsed.pairs[0]
    assert first.messages == [user("Name three primary colours.")]
    assert first.chosen == "Red, yellow and blue are the traditional primary colours."
    assert first.p == pytest.approx(1 / (1 + math.exp(-(8.5 - 3.0))))
    assert first.metadata == {"prompt_id": "2f1e0a6b", "score_chosen": 8.5, "score_rejected": 3.0}
    assert parsed.extra_columns_note() == "kept 1 extra column: prompt_id"


def test_an_explicit_p_wins_over_scores_and_a_multi_turn_response_keeps_its_turns():
    row = {"prompt": [user("Plan a trip")], "p": 0.6, "score_chosen": 9, "score_rejected": 1,
           "chosen": [assistant("Where to?"), user("Rome"), assistant("Day 1: the Forum.")],
           "rejected": [assistant("No.")]}
    (pair,) = parse_import("c.jsonl", jsonl(row)).pairs
    assert pair.p == 0.6
    assert pair.chosen_messages == row["chosen"] and pair.rejected_messages is None
    assert pair.chosen == "assistant: Where to?\nuser: Rome\nassistant: Day 1: the Forum."


def test_unknown_columns_are_kept_in_metadata_and_listed_once_strict_refuses_them():
    rows = [{"prompt": f"q{i}", "chosen": "a", "rejected": "b", "prompt_id": i, "source": "s", "model": "m"}
            for i in range(3)]
    parsed = parse_import("x.jsonl", jsonl(*rows))
    assert parsed.extra_columns_note() == "kept 3 extra columns: prompt_id, source, model"
    assert parsed.pairs[2].metadata == {"prompt_id": 2, "source": "s", "model": "m"}
    assert errors(lambda: parse_import("x.jsonl", jsonl(*rows), strict=True))[0][:2] == (1, "prompt_id")
    csv = b"prompt,completions,origin\nq,\"[\"\"a\"\"]\",web\n"
    (row,) = parse_import("p.csv", csv).prompts
    assert row.metadata == {"origin": "web"}
    assert errors(lambda: parse_import("p.csv", csv, strict=True))[0][:2] == (1, "origin")


def test_extra_columns_obey_the_metadata_cap():
    row = {"prompt": "q", "completions": ["a"], "notes": "x" * MAX_METADATA_CHARS}
    assert errors(lambda: parse_import("p.jsonl", jsonl(row))) == [
        (1, "metadata", f"longer than {MAX_METADATA_CHARS} characters as JSON")]


def test_preset_problems_name_line_and_field():
    assert errors(lambda: parse_import("p.jsonl", jsonl({"prompt": "q"}), preset="nope")) == [
        (0, "preset", "unknown preset 'nope'; use one of preflab, ultrafeedback, trl, hh-rlhf, label-studio, argilla, "
         "trl-stepwise, prm800k")]
    task = {"id": 1, "data": {"prompt": "q", "answer1": "a", "answer2": "b"},
            "annotations": [{"id": 5, "completed_by": 2, "result": [
                {"type": "pairwise", "to_name": "answer1,answer2", "value": {"selected": "middle"}}]}]}
    data = json.dumps([{"id": 0, "data": {"prompt": "fine", "answer1": "x", "answer2": "y"}, "annotations": []},
                       task], indent=1).encode()
    assert errors(lambda: parse_import("ls.json", data)) == [
        (11, "annotations[0].result.value.selected", "must be 'left' or 'right', got 'middle' (preset label-studio)")]
    bad = jsonl({"id": "r", "prompt": "q", "response1": "a", "pref.responses": [["response1", "response9"]],
                 "pref.responses.users": ["u1"]})
    assert errors(lambda: parse_import("a.jsonl", bad)) == [
        (1, "pref.responses", "ranks 'response9', which is not a text field of the record (preset argilla)")]


def test_a_json_array_that_is_not_label_studio_is_refused_with_the_way_out():
    ((line, field, message),) = errors(lambda: parse_import("a.json", b'[{"prompt": "q"}]'))
    assert (line, field) == (1, "json") and "jq -c" in message and "label-studio" in message


@pytest.mark.skipif(not HH_REAL.exists(), reason="shared HH-RLHF data not present")
def test_the_real_hh_rlhf_file_is_detected_and_reads_with_its_preset():
    data = gzip.decompress(HH_REAL.read_bytes())
    detected = parse_import("harmless-base-test.jsonl", data)
    assert detected.preset == "hh-rlhf" and len(detected.pairs) == 2312
    assert parse_import("h.jsonl", data, preset="hh-rlhf").pairs == detected.pairs


# --- writing ----------------------------------------------------------------------------------


def test_chat_pairs_are_stored_as_chats_with_scores_on_the_pair(db: Session, project: Project, lead: Any):
    result = import_file(db, project, "uf.jsonl", sample("ultrafeedback.jsonl"), actor=lead)
    assert (result.preset, result.pairs, result.note) == ("ultrafeedback", 3, "kept 1 extra column: prompt_id")
    prompt = db.scalars(select(Prompt).where(Prompt.project_id == project.id).order_by(Prompt.id)).first()
    assert prompt.messages == [user("Name three primary colours.")]
    pair = db.scalars(select(Pair).where(Pair.prompt_id == prompt.id)).one()
    assert pair.meta == {"prompt_id": "2f1e0a6b", "score_chosen": 8.5, "score_rejected": 3.0}
    assert pair.p == pytest.approx(1 / (1 + math.exp(-5.5)))
    row = {"prompt": [user("Plan a trip")], "chosen": [assistant("Where to?"), user("Rome"), assistant("Day 1.")],
           "rejected": [assistant("No.")]}
    import_file(db, project, "multi.jsonl", jsonl(row), actor=lead)
    turns = db.scalars(select(Completion.meta).join(Prompt).where(Prompt.text == "user: Plan a trip")).all()
    assert {"messages": row["chosen"]} in turns


def test_label_studio_annotations_become_rankings_by_pseudonymous_users(db: Session, project: Project, lead: Any):
    result = import_file(db, project, "ls.json", sample("label_studio_pairwise.json"), actor=lead)
    assert (result.preset, result.prompts, result.completions, result.rankings, result.annotators) == (
        "label-studio", 2, 4, 3, 2)
    rows = db.execute(select(Ranking, User.email, User.active).join(User, Ranking.annotator_id == User.id)
                      .where(Ranking.project_id == project.id).order_by(Ranking.id)).all()
    assert [(email, active) for _, email, active in rows] == [
        ("label-studio-3@imported.invalid", False), ("label-studio-4@imported.invalid", False),
        ("label-studio-3@imported.invalid", False)]
    first = rows[0][0]
    assert first.source == "human" and first.meta == {"source_tool": "label-studio", "task_id": 101,
                                                      "annotation_id": 9001}
    texts = dict(db.execute(select(Completion.id, Completion.text).where(Completion.prompt_id == first.prompt_id)).all())
    assert [texts[c] for tier in first.tiers for c in tier] == [
        "A function that calls itself on a smaller input until a base case stops it.", "Recursion is when you loop."]
    assert texts[rows[1][0].tiers[0][0]] == "Recursion is when you loop."  # annotator 4 chose the right one
    members = db.scalars(select(ProjectMember.role).join(User).where(
        ProjectMember.project_id == project.id, User.email.like("%@imported.invalid"))).all()
    assert members == ["annotator", "annotator"]
    prompt = db.get(Prompt, first.prompt_id)
    assert prompt.meta == {"source": "batch-7", "source_task_id": 101}
    # A second file from the same tool reuses the same people.
    again = import_file(db, project, "ls2.json", sample("label_studio_ranker.json"), actor=lead)
    assert again.rankings == 2
    assert db.scalar(select(func.count()).select_from(User).where(User.email.like("label-studio-%"))) == 3
    ranker = db.scalars(select(Ranking).where(Ranking.prompt_id == db.scalar(
        select(Prompt.id).where(Prompt.text == "Suggest a name for a cat.")))).all()
    assert sorted(len(r.tiers) for r in ranker) == [2, 3]  # buckets tie two items


def test_argilla_submitted_responses_become_rankings(db: Session, project: Project, lead: Any):
    result = import_file(db, project, "a.jsonl", sample("argilla_ranking.jsonl"), actor=lead)
    assert (result.preset, result.prompts, result.rankings, result.annotators) == ("argilla", 2, 3, 2)
    rated = import_file(db, project, "r.jsonl", sample("argilla_rating.jsonl"), actor=lead)
    assert rated.rankings == 1  # the second rater gave both 4: no preference
    pairs = db.execute(select(Pair.margin, Pair.source).join(Ranking).where(
        Ranking.meta["task_id"].as_string() == "rec-1")).all()
    assert len(pairs) == 6 and {s for _, s in pairs} == {"human"}


def test_a_bad_annotated_file_writes_nothing(db: Session, project: Project, lead: Any):
    users_before = db.scalar(select(func.count()).select_from(User))
    task = json.loads(sample("label_studio_pairwise.json"))
    task[1]["annotations"][0]["completed_by"] = 3  # annotator 3 twice on one task
    task[1]["annotations"][1] = dict(task[1]["annotations"][0], id=1)
    data = json.dumps(task).encode()
    assert errors(lambda: import_file(db, project, "ls.json", data, actor=lead)) == [
        (1, "annotations", "one annotator ranked this task twice; keep one of the two")]
    db.rollback()
    assert db.scalar(select(func.count()).select_from(User)) == users_before
    assert db.scalar(select(func.count()).select_from(Prompt).where(Prompt.project_id == project.id)) == 0


def test_api_takes_a_preset_and_names_the_one_used(
    db: Session, app: Any, api: Callable[..., Any], token_for: Callable[..., str], project: Project, lead: Any
):
    client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/imports"
    response = client.post(url, files={"file": ("uf.jsonl", sample("ultrafeedback.jsonl"), "application/x-ndjson")})
    assert response.status_code == 201, response.text
    body = response.json()
    assert (body["preset"], body["pairs"], body["extra_columns"], body["note"]) == (
        "ultrafeedback", 3, ["prompt_id"], "kept 1 extra column: prompt_id")
    response = client.post(url + "?preset=trl", files={"file": ("t.jsonl", sample("trl_standard_implicit.jsonl"),
                                                               "application/x-ndjson")})
    assert response.status_code == 201 and response.json()["preset"] == "trl"
    response = client.post(url + "?preset=label-studio",
                           files={"file": ("ls.json", sample("label_studio_ranker.json"), "application/json")})
    assert response.status_code == 201 and response.json()["rankings"] == 2
    response = client.post(url + "?preset=bogus", files={"file": ("t.jsonl", b"{}\n", "application/x-ndjson")})
    assert response.status_code == 422
    response = client.post(url + "?strict=true", files={"file": ("x.jsonl", jsonl(
        {"prompt": "strict q", "chosen": "a", "rejected": "b", "origin": "web"}), "application/x-ndjson")})
    assert response.status_code == 422
    assert response.json()["detail"][0]["field"] == "origin"


def test_a_chat_response_is_shown_as_role_labelled_turns_escaped(
    db: Session, make_user: Callable[..., Any], make_project: Callable[..., Any], token_for: Callable[..., str],
    api: Callable[..., Any], browser: Callable[[], Any],
):
    from app.projects import projects

    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2, overlap=2)
    reader, person_user = make_user(db, "annotator"), make_user(db, "annotator")
    for member in (reader, person_user):
        projects.add_member(db, project, lead, email=member.email, role="annotator")
    chosen = [assistant("Which city?"), user("Rome"), assistant("<b>Day 1</b>: the Forum.")]
    import_file(db, project, "c.jsonl", jsonl(
        {"prompt": [user("Plan a trip")], "chosen": chosen, "rejected": [assistant("No.")]}), actor=lead)
    client = api(token_for(db, reader))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert task["prompt"]["messages"] == [user("Plan a trip")]
    shown = {c["text"]: c["messages"] for c in task["completions"]}
    assert shown == {"assistant: Which city?\nuser: Rome\nassistant: <b>Day 1</b>: the Forum.": chosen, "No.": None}

    person = browser()
    person.login(person_user.email)
    page = person.get(f"/projects/{project.id}/annotate")
    assert page.status_code == 200
    assert '<span class="role">user</span><div class="text">Rome</div>' in page.text
    assert "&lt;b&gt;Day 1&lt;/b&gt;: the Forum." in page.text and "<b>Day 1</b>" not in page.text


def test_rows_with_and_without_extra_columns_mix_in_one_file(db: Session, project: Project, lead: Any):
    import_file(db, project, "m.jsonl", jsonl({"prompt": "q1", "chosen": "a", "rejected": "b", "origin": "web"},
                                              {"prompt": "q2", "chosen": "a", "rejected": "b"}), actor=lead)
    metas = db.scalars(select(Pair.meta).join(Prompt).where(Prompt.project_id == project.id).order_by(Pair.id)).all()
    assert metas == [{"origin": "web"}, {}]


def test_cli_import_takes_a_preset_and_reports_it(db: Session, app: Any, project: Project, monkeypatch: Any,
                                                  database_url: str):
    from typer.testing import CliRunner

    from app.cli import cli

    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))
    db.commit()
    result = CliRunner().invoke(cli, ["import", str(project.id), str(PRESETS / "trl_standard_implicit.jsonl"),
                                      "--preset", "trl"])
    assert result.exit_code == 0, result.output
    assert "2 pairs (preset trl)" in result.output
    result = CliRunner().invoke(cli, ["import", str(project.id), str(PRESETS / "ultrafeedback.jsonl")])
    assert result.exit_code == 0, result.output
    assert "(preset ultrafeedback)" in result.output and "kept 1 extra column: prompt_id" in result.output
    bad = CliRunner().invoke(cli, ["import", str(project.id), str(PRESETS / "argilla_rating.jsonl"), "--preset", "nope"])
    assert bad.exit_code == 1 and "unknown preset 'nope'" in bad.output


def test_tasks_ranked_enough_in_label_studio_are_not_handed_out_again(
    db: Session, make_user: Callable[..., Any], make_project: Callable[..., Any], token_for: Callable[..., str],
    api: Callable[..., Any],
):
    from app.projects import projects

    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2, overlap=2)
    newcomer = make_user(db, "annotator")
    projects.add_member(db, project, lead, email=newcomer.email, role="annotator")
    import_file(db, project, "ls.json", sample("label_studio_pairwise.json"), actor=lead)
    client = api(token_for(db, newcomer))
    db.commit()
    task = client.get(f"/api/projects/{project.id}/tasks/next").json()
    assert task["prompt"]["text"] == "Name a prime number above 10."  # task 101 already has its 2 rankings
    client.post(f"/api/projects/{project.id}/rankings", json={
        "assignment_id": task["assignment_id"], "tiers": [[c["id"]] for c in task["completions"]],
        "rubric_version": task["rubric"]["version"], "submission_id": "s1"})
    assert client.get(f"/api/projects/{project.id}/tasks/next").status_code == 204


def test_the_import_page_takes_a_preset_and_reports_extra_columns(
    db: Session, make_user: Callable[..., Any], make_project: Callable[..., Any], browser: Callable[[], Any],
):
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    db.commit()
    person = browser()
    person.login(lead.email)
    page = person.get(f"/projects/{project.id}/import")
    assert '<option value="label-studio">label-studio</option>' in page.text
    response = person.post(f"/projects/{project.id}/import", {"preset": "ultrafeedback", "on_duplicate": "error"},
                           files={"file": ("uf.jsonl", sample("ultrafeedback.jsonl"), "application/x-ndjson")})
    assert response.status_code == 201, response.text
    assert "read as <code>ultrafeedback</code>" in response.text and "kept 1 extra column: prompt_id" in response.text
    response = person.post(f"/projects/{project.id}/import", {"strict": "on", "on_duplicate": "error"}, files={
        "file": ("x.jsonl", jsonl({"prompt": "p", "chosen": "a", "rejected": "b", "origin": "web"}), "text/plain")})
    assert response.status_code == 422 and "<code>origin</code>" in response.text


# --- step-labelled data: TRL stepwise supervision and PRM800K ---------------------------------------


def _labels_by_completion(db: Session, project: Project) -> dict[tuple[str, str], list[int]]:
    """(completion text, "human"/"imported" + annotator email) → labels in step order."""
    rows = db.execute(select(Completion.text, Ranking.source, User.email, StepLabel.label)
                      .join(StepLabel, StepLabel.completion_id == Completion.id)
                      .join(Ranking, StepLabel.ranking_id == Ranking.id)
                      .outerjoin(User, Ranking.annotator_id == User.id)
                      .where(Ranking.project_id == project.id)
                      .order_by(Completion.id, Ranking.id, StepLabel.step_index)).all()
    out: dict[tuple[str, str], list[int]] = {}
    for text, source, email, label in rows:
        out.setdefault((text, email or source), []).append(label)
    return out


def test_trl_stepwise_rows_become_step_labelled_completions(db: Session, project: Project, lead: Any):
    steps.set_options(db, project, lead, enabled=True, separator=None)
    result = import_file(db, project, "s.jsonl", sample("trl_stepwise.jsonl"), actor=lead)
    assert (result.preset, result.prompts, result.completions, result.pairs, result.rankings, result.step_labels) == (
        "trl-stepwise", 2, 3, 0, 2, 7)
    stored = dict(db.execute(select(Completion.text, Completion.steps).join(Prompt)
                             .where(Prompt.project_id == project.id)).all())
    text = "12 * 3 = 12 + 12 + 12.\n12 + 12 = 24.\n24 + 12 = 38."
    assert stored[text] == ["12 * 3 = 12 + 12 + 12.", "12 + 12 = 24.", "24 + 12 = 38."] == steps.split(text)
    assert _labels_by_completion(db, project)[(text, "imported")] == [1, 1, -1]
    # Both solutions of one prompt are step-labelled in one imported ranking that ties them: no pairs.
    ranking = db.scalars(select(Ranking).join(Prompt).where(Prompt.text.like("Which number%"))).one()
    assert (ranking.source, len(ranking.tiers), len(ranking.tiers[0])) == ("imported", 1, 2)
    assert db.scalar(select(func.count()).select_from(Pair).where(Pair.prompt_id == ranking.prompt_id)) == 0


def test_imported_steps_rejoin_for_a_regex_separator(db: Session, project: Project, lead: Any):
    steps.set_options(db, project, lead, enabled=True, separator=r"\n\n")
    row = {"prompt": "2+2?", "completions": ["Two and two:\nadd them.", "That is 4."], "labels": [True, True]}
    import_file(db, project, "s.jsonl", jsonl(row), actor=lead, preset="trl-stepwise")
    text, stored = db.execute(select(Completion.text, Completion.steps).join(Prompt)
                              .where(Prompt.project_id == project.id)).one()
    assert stored == row["completions"] == steps.split(text, r"\n\n")


def test_prm800k_rows_become_step_labels_by_pseudonymous_labellers(db: Session, project: Project, lead: Any):
    steps.set_options(db, project, lead, enabled=True, separator=None)
    result = import_file(db, project, "prm.jsonl", sample("prm800k.jsonl"), actor=lead)
    assert (result.preset, result.prompts, result.completions, result.rankings, result.annotators) == (
        "prm800k", 2, 3, 4, 2)
    labels = _labels_by_completion(db, project)
    first, second = ("prm800k-340d89bc-f5b7-45e9-b272-909ba68ee363@imported.invalid",
                     "prm800k-e90a38f3-3135-4465-87af-3e6322e3d772@imported.invalid")
    asymptotes = db.scalars(select(Completion).join(Prompt).where(Prompt.text.like("How many%"))).one()
    # Two labellers rated the same path: one completion, and step agreement compares them.
    assert labels[(asymptotes.text, first)] == [1, 1, 1] and labels[(asymptotes.text, second)] == [1, 0, 1]
    assert asymptotes.steps[-1] == "# Answer\n\n2"  # a step of several lines is stored as given
    # The labeller's own step replaces the rejected ones; a run that found an error ends at it.
    sums = {tuple(c.steps): c for c in db.scalars(select(Completion).join(Prompt).where(Prompt.text.like("What%")))}
    assert set(sums) == {("$1+2=3$.", "$3+3=6$.", "# Answer\n\n6"), ("$1+2=3$.", "$3+3=5$.")}
    assert labels[("$1+2=3$.\n$3+3=5$.", second)] == [1, -1]
    prompt = db.get(Prompt, asymptotes.prompt_id)
    assert prompt.reference == "2" and prompt.meta["is_quality_control_question"] is False
    report = step_agreement.report(db, project)
    assert (report.shared_completions, report.compared_steps, report.first_error_agreement) == (1, 3, 1.0)
    users = db.execute(select(User.email, User.active).where(User.email.like("prm800k-%"))).all()
    assert sorted(users) == [(first, False), (second, False)]


def _prm_row(**label: Any) -> dict[str, Any]:
    return {"labeler": "L1", "timestamp": "2022-07-17T16:56:51", "question": {"problem": "1+1?",
                                                                              "ground_truth_answer": "2"},
            "label": {"steps": [{"completions": [{"text": "1+1=2.", "rating": 1}], "chosen_completion": 0}],
                      "finish_reason": "solution"} | label}


def test_bad_step_rows_name_their_line_and_field_and_write_nothing(db: Session, project: Project, lead: Any):
    steps.set_options(db, project, lead, enabled=True, separator=None)
    db.commit()
    bad_trl = jsonl({"prompt": "a?", "completions": ["x", "y", "z", "w"], "labels": [True, False, True]},
                    {"prompt": "b?", "completions": ["x", ""], "labels": [True, False]},
                    {"prompt": "c?", "completions": ["x"], "labels": [1]})
    assert errors(lambda: import_file(db, project, "s.jsonl", bad_trl, actor=lead, preset="trl-stepwise")) == [
        (1, "labels", "3 labels for 4 steps (preset trl-stepwise)"),
        (2, "completions.1", "must not be empty"),
        (3, "labels.0", "must be true or false, got 1 (preset trl-stepwise)")]
    twice = jsonl({"prompt": "d?", "completions": ["x"], "labels": [True]},
                  {"prompt": "d?", "completions": ["x"], "labels": [False]})
    assert errors(lambda: import_file(db, project, "s.jsonl", twice, actor=lead)) == [
        (2, "steps", "line 1 has the same prompt and steps, labelled by the dataset; keep one of the two")]
    two = {"completions": [{"text": "a", "rating": 1}, {"text": "b", "rating": -1}], "chosen_completion": 5}
    bad_prm = jsonl(_prm_row(), _prm_row(steps=[{"completions": [{"text": "a", "rating": 2}],
                                                 "chosen_completion": 0}]),
                    _prm_row(steps=[two, two]), {"question": {"problem": "x"}, "label": {}})
    assert errors(lambda: import_file(db, project, "p.jsonl", bad_prm, actor=lead)) == [
        (2, "label.steps.0.completions.0.rating", "must be -1, 0 or 1, got 2 (preset prm800k)"),
        (3, "label.steps.0.chosen_completion", "5 is not an index into the step's 2 completions (preset prm800k)"),
        (4, "labeler", "missing; a PRM800K row has question, label and labeler (preset prm800k)")]
    db.rollback()
    assert db.scalar(select(func.count()).select_from(Prompt).where(Prompt.project_id == project.id)) == 0
    assert db.scalar(select(func.count()).select_from(StepLabel)) == 0


def test_step_labels_need_a_project_that_labels_steps(db: Session, project: Project, lead: Any):
    assert errors(lambda: import_file(db, project, "p.jsonl", sample("prm800k.jsonl"), actor=lead))[0][:2] == (
        0, "preset")


def test_the_api_takes_the_step_presets_and_counts_step_labels(
    db: Session, api: Callable[..., Any], token_for: Callable[..., str], project: Project, lead: Any
):
    steps.set_options(db, project, lead, enabled=True, separator=None)
    client = api(token_for(db, lead))
    db.commit()
    response = client.post(f"/api/projects/{project.id}/imports?preset=prm800k",
                           files={"file": ("p.jsonl", sample("prm800k.jsonl"), "application/x-ndjson")})
    assert response.status_code == 201, response.text
    assert (response.json()["preset"], response.json()["step_labels"], response.json()["rankings"]) == (
        "prm800k", 11, 4)


def test_imported_trl_stepwise_rows_come_back_out_of_a_steps_export(
    db: Session, app: Any, api: Callable[..., Any], token_for: Callable[..., str], project: Project, lead: Any,
    tmp_path: Path,
):
    from tests.app.test_exports import _download, _export

    steps.set_options(db, project, lead, enabled=True, separator=None)
    import_file(db, project, "s.jsonl", sample("trl_stepwise.jsonl"), actor=lead)
    client = api(token_for(db, lead))
    db.commit()
    out = _export(client, app, project.id, kind="steps", format="jsonl")
    exported = [json.loads(line) for line in (_download(client, out, tmp_path) / "steps.jsonl").read_text().splitlines()]
    original = [json.loads(line) for line in sample("trl_stepwise.jsonl").decode().splitlines()]
    def upto_first_error(row: dict[str, Any]) -> tuple[str, list[str], list[bool]]:
        end = row["labels"].index(False) + 1 if False in row["labels"] else len(row["labels"])
        return row["prompt"], row["completions"][:end], row["labels"][:end]  # an export row ends at its first −1

    assert sorted(upto_first_error(r) for r in exported) == sorted(upto_first_error(r) for r in original)
    assert {r["source"] for r in exported} == {"imported"}


def test_cli_import_reads_prm800k_and_counts_step_labels(db: Session, app: Any, project: Project, lead: Any,
                                                          monkeypatch: Any, database_url: str):
    from typer.testing import CliRunner

    from app.cli import cli

    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))
    steps.set_options(db, project, lead, enabled=True, separator=None)
    db.commit()
    result = CliRunner().invoke(cli, ["import", str(project.id), str(PRESETS / "prm800k.jsonl"), "--preset", "prm800k"])
    assert result.exit_code == 0, result.output
    assert "4 rankings by 2 annotators, 11 step labels (preset prm800k)" in result.output
