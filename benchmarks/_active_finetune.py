"""bench_active.py's `--learner finetuned`: a reward model whose encoder learns, scored with dropout on.

Fine-tuning all six MiniLM layers for every round of every seed is out of reach of a shared CPU, so the lower five
stay frozen: their output for every pair is computed once and cached (the same arithmetic as the whole model, since
they get no gradient), and each round fine-tunes a fresh copy of the last layer with the heads on top. The heads
start from the frozen learner's L-BFGS fit on the same labels (linear probing, then fine-tuning: Kumar et al. 2022,
which keeps a few hundred labels from wrecking the features), then the layer and the heads train together for
`--epochs` epochs, each head on its own Poisson(1) bootstrap of the labels, as the app's `ensemble=N` does.

Scoring runs `--mc-samples` forward passes with the layer's dropout on (MC dropout, Gal & Ghahramani 2016): a pair's
`p_heads` is then every head of every pass, (n, heads × samples), so the spread and BALD read the uncertainty of the
fine-tuned encoder, not only of the heads. Held-out accuracy uses the mean reward with dropout off.
"""

from __future__ import annotations

import argparse
import copy
import hashlib
import json
import time
from dataclasses import dataclass
from typing import Any

import bench_active as bench
import torch
from torch import Tensor, nn

from training.reward_model import PairEncoder, collate, default_model_path


@dataclass
class TokenStates:
    """The frozen layers' output for every sequence, (total tokens, D) float16, with each sequence's offset."""

    states: Tensor
    offsets: list[int]

    def length(self, row: int) -> int:
        return self.offsets[row + 1] - self.offsets[row]

    def batch(self, rows: list[int]) -> tuple[Tensor, Tensor]:
        """(hidden (b, L, D) float32 right-padded, mask (b, L) 0/1) for these sequences."""
        lengths = [self.offsets[i + 1] - self.offsets[i] for i in rows]
        width = max(lengths)
        hidden = torch.zeros(len(rows), width, self.states.shape[1])
        mask = torch.zeros(len(rows), width)
        for j, (i, n) in enumerate(zip(rows, lengths, strict=True)):
            hidden[j, :n] = self.states[self.offsets[i]:self.offsets[i] + n].float()
            mask[j, :n] = 1
        return hidden, mask


def load_encoder() -> Any:
    from transformers import AutoModel

    return AutoModel.from_pretrained(default_model_path(), attn_implementation="eager").eval()


@torch.no_grad()
def compute_states(lines: list[tuple[int, int]], max_length: int, batch_size: int = 32) -> tuple[TokenStates, Tensor]:
    """The input of the encoder's last layer for chosen (rows 0…N−1) then rejected (N…2N−1) of the HH lines, and
    the whole encoder's mean-pooled output (2N, D), as bench_active's features, from the same pass."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(default_model_path())
    model = load_encoder()
    encoder = PairEncoder(tokenizer, max_length)
    rows = bench.hh_rows(lines)
    prompts = encoder.prompt_texts([r.prompt for r in rows] * 2)
    ids, _ = encoder.encode(prompts, [r.chosen for r in rows] + [r.rejected for r in rows])
    per_sequence: list[Tensor] = [torch.empty(0)] * len(ids)
    pooled = torch.empty(len(ids), model.config.hidden_size)
    order = sorted(range(len(ids)), key=lambda i: -len(ids[i]))
    for start in range(0, len(order), batch_size):
        chunk = order[start:start + batch_size]
        batch = collate([ids[i] for i in chunk], tokenizer.pad_token_id, torch.device("cpu"))
        hidden = model(**batch, output_hidden_states=True).hidden_states  # each (b, L, D)
        mask = batch["attention_mask"].unsqueeze(-1).float()
        pooled[torch.tensor(chunk)] = (hidden[-1] * mask).sum(1) / mask.sum(1)
        for j, i in enumerate(chunk):
            per_sequence[i] = hidden[-2][j, :len(ids[i])].to(torch.float16)  # into the last layer
    offsets = [0]
    for t in per_sequence:
        offsets.append(offsets[-1] + len(t))
    return TokenStates(torch.cat(per_sequence), offsets), pooled


def load_states(args: argparse.Namespace) -> tuple[TokenStates, Tensor, Tensor, int, dict[str, Any]]:
    """(states, chosen, rejected, pool pairs, info): the frozen layers' output at `--max-length` from the cache or
    computed, the pretrained encoder's pair features from the same pass, and their sha256s (as bench_active's)."""
    pool_lines, heldout_lines = (bench.QUICK_POOL, bench.QUICK_HELDOUT) if args.quick else (bench.POOL, bench.HELDOUT)
    lines = [pool_lines, heldout_lines]
    key = {**bench.cache_key(lines, args.max_length), "what": "last-layer input, float16"}
    path = args.cache / f"minilm-l5-{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]}.pt"
    started = time.perf_counter()
    if path.exists():
        saved = torch.load(path)
        states, pooled, how = TokenStates(saved["states"], saved["offsets"]), saved["pooled"], "cached"
    else:
        with bench.encoder_threads():
            states, pooled = compute_states(lines, args.max_length)
        args.cache.mkdir(parents=True, exist_ok=True)
        torch.save({"states": states.states, "offsets": states.offsets, "pooled": pooled, "key": key}, path)
        how = "computed"
    digest = hashlib.sha256(states.states.view(torch.int16).numpy().tobytes())
    digest.update(json.dumps(states.offsets).encode())
    n = len(pooled) // 2
    chosen, rejected = pooled[:n], pooled[n:]
    info = {"features": how, "feature_seconds": round(time.perf_counter() - started, 1),
            "features_sha256": bench.tensor_sha256(chosen, rejected), "states_sha256": digest.hexdigest()}
    return states, chosen, rejected, pool_lines[1] - pool_lines[0] + 1, info


class Scorer(nn.Module):
    """The last encoder layer, mean pooling, the pool's fixed standardisation and H linear heads: r = W·(pool/s)."""

    def __init__(self, layer: nn.Module, scale: Tensor, w: Tensor) -> None:
        super().__init__()
        self.layer = layer
        self.register_buffer("scale", scale)
        self.heads = nn.Parameter(w.clone())  # (H, D)

    def embed(self, hidden: Tensor, mask: Tensor) -> Tensor:
        """(b, D) mean-pooled, standardised output of the last layer."""
        additive = (1.0 - mask)[:, None, None, :] * torch.finfo(hidden.dtype).min  # (b, 1, 1, L)
        out = self.layer(hidden, attention_mask=additive)
        out = out[0] if isinstance(out, tuple) else out  # (b, L, D)
        pooled = (out * mask.unsqueeze(-1)).sum(1) / mask.sum(1, keepdim=True)
        return pooled / self.scale

    def forward(self, hidden: Tensor, mask: Tensor) -> Tensor:
        return self.embed(hidden, mask) @ self.heads.T  # (b, H)


