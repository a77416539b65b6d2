"""This machine's speed on one model, measured in a few seconds: the unit costs `training.estimate` prices a run's
work at (the training form's time estimate, said before a run starts).

`python -m training speed --model DIR --out speed.json` loads the model as a trainer would (on the GPU when there
is one), then times what every run is made of: a forward pass without gradients, a forward and backward pass, an
AdamW step over every weight, decoding with a KV cache at two batch sizes (a step's fixed cost and each row's
share), and saving the model. It also notes how the model's tokenizer counts text (characters per token, the chat
template's tokens around a prompt), so the estimate can turn an export's text into tokens without a tokenizer.
`--encoder` measures a reward model's encoder (no decoding); no `--model` then means the shipped MiniLM.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

BATCH = 4
"""Rows of the timed forward and backward passes."""
SEQUENCE = 128
"""Tokens per row of those passes."""
PROMPT = 64
"""Prompt tokens before the timed decoding."""
DECODE_STEPS = 24
"""Tokens decoded per timing."""
DECODE_ROWS = (2, 16)
"""The two batch sizes decoding is timed at: the line through them splits a step's cost into a fixed part and a
part per row."""
SAMPLE_TEXT = (
    "Natalia sold clips to 48 of her friends in April, and then she sold half as many clips in May. How many clips "
    "did Natalia sell altogether in April and May? Natalia sold 48/2 = 24 clips in May. Natalia sold 48+24 = 72 "
    "clips altogether in April and May. The answer is 72."
)
"""Ordinary English with numbers, the text the estimate's characters-per-token figure is taken on."""


def measure(model_dir: str | Path | None, *, encoder: bool = False) -> dict[str, Any]:
    """Time the pieces of a run on `model_dir` (a causal LM, or with `encoder` a reward model's encoder) here.

    Returns the unit costs in seconds (`start_s`, `forward_token_s`, `train_token_s`, `optimizer_s`,
    `decode_step_s`, `decode_row_s`, `save_s`), the tokenizer's `chars_per_token` and `template_tokens`, and what
    they were measured on (device, threads, parameters, host, time)."""
    started = time.perf_counter()
    import torch

    model, tokenizer, path = _load(model_dir, encoder)
    device = next(model.parameters()).device
    start_s = time.perf_counter() - started
    vocab = int(model.get_input_embeddings().num_embeddings)
    ids = torch.randint(10, max(11, vocab - 10), (BATCH, SEQUENCE), device=device)
    forward_token_s = _forward(model, ids) / ids.numel()
    train_token_s, optimizer_s = _train(model, ids)
    decode_step_s = decode_row_s = 0.0
    if not encoder:
        decode_step_s, decode_row_s = _decode(model, tokenizer, vocab, device, forward_token_s)
    save_s = _save(model, tokenizer)
    return {
        "start_s": start_s, "forward_token_s": forward_token_s, "train_token_s": train_token_s,
        "optimizer_s": optimizer_s, "decode_step_s": decode_step_s, "decode_row_s": decode_row_s, "save_s": save_s,
        **_tokenizer_facts(tokenizer, encoder),
        "model": str(path), "encoder": encoder, "parameters": sum(p.numel() for p in model.parameters()),
        "device": str(device), "threads": torch.get_num_threads(), "host": socket.gethostname(),
        "machine": platform.processor() or platform.machine(), "measured_at": datetime.now(UTC).isoformat(),
    }


def _load(model_dir: str | Path | None, encoder: bool) -> tuple[Any, Any, Path]:
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if encoder:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        from training.reward_model import default_model_path
        from training.weights import SAFE_LOAD

        path = Path(model_dir or default_model_path())
        model = AutoModelForSequenceClassification.from_pretrained(path, num_labels=1, **SAFE_LOAD).to(device)
        return model, AutoTokenizer.from_pretrained(path), path
    if not model_dir:
        raise ValueError("model: a causal LM directory is needed (or --encoder for a reward model's encoder)")
    from training.policy import load_policy

    model, tokenizer = load_policy(model_dir, device=device)
    return model, tokenizer, Path(model_dir)


