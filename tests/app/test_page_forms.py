"""Page forms: parsed into the JSON API's models, refusals shown again with the field's visible label and what the
user typed; and the one place that builds a finished policy's sampling request (the page, the API, the iteration)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from app.judge import sampling
from app.models import Completion, Job, Prompt, TrainingRun
from app.platform.errors import Invalid
from app.projects import projects
from app.runs import iteration, training_runs
from app.schemas import SamplingJobIn
from app.web.forms import (
    ConstitutionForm,
    EndpointForm,
    ExportForm,
    ProjectForm,
    RankingForm,
    SamplingForm,
    field_error,
    validation_field,
)

# --- the form models ------------------------------------------------------------------------------------------


def test_a_form_becomes_the_api_model_with_the_same_fields() -> None:
    body = ProjectForm(name="p", completions_per_prompt=3, overlap=2, rubric="Be right.",
                       criteria="- Correct\n\n  Kind ").to_api()
    assert body.model_dump() == {"name": "p", "completions_per_prompt": 3, "overlap": 2, "description": "",
                                 "rubric": {"text": "Be right.", "criteria": ["Correct", "Kind"]}}


def test_the_csrf_token_is_accepted_and_never_echoed_but_unknown_fields_are_refused() -> None:
    form = ProjectForm.model_validate({"csrf_token": "t" * 64, "name": "p"})
    assert "csrf_token" not in form.values()
    with pytest.raises(ValidationError):
        ProjectForm.model_validate({"name": "p", "is_admin": "1"})  # no mass assignment


def test_checkboxes_count_only_when_ticked_and_secrets_are_not_echoed() -> None:
    base = {"name": "n", "base_url": "http://10.0.0.1:8000/v1", "model": "m", "api_key": "sk-secret"}
    assert EndpointForm.model_validate(base).to_api().allow_private is False
    ticked = EndpointForm.model_validate(base | {"allow_private": "on"})
    assert ticked.to_api().allow_private is True and ticked.to_api().api_key == "sk-secret"
    assert "api_key" not in ticked.values()


def test_errors_name_the_field_as_the_api_does_with_the_label_the_page_shows() -> None:
    form = ProjectForm(name="p", completions_per_prompt=40, rubric="r")
    with pytest.raises(ValidationError) as caught:
        form.to_api()
    error = form.error(caught.value)
    assert (error.field, error.label, error.status_code) == (
        "completions_per_prompt", "Completions per prompt (K)", 422)
    nested = ProjectForm(name="p", rubric="")
    with pytest.raises(ValidationError) as caught:
        nested.to_api()
    assert nested.error(caught.value).label == "Rubric (Markdown)"  # rubric.text, labelled by its enclosing field
    service = form.error(Invalid("no such user", field="email"))
    assert service.label is None and service.field == "email" and str(service) == "email: no such user"


def test_a_generator_backend_is_not_part_of_the_field_name() -> None:
    with pytest.raises(ValidationError) as caught:
        SamplingJobIn.model_validate({"generator": {"backend": "hf", "model": "/m", "temperature": -1}})
    assert validation_field(caught.value)[0] == "generator.temperature"
    form = SamplingForm(model="/m", temperature="-1")
    with pytest.raises(ValidationError) as caught:
        form.to_api()
    error = field_error(caught.value, form.label)
    assert (error.field, error.label) == ("generator.temperature", "Temperature")


def test_export_form_sends_only_the_filters_its_kind_understands() -> None:
    form = ExportForm(kind="prompts", format="jsonl", source=["human"], split="train", aggregation="aggregated")
    body = form.to_api()
    assert body.filters == {"split": "train"} and body.aggregation == "raw"
    pairs = ExportForm(kind="pairs", format="hf", min_agreement="0.5").to_api()
    assert pairs.filters == {"split": "", "source": [], "rubric_versions": "", "flagged": "include",
                             "min_agreement": "0.5"}


def test_constitution_fieldsets_are_read_in_order_and_blank_ones_left_out() -> None:
    form = ConstitutionForm.model_validate({
        "base_version": "0", "note": "n", "p-1-name": "second", "p-1-comparison": "Which?", "p-1-priority": "",
        "p-0-name": "first", "p-0-comparison": "Which first?", "p-0-priority": "7", "p-2-name": "", "p-2-comparison": ""})
    body = form.to_api()
    assert [(p.name, p.priority) for p in body.principles] == [("first", 7), ("second", 2)]
    assert body.base_version is None
    assert form.label("principles.1.comparison") == "Principle 2: Comparison question"
    with pytest.raises(ValidationError):
        ConstitutionForm.model_validate({"q-0-name": "x"})  # only the principle fieldsets are gathered


def test_ranking_form_reads_ranks_ties_flags_and_the_timer() -> None:
    form = RankingForm.model_validate({"assignment_id": "5", "rubric_version": "2", "submission_id": "s",
                                       "rank_11": "2", "rank_12": "1", "rank_13": "2", "rank_14": "",
                                       "flag_12": ["unsafe", "refusal"], "flag_13": "unsafe",
                                       "seconds_spent": "nan"})
    body = form.ranking(form.assignment(), [11, 12, 13, 14])
    assert body.tiers == [[12], [11, 13]] and body.flags == {"12": ["unsafe", "refusal"], "13": ["unsafe"]}
    assert body.seconds_spent is None and body.skipped is False and body.skip_reason is None
    with pytest.raises(Invalid) as caught:
        RankingForm.model_validate({"assignment_id": "5", "rank_11": "9"}).tiers([11, 12])
    assert caught.value.field == "rank_11"
    with pytest.raises(Invalid):
        RankingForm().assignment()


# --- pages ----------------------------------------------------------------------------------------------------


def test_a_refused_project_form_shows_the_label_and_keeps_what_was_typed(db, make_user, browser) -> None:
    lead = make_user(db, "lead")
    db.commit()
    page = browser()
    page.login(lead.email)
    bad = page.post("/projects", {"name": "Kept name", "completions_per_prompt": "40", "overlap": "1",
                                  "rubric": "My rubric text", "criteria": "Mine"})
    assert bad.status_code == 422
    assert '<strong>Completions per prompt (K)</strong>' in bad.text and 'data-field="completions_per_prompt"' in bad.text
    assert 'value="Kept name"' in bad.text and "My rubric text" in bad.text and 'value="40"' in bad.text
    assert page.post("/projects", {"name": "x", "rubric": "r", "surprise": "1"}).status_code == 422


def test_the_ranking_page_shows_a_bad_rank_again_with_what_was_ranked(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    prompt = Prompt(project_id=project.id, text="question", text_hash="h-form", split="train")
    db.add(prompt)
    db.flush()
    db.add_all(Completion(prompt_id=prompt.id, text=f"answer {j}") for j in range(2))
    db.commit()
    url = f"/projects/{project.id}/annotate"
    page = browser()
    page.login(lead.email)
    task = page.get(url)  # leases the task; its form names the assignment and the completions
    assert task.status_code == 200
    assignment_id = re.search(r'name="assignment_id" value="(\d+)"', task.text).group(1)  # type: ignore[union-attr]
    ids = sorted(int(i) for i in re.findall(r'name="rank_(\d+)"', task.text))
    form = {"assignment_id": assignment_id, "rubric_version": "1", "submission_id": "s1",
            f"rank_{ids[0]}": "1", f"rank_{ids[1]}": "7", f"flag_{ids[0]}": "unsafe"}
    bad = page.post(url, form)
    assert bad.status_code == 422 and f'data-field="rank_{ids[1]}"' in bad.text and "from 1 to 2" in bad.text
    htmx = page.post(url, form, headers={"hx-request": "true"})
    assert htmx.status_code == 422 and htmx.json()["detail"][0]["field"] == f"rank_{ids[1]}"
    assert htmx.json()["detail"][0]["label"] == "Rank"  # what the page shows, not the field's path
    # A hidden field's refusal (the rubric changed under the task) reads as a sentence, with no field name.
    stale = form | {f"rank_{ids[1]}": "2", "rubric_version": "9", "submission_id": "s0"}
    shown = page.post(url, stale)
    assert shown.status_code == 422 and 'data-field="rubric_version">the rubric changed' in shown.text
    assert page.post(url, stale, headers={"hx-request": "true"}).json()["detail"][0]["label"] == ""
    assert page.post(url, form | {f"rank_{ids[1]}": "2"}).status_code == 303


# --- a finished policy's sampling request -------------------------------------------------------------------


def _policy_run(db, project, tmp_path: Path, **resolved: object) -> TrainingRun:  # type: ignore[no-untyped-def]
    """A succeeded GRPO run whose model directory passes the worker's up-front check (config + safetensors)."""
    import numpy as np
    from safetensors.numpy import save_file

    model_dir = tmp_path / "policy" / "model"
    model_dir.mkdir(parents=True)
    (model_dir / "config.json").write_text(json.dumps({"model_type": "gpt2"}))
    save_file({"w": np.zeros(1, dtype=np.float32)}, str(model_dir / "model.safetensors"))
    run = TrainingRun(project_id=project.id, kind="grpo", state="succeeded", model_dir=str(model_dir),
                      config={"user": {}, "resolved": resolved})
    db.add(run)
    db.add(Prompt(project_id=project.id, text="q", text_hash=f"policy-{project.id}", split="train"))
    db.flush()
    return run