@dataclass
class FineTunedHeads:
    """bench_active's Learner with the last encoder layer fine-tuned each round (see the module's docstring)."""

    states: TokenStates
    pool_d: Tensor  # (N, D): the frozen features, standardised, for the linear-probe start
    scale: Tensor  # (D,)
    n_pool: int
    n_heldout: int
    args: argparse.Namespace
    layer: nn.Module
    model: Scorer | None = None
    seed: int = 0

    @classmethod
    def build(cls, args: argparse.Namespace, states: TokenStates, pool_d: Tensor, scale: Tensor, n_heldout: int
              ) -> FineTunedHeads:
        return cls(states, pool_d, scale, len(pool_d), n_heldout, args, load_encoder().encoder.layer[-1])

    def _rows(self, pairs: list[int], heldout: bool = False) -> tuple[list[int], list[int]]:
        """Sequence rows of (chosen, rejected) for pool (or held-out) pair positions."""
        first = self.n_pool if heldout else 0
        total = self.n_pool + self.n_heldout
        return [first + i for i in pairs], [total + first + i for i in pairs]

    def fit(self, labelled: list[int], seed: int) -> None:
        w = bench.train_heads(self.pool_d[labelled], self.args.heads, seed, self.args.l2, self.args.lbfgs_steps)
        gen = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout draws from the global generator: the same masks every run
        self.seed = seed
        model = Scorer(copy.deepcopy(self.layer), self.scale, w)
        boot = torch.poisson(torch.ones(len(labelled), self.args.heads), generator=gen)  # (n, H)
        optimizer = torch.optim.AdamW([{"params": model.layer.parameters(), "lr": self.args.ft_lr},
                                       {"params": [model.heads], "lr": self.args.ft_lr * 20}], weight_decay=0.0)
        model.train()
        for _ in range(self.args.epochs):
            order = torch.randperm(len(labelled), generator=gen).tolist()
            for start in range(0, len(order), self.args.batch):
                at = order[start:start + self.args.batch]
                chosen, rejected = self._rows([labelled[i] for i in at])
                hidden, mask = self.states.batch(chosen + rejected)
                r = model(hidden, mask)  # (2b, H)
                nll = -nn.functional.logsigmoid(r[:len(at)] - r[len(at):])  # (b, H)
                weights = boot[at]
                loss = ((nll * weights).sum(0) / weights.sum(0).clamp(min=1)).sum()
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
        self.model = model.eval()

    @torch.no_grad()
    def _margins(self, pairs: list[int], heldout: bool, samples: int) -> tuple[Tensor, Tensor]:
        """(Δ per head and sample (n, H·samples), pooled difference (n, D)); dropout on when samples > 1."""
        assert self.model is not None
        torch.manual_seed(self.seed + 1)
        self.model.train(samples > 1)
        out, emb = [], []
        chosen_rows, rejected_rows = self._rows(pairs, heldout)
        longest = [max(self.states.length(c), self.states.length(r)) for c, r in zip(chosen_rows, rejected_rows,
                                                                                      strict=True)]
        order = sorted(range(len(pairs)), key=lambda i: -longest[i])  # similar lengths per batch: little padding
        for start in range(0, len(order), 32):
            chosen, rejected = self._rows([pairs[i] for i in order[start:start + 32]], heldout)
            hidden, mask = self.states.batch(chosen + rejected)
            n = len(chosen)
            deltas, diffs = [], []
            for _ in range(samples):
                e = self.model.embed(hidden, mask)  # (2n, D)
                diffs.append(e[:n] - e[n:])
                deltas.append(diffs[-1] @ self.model.heads.T)  # (n, H)
            out.append(torch.cat(deltas, 1))
            emb.append(torch.stack(diffs).mean(0))
        self.model.eval()
        back = torch.argsort(torch.tensor(order))  # to the order the pairs were asked in
        return torch.cat(out)[back], torch.cat(emb)[back]

    def accuracy(self) -> float:
        deltas, _ = self._margins(list(range(self.n_heldout)), heldout=True, samples=1)
        return float((deltas.mean(1) > 0).double().mean())

    def view(self, candidates: list[int]) -> tuple[Tensor, Tensor]:
        deltas, emb = self._margins(candidates, heldout=False, samples=self.args.mc_samples)
        return torch.sigmoid(deltas), emb
