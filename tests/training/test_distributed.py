"""SFT and DPO data-parallel: 2 CPU processes (gloo) follow the 1-process loss curve with the same global batch.

Every process takes a strided share of each global batch; SFT divides by the global batch's target-token count and
DPO weights by the global batch's pair weights, so DDP's mean of the processes' gradients is the one-process
gradient. Uneven shares make that matter: a token mean per process would weight a short answer's tokens more.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.training.tiny import addition_split, char_tokenizer, save_tiny, tiny_gpt2
from training.policy import prepare_tokenizer
from training.run_info import read_metrics

REPO = Path(__file__).resolve().parents[2]


def _run(command: list[str], out: Path) -> list[float]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO), TOKENIZERS_PARALLELISM="false")
    done = subprocess.run(command + ["--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return [r["loss"] for r in read_metrics(out / "metrics.jsonl")]


@pytest.mark.slow
@pytest.mark.parametrize("method", ["sft", "dpo"])
def test_two_processes_follow_the_one_process_curve(tmp_path, method):
    tok = prepare_tokenizer(char_tokenizer())
    model = save_tiny(tiny_gpt2(tok, seed=4), tok, tmp_path / "model")
    data = tmp_path / "data.jsonl"
    with data.open("w") as fh:
        for q, a in addition_split(48, 0, seed=5)[0]:  # answers of 1 and 2 digits: uneven token counts
            row = {"prompt": q, "completion": a} if method == "sft" else {"prompt": q, "chosen": a,
                                                                          "rejected": str(int(a) + 1)}
            fh.write(json.dumps(row) + "\n")
    args = ["-m", "training", method, "--train", str(data), "--model", str(model), "--quiet"]
    for item in ("batch_size=8", "steps=8", "lr=3e-3", "lr_schedule=linear", "mixed_precision=no",
                 "group_by_length=false"):
        args += ["--set", item]
    launch = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
              "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    two = _run(launch + args, tmp_path / "two")
    one = _run([sys.executable] + args, tmp_path / "one")
    assert json.loads((tmp_path / "two" / "run.json").read_text())["processes"] == 2
    assert len(one) == len(two) == 8 and one[-1] != one[0]  # the curve moves, so agreeing along it means something
    assert two == pytest.approx(one, rel=1e-3, abs=1e-4)