def _sync() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn: Any, repeats: int = 2) -> float:
    """Seconds per call of `fn`, after one call that warms it up (allocations, kernel choice)."""
    fn()
    _sync()
    started = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync()
    return (time.perf_counter() - started) / repeats


def _forward(model: Any, ids: Any) -> float:
    import torch

    def once() -> None:
        with torch.no_grad():
            model(input_ids=ids)

    return _timed(once)


def _train(model: Any, ids: Any) -> tuple[float, float]:
    """Seconds per token of a forward and backward pass (a loss over the whole vocabulary, as the trainers' log-probs
    take), and seconds per AdamW step over every weight."""
    import torch

    def pass_() -> None:
        logits = model(input_ids=ids).logits
        logits.float().logsumexp(-1).mean().backward()

    train_s = _timed(pass_) / ids.numel()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-12)
    optimizer_s = _timed(optimizer.step)
    optimizer.zero_grad(set_to_none=True)
    return train_s, optimizer_s


def _decode(model: Any, tokenizer: Any, vocab: int, device: Any, forward_token_s: float) -> tuple[float, float]:
    """(fixed seconds per decoding step, seconds per row per step), through the trainers' own decoding loop."""
    import torch

    from training.sampling import decode

    def run(rows: int) -> float:
        ids = torch.randint(10, max(11, vocab - 10), (rows, PROMPT), device=device)
        mask = torch.ones_like(ids)
        uniforms = torch.rand(rows, DECODE_STEPS, dtype=torch.float64).to(device)

        def once() -> None:
            with torch.no_grad():
                decode(model, tokenizer, ids, mask, max_new_tokens=DECODE_STEPS, eos_ids=[], uniforms=uniforms,
                       temperature=1.0, with_logprobs=True)

        prefill = forward_token_s * rows * PROMPT  # the prompts' one forward pass, priced as such
        return max(0.0, _timed(once, repeats=1) - prefill) / DECODE_STEPS

    few, many = DECODE_ROWS
    at_few, at_many = run(few), run(many)
    per_row = max(0.0, (at_many - at_few) / (many - few))
    return max(0.0, at_few - per_row * few), per_row


def _save(model: Any, tokenizer: Any) -> float:
    with tempfile.TemporaryDirectory(prefix="preflab-speed-") as tmp:
        started = time.perf_counter()
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        return time.perf_counter() - started


def _tokenizer_facts(tokenizer: Any, encoder: bool) -> dict[str, float]:
    """Characters per token of ordinary text, and the tokens a prompt gains from the chat template (a causal LM with
    one: the trainers render every prompt through it)."""
    tokens = len(tokenizer(SAMPLE_TEXT, add_special_tokens=False)["input_ids"])
    template = 0
    if not encoder and getattr(tokenizer, "chat_template", None):
        from training.sampling import render_prompt

        template = len(tokenizer(render_prompt(tokenizer, "x"), add_special_tokens=False)["input_ids"]) - 1
    return {"chars_per_token": len(SAMPLE_TEXT) / max(1, tokens), "template_tokens": float(max(0, template))}


def main(argv: list[str] | None = None) -> int:
    """`python -m training speed [--model DIR] [--encoder] --out FILE`: measure, write the figures as JSON."""
    parser = argparse.ArgumentParser(prog="python -m training speed", description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="model directory (a causal LM; with --encoder, empty means the shipped "
                                        "MiniLM)")
    parser.add_argument("--encoder", action="store_true", help="measure a reward model's encoder (no decoding)")
    parser.add_argument("--out", required=True, help="where to write the JSON (written whole, by a rename)")
    args = parser.parse_args(argv)
    try:
        figures = measure(args.model, encoder=args.encoder)
    except (ValueError, OSError) as exc:
        parser.error(str(exc))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(figures, indent=2), encoding="utf-8")
    tmp.replace(out)  # whole: a reader never sees half a file
    print(json.dumps(figures))
    return 0
