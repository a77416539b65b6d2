"""Experiment trackers: TensorBoard and MLflow (its local SQLite store, offline) get every logged step, and a resumed run
continues the same MLflow run."""

from __future__ import annotations

import json

import pytest

from tests.training.tiny import addition_split, char_tokenizer, save_tiny, tiny_gpt2
from training.policy import prepare_tokenizer
from training.sft import main


@pytest.mark.slow
def test_tensorboard_and_mlflow_receive_every_step_and_a_resume_continues_the_mlflow_run(tmp_path, monkeypatch):
    from mlflow.tracking import MlflowClient
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    tok = prepare_tokenizer(char_tokenizer())
    model = save_tiny(tiny_gpt2(tok), tok, tmp_path / "base")
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps({"prompt": p, "completion": a}) + "\n" for p, a in addition_split(16, 0)[0]))
    out = tmp_path / "run"
    common = ["--train", str(data), "--model", str(model), "--out", str(out), "--set", "batch_size=4",
              "--set", 'report_to=["tensorboard", "mlflow"]', "--set", "save_every=2", "--set", "run_name=sft-a",
              "--quiet"]
    assert main(common + ["--set", "steps=2"]) == 0
    first = json.loads((out / "trackers.json").read_text())
    assert main(common + ["--set", "steps=4", "--resume"]) == 0
    found = json.loads((out / "trackers.json").read_text())

    assert found["mlflow"]["run_id"] == first["mlflow"]["run_id"]  # the resumed run logged into the same MLflow run
    assert found["mlflow"]["tracking_uri"] == f"sqlite:///{(out / 'mlflow.db').resolve()}"
    assert "mlflow ui --backend-store-uri" in found["mlflow"]["command"]
    client = MlflowClient(found["mlflow"]["tracking_uri"])
    history = client.get_metric_history(found["mlflow"]["run_id"], "loss")
    assert sorted(m.step for m in history) == [1, 2, 3, 4]
    params = client.get_run(found["mlflow"]["run_id"]).data.params
    assert params["batch_size"] == "4" and params["run_name"] == "sft-a"

    events = EventAccumulator(found["tensorboard"]["logdir"])
    events.Reload()
    assert {e.step for e in events.Scalars("loss")} == {1, 2, 3, 4}
