"""Refusals speak to people: the form's visible label instead of the API's dotted path, plain words instead of
pydantic's type talk, no label for a hidden field, and "blank: the endpoint's default" holds where a label says so."""

from __future__ import annotations

import re

import pytest
from pydantic import ValidationError

from app.judge import endpoints
from app.platform.crypto import Keyring
from app.platform.errors import Invalid
from app.platform.settings import Settings
from app.schemas import JudgeRunIn
from app.web.forms import JudgeForm, TrainingForm


def _alert(html: str) -> str:
    match = re.search(r'<p class="error" role="alert"[^>]*>(.*?)</p>', html, re.S)
    assert match, "no error shown"
    return match.group(1)


def test_a_blank_local_model_says_what_to_do_by_its_label(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    db.commit()
    page = browser()
    page.login(lead.email)
    r = page.post(f"/projects/{project.id}/judge/runs", {"backend": "hf", "model": "", "mode": "logprob",
                                                         "principles": "sample", "seed": "0"})
    assert r.status_code == 422
    alert = _alert(r.text)
    assert alert.startswith("<strong>Model</strong>: give the path of a local model directory, or choose a model "
                            "endpoint")
    assert "generator.model" not in alert and "String should" not in alert


def test_a_chosen_endpoint_with_a_blank_model_uses_its_default(db, make_user, make_project, browser, tmp_path) -> None:
    admin, lead = make_user(db, "admin"), make_user(db, "lead")
    project = make_project(db, lead=lead)
    keyring = Keyring(Settings(data_dir=tmp_path))  # no key is stored: any keyring will do
    endpoint = endpoints.create(db, admin, keyring, name="vLLM", base_url="http://10.1.2.3:8000/v1", model="qwen",
                                allow_private=True)
    db.commit()
    page = browser()
    page.login(lead.email)
    # The local-directory choice is left as it was; the endpoint is picked and the model left blank.
    r = page.post(f"/projects/{project.id}/judge/runs", {"backend": "hf", "model": "", "endpoint_id": str(endpoint.id),
                                                         "mode": "logprob", "principles": "sample", "seed": "0"})
    assert r.status_code == 303, _alert(r.text)
    assert JudgeForm(backend="hf", endpoint_id=str(endpoint.id)).generator() == {
        "backend": "openai", "model": None, "endpoint_id": str(endpoint.id), "base_url": None, "api_key": None}


def test_an_edit_conflict_names_no_hidden_field(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, rubric="one")
    db.commit()
    page = browser()
    page.login(lead.email)
    page.get(f"/projects/{project.id}/rubric")
    assert page.post(f"/projects/{project.id}/rubric", {"text": "two", "base_version": "1"}).status_code == 303
    stale = page.post(f"/projects/{project.id}/rubric", {"text": "three", "base_version": "1"})
    alert = _alert(stale.text)
    assert stale.status_code == 409 and alert.startswith("the rubric changed since you started editing")
    assert "base_version" not in alert and "<strong>" not in alert
    assert 'data-field="base_version"' in stale.text  # still there for scripts, not for people


def test_a_config_key_is_named_with_the_config_label() -> None:
    error = TrainingForm().error(Invalid("unknown reward config field", field="config.steps"))
    assert str(error) == "Config (TOML), steps: unknown reward config field"
    assert TrainingForm().error(Invalid("choose an export", field="export_id")).label == "Export"


@pytest.mark.parametrize(("body", "message"), [
    ({"generator": {"backend": "hf", "model": ""}}, "must not be blank"),
    ({"generator": {"backend": "hf", "model": "m"}, "seed": "x"}, "must be a whole number"),
    ({"generator": {"backend": "hf", "model": "m"}, "low_confidence": 2}, "must be at most 1"),
])
def test_type_errors_are_said_in_plain_words(body: dict, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        JudgeRunIn.model_validate(body)
    assert JudgeForm().error(caught.value).message.startswith(message)


@pytest.mark.parametrize("path", ["judge-runs", "revision-jobs"])
def test_a_body_naming_a_missing_constitution_version_is_a_422_on_that_field(db, make_user, make_project, token_for,
                                                                              api, path: str) -> None:
    # 404 is for what the path names; a body's dangling version is bad input, and a generated client shows it so.
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    client = api(token_for(db, lead))
    db.commit()
    r = client.post(f"/api/projects/{project.id}/{path}", json={
        "generator": {"backend": "hf", "model": "/nonexistent"}, "constitution_version": 7})
    assert r.status_code == 422, r.text
    assert r.json()["detail"][0]["field"] == "constitution_version"
