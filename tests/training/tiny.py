"""Tiny models built in code for the training tests: a character tokenizer, a 2-layer GPT-2, and SFT on addition.

Nothing here downloads anything. GRPO, PPO and evaluation tests share these helpers so that
"the policy learned" always means the same small, seeded task.
"""

from __future__ import annotations

import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast

SPECIALS = ["<pad>", "<eos>", "<unk>"]
CHARS = list(string.digits + "+-*=#:., ?\n" + string.ascii_letters)


def char_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character, `<pad>`/`<eos>`/`<unk>` specials, decoding fuses characters back together."""
    vocab = {tok: i for i, tok in enumerate(SPECIALS + CHARS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("[\\s\\S]"), behavior="isolated")
    backend.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>",
        clean_up_tokenization_spaces=False,
    )


def tiny_gpt2(tokenizer: PreTrainedTokenizerFast, seed: int = 0, n_embd: int = 64, n_layer: int = 2,
              n_positions: int = 32) -> GPT2LMHeadModel:
    """A 2-layer GPT-2 without dropout (RL needs the same log-probs at sampling and at training time)."""
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=len(tokenizer), n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=4,
        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
        bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return GPT2LMHeadModel(config)


def silent_gpt2(tokenizer: PreTrainedTokenizerFast, n_positions: int = 512) -> GPT2LMHeadModel:
    """A tiny GPT-2 that ends every answer at once: its final layer norm outputs one fixed vector, which the tied
    output embedding scores +10 for EOS and −10 for every other token. A continuation it writes is empty, so what a
    prefix leads to is the prefix itself: outcomes a test knows in advance."""
    model = tiny_gpt2(tokenizer, n_positions=n_positions)
    with torch.no_grad():
        model.transformer.ln_f.weight.zero_()
        model.transformer.ln_f.bias.zero_()
        model.transformer.ln_f.bias[0] = 1.0
        model.transformer.wte.weight[:, 0] = -10.0
        model.transformer.wte.weight[tokenizer.eos_token_id, 0] = 10.0
    return model


def save_tiny(model: GPT2LMHeadModel, tokenizer: PreTrainedTokenizerFast, path: str | Path) -> Path:
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def addition_problems(n: int, seed: int, low: int = 0, high: int = 9) -> list[tuple[str, str]]:
    """`n` distinct problems "a+b=" → "a+b" with operands in [low, high], in a seeded order."""
    rng = random.Random(seed)
    pairs = [(a, b) for a in range(low, high + 1) for b in range(low, high + 1)]
    rng.shuffle(pairs)
    return [(f"{a}+{b}=", str(a + b)) for a, b in pairs[:n]]


def addition_split(n_train: int, n_heldout: int, seed: int = 0, low: int = 0, high: int = 9
                   ) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    problems = addition_problems(n_train + n_heldout, seed, low, high)
    return problems[:n_train], problems[n_train:]


def sft(model: GPT2LMHeadModel, tokenizer: PreTrainedTokenizerFast, pairs: list[tuple[str, str]], steps: int,
        lr: float = 3e-3, batch_size: int = 32, seed: int = 0) -> list[float]:
    """Teacher-forced cross-entropy on the answer tokens (and EOS) only; returns the loss per step."""
    gen = torch.Generator().manual_seed(seed)
    encoded = []
    for prompt, answer in pairs:
        p = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        encoded.append((p + a, [-100] * len(p) + a))
    width = max(len(ids) for ids, _ in encoded)
    # right padding is fine here: positions start at 0 for every row
    ids = torch.tensor([x + [tokenizer.pad_token_id] * (width - len(x)) for x, _ in encoded])
    labels = torch.tensor([y + [-100] * (width - len(y)) for _, y in encoded])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(x) for x, _ in encoded])[:, None]).long()
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for _ in range(steps):
        idx = torch.randint(len(encoded), (batch_size,), generator=gen)
        loss = model(input_ids=ids[idx], attention_mask=mask[idx], labels=labels[idx]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    model.eval()
    return losses


def write_prompts(path: str | Path, pairs: list[tuple[str, str]], split: str = "train") -> Path:
    """A prompts export as JSONL: one `{"prompt", "reference", "split"}` object per line."""
    import json

    path = Path(path)
    with path.open("w", encoding="utf-8") as fh:
        for prompt, answer in pairs:
            fh.write(json.dumps({"prompt": prompt, "reference": answer, "split": split}) + "\n")
    return path


def careless_sft_set(pairs: list[tuple[str, str]], wrong: int = 3, right: int = 2) -> list[tuple[str, str]]:
    """SFT targets with a systematic slip: per problem `right` copies of the answer and `wrong` copies of answer + 1.

    A model fitted to this samples the right answer only ~right/(right+wrong) of the time, on every
    prompt alike. RL against exact match has a global habit to unlearn, so what it learns on its
    training prompts shows on prompts it never trained on (the DeepSeekMath picture: Maj@K rises).
    """
    return [(p, a) for p, a in pairs for _ in range(right)] + [(p, str(int(a) + 1)) for p, a in pairs
                                                               for _ in range(wrong)]


def digit_share(prompts: list, completions: list[str], **row) -> list[float]:
    """A dense reward for untrained models: the fraction of a completion's characters that are digits."""
    return [sum(ch.isdigit() for ch in text) / max(len(text), 1) for text in completions]


REPO = Path(__file__).resolve().parents[2]


def one_and_two_processes(args: list[str], tmp_path: Path) -> tuple[list[float], list[float], dict, dict]:
    """Run `python <args>` once in one process and once under accelerate with two (gloo, CPU): each run's loss
    curve and eval.json, (one, two, eval_one, eval_two); the two-process run must say it had 2 processes."""
    from training.run_info import read_metrics

    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO))
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2",
                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no"]
    two = subprocess.run(accelerate + args + ["--out", str(tmp_path / "two")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert two.returncode == 0, two.stderr[-3000:]
    one = subprocess.run([sys.executable, *args, "--out", str(tmp_path / "one")], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=300)
    assert one.returncode == 0, one.stderr[-3000:]
    assert json.loads((tmp_path / "two" / "run.json").read_text())["processes"] == 2
    curves = [[r["loss"] for r in read_metrics(tmp_path / name / "metrics.jsonl") if "loss" in r]
              for name in ("one", "two")]
    evals = [json.loads((tmp_path / name / "eval.json").read_text()) for name in ("one", "two")]
    return curves[0], curves[1], evals[0], evals[1]
