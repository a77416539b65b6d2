"""Check 12: models load only from safetensors; a checkpoint carrying a pickle payload is refused, unrun.

The fixture is a real model directory whose only weights are a `pytorch_model.bin` made by `torch.save`, with
an object whose `__reduce__` creates a marker file when unpickled. A control shows the payload is live (a plain
`torch.load` runs it); then every loader, in `training/` and through the app, must refuse the directory with a
message that says why, and the marker must never appear.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.security.world import World
from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2


class Payload:
    """Unpickling this opens (so creates) `marker`: stands in for any code a hostile checkpoint would run."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return open, (str(self.marker), "w")


@pytest.fixture(scope="module")
def clean_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tokenizer = char_tokenizer()
    return save_tiny(tiny_gpt2(tokenizer, n_positions=32), tokenizer, tmp_path_factory.mktemp("clean") / "model")


def _poisoned(clean: Path, target: Path, marker: Path, keep_safetensors: bool = False) -> Path:
    shutil.copytree(clean, target)
    state: dict[str, Any] = dict(_state(clean))
    state["__payload__"] = Payload(marker)
    torch.save(state, target / "pytorch_model.bin")
    if not keep_safetensors:
        (target / "model.safetensors").unlink()
    return target


def _state(model_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return dict(load_file(str(model_dir / "model.safetensors")))


@pytest.fixture
def marker(tmp_path: Path) -> Path:
    return tmp_path / "payload-ran"


@pytest.fixture
def poisoned(clean_dir: Path, tmp_path: Path, marker: Path) -> Path:
    return _poisoned(clean_dir, tmp_path / "poisoned", marker)


def test_the_payload_is_live(poisoned: Path, marker: Path) -> None:
    # The control: an unsafe load really runs it, so "the marker never appeared" below means something.
    torch.load(poisoned / "pytorch_model.bin", weights_only=False)  # nosec B614 - the point of the control
    assert marker.exists()


def _params() -> Any:
    from training.generation import GenerationParams

    return GenerationParams(max_new_tokens=2)


def _refusals() -> list[tuple[str, Any]]:
    from training.generation import HFGenerator, make_generator
    from training.policy import load_policy
    from training.reward_model import RewardConfig, RewardModel, train_reward_model
    from training.value_head import load_critic

    return [
        ("load_policy", lambda d, out: load_policy(d)),
        ("load_critic", lambda d, out: load_critic(d)),
        ("RewardModel.load", lambda d, out: RewardModel.load(d)),
        ("train_reward_model", lambda d, out: train_reward_model(RewardConfig(model=str(d)), [], None, out)),
        ("HFGenerator.check", lambda d, out: HFGenerator(d).check()),
        ("hf generator", lambda d, out: make_generator({"backend": "hf", "model": str(d)}).generate(["1+1="], 1, _params())),
    ]


@pytest.mark.parametrize("name", [name for name, _ in _refusals()])
def test_every_training_loader_refuses_pickle_weights(name: str, poisoned: Path, marker: Path, tmp_path: Path) -> None:
    from training.generation import GenerationError

    load = dict(_refusals())[name]
    with pytest.raises((ValueError, GenerationError), match=r"pickled weights \(pytorch_model.bin\).*unpickling can run arbitrary code"):
        load(poisoned, tmp_path / "out")
    assert not marker.exists()


def test_transformers_itself_refuses_the_fallback_under_safe_load(poisoned: Path, marker: Path) -> None:
    from transformers import AutoModelForCausalLM

    from training.weights import SAFE_LOAD

    with pytest.raises(OSError, match="model.safetensors"):
        AutoModelForCausalLM.from_pretrained(poisoned, **SAFE_LOAD)
    assert not marker.exists()


def test_safetensors_beside_a_pickle_are_used_and_the_pickle_is_never_read(clean_dir: Path, tmp_path: Path,
                                                                           marker: Path) -> None:
    from training.generation import HFGenerator
    from training.policy import load_policy
    from training.value_head import load_critic

    both = _poisoned(clean_dir, tmp_path / "both", marker, keep_safetensors=True)
    model, _ = load_policy(both)
    assert torch.equal(model.state_dict()["transformer.wte.weight"], _state(clean_dir)["transformer.wte.weight"])
    load_critic(both)
    HFGenerator(both).generate(["1+1="], 1, _params())
    assert not marker.exists()


def test_trainer_state_is_read_with_weights_only(tmp_path: Path, marker: Path) -> None:
    # GRPO and PPO resume from trainer.pt with torch.load(..., weights_only=True) (the static scan in
    # test_auth_csrf_ssrf.py holds every torch.load to that); this is what that flag does with a payload.
    path = tmp_path / "trainer.pt"
    torch.save({"optimizer": {}, "evil": Payload(marker)}, path)
    with pytest.raises(Exception, match="Weights only load failed"):
        torch.load(path, map_location="cpu", weights_only=True)
    assert not marker.exists()


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_the_app_refuses_a_pickle_model_before_any_job(client: Any, world: World, poisoned: Path, marker: Path,
                                                       clean_engine: Any) -> None:
    from tests.security.test_object_access import snapshot

    before = snapshot(clean_engine, world)
    lead, project = world.headers("lead"), world.a.project_id
    spec = {"backend": "hf", "model": str(poisoned)}
    for path, body in ((f"/api/projects/{project}/sampling-jobs", {"generator": spec}),
                       (f"/api/projects/{project}/judge-runs", {"generator": spec}),
                       (f"/api/projects/{project}/revision-jobs", {"generator": spec})):
        response = client.post(path, json=body, headers=lead)
        assert response.status_code == 422, response.text
        item = response.json()["detail"][0]
        assert item["field"] == "generator.model" and "pickle" in item["message"], item
    page = client.post(f"/projects/{project}/jobs/sample", data={"backend": "hf", "model": str(poisoned)},
                       headers=lead)
    assert page.status_code == 422 and "pickle" in page.text
    run = client.post(f"/api/projects/{project}/training-runs", headers=lead,
                      json={"kind": "reward", "export_id": world.a.export_id, "base_model": str(poisoned)})
    assert run.status_code == 422 and run.json()["detail"][0]["field"] == "base_model", run.text
    assert "pickle" in run.json()["detail"][0]["message"]
    assert snapshot(clean_engine, world) == before
    assert not marker.exists()