def test_a_policy_samples_with_its_own_length_and_temperature_unless_told(db, make_user, make_project,
                                                                           tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    run = _policy_run(db, project, tmp_path, temperature=0.7, max_new_tokens=12)
    assert sampling.policy_generator(run) == {"backend": "hf", "model": run.model_dir, "max_new_tokens": 12,
                                              "temperature": 0.7}
    assert sampling.policy_generator(run, max_new_tokens=5, temperature=0.0)["temperature"] == 0.0
    job = training_runs.sample_into_project(db, run, lead, k=None, seed=3, new_round=True)
    assert job.payload["generator"]["temperature"] == 0.7 and job.payload["generator"]["max_new_tokens"] == 12
    assert job.payload["source"] == f"policy:{run.id}" and project.current_round == 2


def test_the_iterations_sampling_job_carries_the_policys_temperature(db, make_user, make_project, tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    run = _policy_run(db, project, tmp_path, temperature=0.3, max_new_tokens=9)
    # The round's last step: the new policy finished training, so its answers become the next round.
    finished = Job(kind="train", project_id=project.id, state="succeeded", payload={
        "iteration": {"step": "policy", "actor_id": lead.id, "new_policy_run_id": run.id, "k": 2}})
    db.add(finished)
    db.flush()
    nxt = iteration.advance(db, finished, tmp_path)
    assert nxt is not None and nxt.kind == "sample_completions"
    assert nxt.payload["generator"]["temperature"] == 0.3 and nxt.payload["generator"]["max_new_tokens"] == 9
    assert nxt.payload["k"] == 2 and nxt.payload["source"] == f"policy:{run.id}"
    assert projects.get_visible(db, project.id, lead).current_round == 2
