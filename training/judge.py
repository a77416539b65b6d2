"""The constitutional AI judge (Bai et al. 2022, RLAIF): soft, position-debiased A/B labels from a model's
next-token probabilities, principle ensembling, rankings of K completions, and critique → revision.

A comparison is scored in both orders; with p_A(X, Y) the judge's probability of answering "A" when X
is shown as (A) and Y as (B), the label is p(A ≻ B) = ½[p_A(A, B) + 1 − p_A(B, A)]. Both raw values
are kept in the `Verdict`, so the judge's own position bias is visible.

A comparison longer than the judge model's context is judged on its answers cut in the middle (their start and
their end kept, the conversation, principle and instruction never cut) or, when even that leaves too little of
them, left unjudged as `Skipped` with its reason; the others of the call are judged as usual (`JudgeConfig.overflow`).

Backends: "hf" reads log-probs straight from the model (both orders of a comparison in one batch);
"openai" asks the server for `logprobs`/`top_logprobs` and, when the server gives none, parses a single
letter from the answer and says so (`Verdict.hard`). Prompt texts live in `training.judge_prompts`;
untrusted text goes into them verbatim (see there why that cannot be sanitised).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import hashlib
import inspect
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from training.generation import (
    GenerationError,
    GenerationParams,
    HFGenerator,
    OpenAIGenerator,
    Progress,
    ShouldStop,
    make_generator,
)
from training.judge_prompts import (
    ANSWER_PREFIX,
    CHAT_ANSWER_REQUEST,
    COT_CUE,
    COT_STOP,
    CRITIQUE_STOP,
    STEP_ANSWER_PREFIX,
    STEP_ANSWERS,
    STEP_CHAT_ANSWER_REQUEST,
    TEMPLATE_VERSION,
    build_critique_prompt,
    build_revision_prompt,
    comparison_body,
    cot_scoring_prompt,
    step_question,
)
from training.judge_ranking import METHODS, RankingMethod, rank_from_pairwise

Item = tuple[str, str, str]
"""(conversation, response_a, response_b)."""
LETTERS = ("A", "B")
SHARED_PREFIX_MIN = 8
"""Rows of a batch that share at least this many leading tokens compute them once (hf backend)."""
OPENAI_TOP_LOGPROBS = 5
"""How many alternatives per position the openai backend asks for (the common server maximum is 5+)."""
OPENAI_ANSWER_TOKENS = 4
"""Tokens an openai judge may write when scoring: enough for "(A)" or " A." and for the letter fallback."""
CUT_MARK = "\n[...]\n"
"""Stands where the middle of an answer was cut to fit the judge model's context."""
FIT_SLACK = 2
"""Tokens kept free when fitting a prompt: the answer letter may tokenise with the text before it."""


def debias(p_a_first: float, p_a_second: float) -> float:
    """Swap-averaged label p(A ≻ B) = ½[p_A(A, B) + 1 − p_A(B, A)] (position debiasing)."""
    return 0.5 * (p_a_first + 1.0 - p_a_second)


def clamp(p: float, bounds: tuple[float, float]) -> float:
    """p clipped to [low, high]; CAI §4.2 clamps chain-of-thought labels to [0.4, 0.6] (they are overconfident)."""
    low, high = bounds
    return min(max(p, low), high)


def two_way_softmax(logp_a: float, logp_b: float) -> float:
    """p(A) renormalised over the two letters: e^{ℓ_A} / (e^{ℓ_A} + e^{ℓ_B}) = σ(ℓ_A − ℓ_B)."""
    d = logp_a - logp_b
    if d >= 0:
        return 1.0 / (1.0 + math.exp(-d))
    e = math.exp(d)
    return e / (1.0 + e)


# ---------------------------------------------------------------------------------------------- config


@dataclass
class JudgeConfig:
    """How the judge labels a comparison; stored with every judge run."""

    mode: Literal["logprob", "cot"] = "logprob"
    """"logprob": read p(A), p(B) after the comparison prompt; "cot": write reasoning first, then read them."""
    principles: Literal["sample", "all"] = "sample"
    """"sample": one principle per comparison, drawn with a RNG seeded by (seed, key); "all": average over all."""
    seed: int = 0
    """Seeds principle sampling (and is sent to openai servers), so a re-run gives the same labels."""
    cot_clamp: tuple[float, float] = (0.4, 0.6)
    """Chain-of-thought mode clips each raw p_A to this interval before debiasing (CAI §4.2)."""
    ranking: RankingMethod = "bradley_terry"
    """How pairwise labels of K completions become a ranking: "bradley_terry" or "copeland"."""
    batch_size: int = 16
    """Scoring prompts per forward pass (hf). Rows are ordered so that those sharing a prefix (both
    orders and all pairs of one prompt under one principle) share a batch and compute it once."""
    low_confidence: float = 0.6
    """Pairs whose max(p, 1 − p) is below this (and rankings whose confidence is) are marked for humans."""
    max_new_tokens_cot: int = 128
    """Most reasoning tokens in chain-of-thought mode."""
    overflow: Literal["truncate", "skip"] = "truncate"
    """A comparison too long for the judge model's context (hf backend): "truncate" cuts the middle out of the longer
    answer, or of both to the same length, keeping each one's start and end (a solution's final answer is at its
    end), and never cuts the conversation, the principle or the instruction: the question asked stays whole and the
    verdict is still on the two answers' approach and conclusion; "skip" leaves such a comparison unjudged. Either
    way it is one comparison: the rest of the call is judged."""
    min_answer_tokens: int = 64
    """Truncating keeps at least this many tokens of each answer (all of a shorter one); a comparison whose
    conversation and principle leave less room is skipped, its reason said, rather than judged on scraps."""

    def __post_init__(self) -> None:
        if self.mode not in ("logprob", "cot"):
            raise ValueError(f'mode must be "logprob" or "cot", got {self.mode!r}')
        if self.principles not in ("sample", "all"):
            raise ValueError(f'principles must be "sample" or "all", got {self.principles!r}')
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer in [0, 2**63), got {self.seed!r}")
        bounds = self.cot_clamp
        if (not isinstance(bounds, tuple | list) or len(bounds) != 2
                or not all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
                or not 0.0 <= bounds[0] <= 0.5 <= bounds[1] <= 1.0):
            raise ValueError(f"cot_clamp must be two numbers (low, high) with 0 ≤ low ≤ 0.5 ≤ high ≤ 1, got {bounds!r}")
        self.cot_clamp = (float(bounds[0]), float(bounds[1]))  # JSON gives a list
        if self.ranking not in METHODS:
            raise ValueError(f"ranking must be one of {', '.join(METHODS)}, got {self.ranking!r}")
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ValueError(f"batch_size must be an integer ≥ 1, got {self.batch_size!r}")
        low = self.low_confidence
        if not isinstance(low, int | float) or isinstance(low, bool) or not 0.5 <= low <= 1.0:
            raise ValueError(f"low_confidence must be a number in [0.5, 1], got {low!r}")
        steps = self.max_new_tokens_cot
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise ValueError(f"max_new_tokens_cot must be an integer ≥ 1, got {steps!r}")
        if self.overflow not in ("truncate", "skip"):
            raise ValueError(f'overflow must be "truncate" or "skip", got {self.overflow!r}')
        keep = self.min_answer_tokens
        if not isinstance(keep, int) or isinstance(keep, bool) or keep < 1:
            raise ValueError(f"min_answer_tokens must be an integer ≥ 1, got {keep!r}")

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["cot_clamp"] = list(self.cot_clamp)
        return out


@dataclass
class Verdict:
    """The judge's label for one comparison of A against B."""

    p: float
    """p(A ≻ B), debiased: ½[p_A(A, B) + 1 − p_A(B, A)]."""
    p_a_first: float
    """p_A(A, B): probability of answering "A" with A shown first."""
    p_a_second: float
    """p_A(B, A): probability of answering "A" (the first-shown answer, which is B) with B shown first."""
    principles: list[str]
    """Names of the principles applied (one when sampled, all when averaged)."""
    hard: bool
    """True when only a parsed letter was available (openai server without log-probs): p ∈ {0, ½, 1}."""
    reasoning: str | None = None
    """Chain-of-thought mode: the reasoning written before the answer, for both orders."""
    by_principle: dict[str, float] = field(default_factory=dict)
    """Debiased p per principle (several entries only with principles="all")."""
    mass: float | None = None
    """p(A) + p(B) under the full next-token distribution, averaged: how well the judge kept to the
    answer format (near 0 means the A/B split is noise). None when unknown."""
    truncated: list[int] | None = None
    """Tokens cut from the middle of response A and of response B to fit the judge model's context; None: both were
    shown whole."""

    @property
    def position_flip(self) -> bool:
        """The two orders disagree on the winner (a position-biased judge picks the same slot twice)."""
        first = _sign(self.p_a_first - 0.5)     # +1: A won with A shown first
        second = _sign(0.5 - self.p_a_second)   # +1: A won with B shown first
        return first * second < 0

    @property
    def confidence(self) -> float:
        """max(p, 1 − p): how far the label is from a coin flip."""
        return max(self.p, 1.0 - self.p)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "position_flip": self.position_flip}


def _sign(x: float) -> int:
    return (x > 0) - (x < 0)


def _share(len_a: int, len_b: int, budget: int) -> tuple[int, int]:
    """Tokens kept of two answers of `len_a` and `len_b` tokens within `budget`: one that fits in half is kept whole
    and the other gets the rest, else both keep half. So the longer answer is cut first, never below the other."""
    half = max(0, budget) // 2
    if len_a <= half:
        return len_a, min(len_b, budget - len_a)
    if len_b <= half:
        return min(len_a, budget - len_b), len_b
    return half, max(0, budget) - half


@dataclass
class Skipped:
    """A comparison (or step question) the judge left unjudged, and why: it does not fit the judge model's context."""

    reason: str


@dataclass
class _Job:
    """One scoring prompt: item × principle × order. `user` is the question, `tail` what the judge 'says'
    before the letter (answer prefix, or CoT cue + reasoning + answer prefix)."""

    item: int
    principle: int
    order: int  # 0: (A, B) as given; 1: swapped
    user: str
    tail: str
    reasoning: str | None = None
    answers: tuple[str, str] = LETTERS
    """The two answers whose next-token probabilities are read: ("A", "B"), or ("Yes", "No") for a step."""
    chat_request: str = CHAT_ANSWER_REQUEST
    """What a chat judge is asked to answer with (chat APIs cannot be made to continue the answer prefix)."""


# ----------------------------------------------------------------------------------------------- judge


class Judge:
    """A model that labels comparisons under constitutional principles (see the module docstring).

    Build it from a generator spec (`{"backend": "hf", "model": "/path"}` or an openai spec, as for
    `training.generation.make_generator`), an existing `HFGenerator` / `OpenAIGenerator`, or with
    `Judge.from_model(model, tokenizer)` for a model already in memory.
    """

    def __init__(self, generator: dict[str, Any] | HFGenerator | OpenAIGenerator,
                 config: JudgeConfig | None = None) -> None:
        self.generator = make_generator(generator) if isinstance(generator, dict) else generator
        if not isinstance(self.generator, HFGenerator | OpenAIGenerator):
            raise TypeError(f"generator must be a spec dict, HFGenerator or OpenAIGenerator, got {type(generator)}")
        self.config = config or JudgeConfig()
        self._share_prefix = True

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, config: JudgeConfig | None = None, *,
                   use_chat_template: bool | None = None) -> Judge:
        """A judge over a causal LM already in memory (tests, benchmarks, a policy being trained)."""
        from training.policy import prepare_tokenizer

        name = getattr(model.config, "_name_or_path", "") or "in-memory"
        generator = HFGenerator(Path(name), use_chat_template=use_chat_template, batch_size=(config or
                                JudgeConfig()).batch_size)
        # HFGenerator loads lazily from disk; handing it the loaded objects skips that load
        generator._model = model.eval()
        generator._tokenizer = prepare_tokenizer(tokenizer)
        generator._device = next(model.parameters()).device
        return cls(generator, config)

    @property
    def backend(self) -> str:
        return self.generator.backend

    def describe(self) -> dict[str, Any]:
        """Provenance of this judge: generator, config and the prompt texts' fingerprint."""
        return {"generator": self.generator.describe(), "config": self.config.to_dict(),
                "templates": TEMPLATE_VERSION}

    # -- principles ------------------------------------------------------------------------------------

    def principles_for(self, principles: Sequence[dict[str, Any]], key: tuple) -> list[int]:
        """Indices of the principles applied to the comparison identified by `key`.

        "sample" draws one uniformly from a RNG seeded by sha256(repr((seed, key))): the same
        comparison gets the same principle on every run, whatever else is in the batch."""
        if self.config.principles == "all":
            return list(range(len(principles)))
        digest = hashlib.sha256(repr((self.config.seed, tuple(key))).encode()).digest()
        return [random.Random(int.from_bytes(digest[:8], "big")).randrange(len(principles))]

    # -- compare ---------------------------------------------------------------------------------------

    def compare(self, items: Sequence[Item], principles: Sequence[dict[str, Any]], *, key: tuple | None = None,
                keys: Sequence[tuple] | None = None, progress: Progress | None = None,
                should_stop: ShouldStop | None = None) -> list[Verdict | Skipped]:
        """One Verdict per (conversation, response_a, response_b), or `Skipped` with its reason for one that does not
        fit the judge model's context even with its answers cut (`JudgeConfig.overflow`).

        Item i is identified for principle sampling by `keys[i]` when given, else by `(*key, i)` (key
        defaults to ()). Pass stable keys (e.g. prompt and completion ids) to make re-runs reproducible
        regardless of batching. `progress(done, total)` counts scoring prompts; `should_stop` is checked
        between batches (raises `JudgeCancelled`).
        """
        _check_principles(principles)
        if keys is not None and len(keys) != len(items):
            raise ValueError(f"keys: {len(keys)} keys for {len(items)} items")
        base = tuple(key) if key is not None else ()
        chosen = [self.principles_for(principles, tuple(keys[i]) if keys is not None else (*base, i))
                  for i in range(len(items))]
        fitted = self._fit(items, principles, chosen)
        jobs: list[_Job] = []
        for i, (conversation, _, _) in enumerate(items):
            fit = fitted[i]
            if isinstance(fit, Skipped):
                continue
            a, b, _ = fit
            for k in chosen[i]:
                for order, (x, y) in enumerate(((a, b), (b, a))):
                    jobs.append(_Job(i, k, order, comparison_body(conversation, principles[k], x, y), ANSWER_PREFIX))
        if self.config.mode == "cot":
            self._reason(jobs, should_stop)
        scored = self._score(jobs, progress, should_stop) if jobs else []
        return self._verdicts(fitted, principles, chosen, jobs, scored)

    def label_steps(self, items: Sequence[tuple[str, Sequence[str]]], *, progress: Progress | None = None,
                    should_stop: ShouldStop | None = None) -> list[list[float]]:
        """Per (conversation, steps) item, p(Yes) for each step: "is step N correct given the problem and the
        steps before it?", read from the next-token log-probs of "Yes" and "No", renormalised over the two.

        No principle and no swap apply (the question has one fixed answer order) and `mode` is ignored: a step
        label is always read straight from the log-probs. An openai server without log-probs gives the parsed
        word as 1 / 0 (½ when it names neither). A step question longer than the judge model's context is not asked
        (nor those after it, which are longer): that item's list stops short of its steps."""
        jobs: list[_Job] = []
        for i, (conversation, steps) in enumerate(items):
            for n in range(len(steps)):
                jobs.append(_Job(i, n, 0, step_question(conversation, steps, n), STEP_ANSWER_PREFIX,
                                 answers=STEP_ANSWERS, chat_request=STEP_CHAT_ANSWER_REQUEST))
        jobs = self._fitting_steps(jobs)
        scored = self._score(jobs, progress, should_stop) if jobs else []
        out: list[list[float]] = [[] for _ in items]
        for job, (p_yes, _, _) in zip(jobs, scored, strict=True):
            out[job.item].append(p_yes)
        return out

    def _verdicts(self, fitted: list[tuple[str, str, list[int] | None] | Skipped], principles: Sequence[dict[str, Any]],
                  chosen: list[list[int]], jobs: list[_Job], scored: list[tuple[float, float | None, bool]]
                  ) -> list[Verdict | Skipped]:
        raw: dict[tuple[int, int, int], tuple[float, float | None, bool]] = {}
        reasons: dict[tuple[int, int, int], str | None] = {}
        for job, result in zip(jobs, scored, strict=True):
            raw[(job.item, job.principle, job.order)] = result
            reasons[(job.item, job.principle, job.order)] = job.reasoning
        cot = self.config.mode == "cot"
        out: list[Verdict | Skipped] = []
        for i, fit in enumerate(fitted):
            if isinstance(fit, Skipped):
                out.append(fit)
                continue
            firsts, seconds, masses, by_principle, hard, texts = [], [], [], {}, False, []
            for k in chosen[i]:
                (p1, m1, h1), (p2, m2, h2) = raw[(i, k, 0)], raw[(i, k, 1)]
                if cot:
                    p1, p2 = clamp(p1, self.config.cot_clamp), clamp(p2, self.config.cot_clamp)
                firsts.append(p1)
                seconds.append(p2)
                masses += [m for m in (m1, m2) if m is not None]
                hard = hard or h1 or h2
                by_principle[principles[k]["name"]] = debias(p1, p2)
                if cot:
                    name = principles[k]["name"]
                    texts.append(f"[{name}, A first] {reasons[(i, k, 0)]}\n[{name}, B first] {reasons[(i, k, 1)]}")
            p_first, p_second = sum(firsts) / len(firsts), sum(seconds) / len(seconds)
            out.append(Verdict(p=debias(p_first, p_second), p_a_first=p_first, p_a_second=p_second,
                               principles=[principles[k]["name"] for k in chosen[i]], hard=hard,
                               reasoning="\n".join(texts) if cot else None, by_principle=by_principle,
                               mass=sum(masses) / len(masses) if masses else None, truncated=fit[2]))
        return out

    def _score(self, jobs: list[_Job], progress: Progress | None,
               should_stop: ShouldStop | None) -> list[tuple[float, float | None, bool]]:
        """Per job: (p_A renormalised over A/B, p(A) + p(B) or None, hard)."""
        if isinstance(self.generator, HFGenerator):
            return self._score_hf(jobs, progress, should_stop)
        return self._score_openai(jobs, progress, should_stop)

    # -- the judge model's context ---------------------------------------------------------------------

    @contextlib.contextmanager
    def _local_context(self) -> Iterator[int | None]:
        """A local judge model's context length in tokens, the model loaded and held (under its lock) while the
        caller counts tokens against it; None for a server (it keeps its own limit) or a model that does not say."""
        gen = self.generator
        if not isinstance(gen, HFGenerator):
            yield None
            return
        with gen._lock:
            gen._load()
            yield gen.context_length()

    def _fit(self, items: Sequence[Item], principles: Sequence[dict[str, Any]], chosen: list[list[int]]
             ) -> list[tuple[str, str, list[int] | None] | Skipped]:
        """Per item its two answers as the judge will see them, with the tokens cut from each (None: shown whole),
        or Skipped. Only a local model's context can be counted against; a server keeps its own limit."""
        whole: list[tuple[str, str, list[int] | None] | Skipped] = [(a, b, None) for _, a, b in items]
        with self._local_context() as context:
            if context is None:
                return whole
            tail, reserve = ANSWER_PREFIX, FIT_SLACK
            if self.config.mode == "cot":  # room for the reasoning, then the answer prefix after it
                tail = COT_CUE
                reserve += self.config.max_new_tokens_cot + len(self._ids("\n" + ANSWER_PREFIX)) + 1
            return [self._fit_item(item, [principles[k] for k in chosen[i]], context, reserve, tail)
                    for i, item in enumerate(items)]

    def _fit_item(self, item: Item, shown: list[dict[str, Any]], context: int, reserve: int, tail: str
                  ) -> tuple[str, str, list[int] | None] | Skipped:
        conversation, a, b = item
        limit = context - reserve

        def longest(x: str, y: str) -> int:  # over the item's principles and both orders: they all get one cut
            return max(self._n_tokens(comparison_body(conversation, p, *pair), tail)
                       for p in shown for pair in ((x, y), (y, x)))

        n = longest(a, b)
        if n <= limit:
            return a, b, None
        over = f"the judge prompt is {n} tokens but the judge model's context is {context}"
        if reserve > FIT_SLACK:
            over += f", {reserve - FIT_SLACK} of them kept for its reasoning"
        if self.config.overflow == "skip":
            return Skipped(f"{over} (overflow is skip: answers are not cut)")
        ids_a, ids_b = self._ids(a), self._ids(b)
        fixed = longest("", "")
        budget = limit - fixed - 2 * len(self._ids(CUT_MARK))
        least = self.config.min_answer_tokens
        for _ in range(4):  # a cut answer can tokenise a little longer in place than alone: shrink by the excess
            keep_a, keep_b = _share(len(ids_a), len(ids_b), budget)
            if keep_a < min(len(ids_a), least) or keep_b < min(len(ids_b), least):
                return Skipped(f"{over}: the conversation and the principle alone take {fixed} tokens, too many to "
                               f"show at least {least} tokens of each answer")
            x, y = self._cut(a, ids_a, keep_a), self._cut(b, ids_b, keep_b)
            n_cut = longest(x, y)
            if n_cut <= limit:
                return x, y, [len(ids_a) - keep_a, len(ids_b) - keep_b]
            budget -= n_cut - limit
        return Skipped(over)

    def _fitting_steps(self, jobs: list[_Job]) -> list[_Job]:
        """The step questions that fit the judge model's context; an item's first one that does not ends its list
        (every later question shows one step more)."""
        with self._local_context() as context:
            if context is None:
                return jobs
            kept, ended = [], set()
            for job in jobs:
                if job.item not in ended and self._n_tokens(job.user, job.tail) + FIT_SLACK <= context:
                    kept.append(job)
                else:
                    ended.add(job.item)
        return kept

    def _ids(self, text: str) -> list[int]:
        return list(self.generator._tokenizer(text, add_special_tokens=False)["input_ids"])  # type: ignore[union-attr]

    def _n_tokens(self, user: str, tail: str) -> int:
        """Tokens of a scoring prompt (the question, then what the judge says before its answer) as the model reads
        it: through the chat template when there is one."""
        text, templated = self._hf_text(_Job(0, 0, 0, user, tail))
        return len(self.generator._tokenizer(text, add_special_tokens=not templated)["input_ids"])  # type: ignore[union-attr]

    def _cut(self, text: str, ids: list[int], keep: int) -> str:
        """The answer with its middle cut out down to `keep` tokens: its start and its end stay (where a solution
        sets out and where it states its result), CUT_MARK between them."""
        if keep >= len(ids):
            return text
        tokenizer = self.generator._tokenizer  # type: ignore[union-attr]
        tail = keep // 2
        head = tokenizer.decode(ids[:keep - tail], skip_special_tokens=False, clean_up_tokenization_spaces=False)
        end = tokenizer.decode(ids[len(ids) - tail:], skip_special_tokens=False,
                               clean_up_tokenization_spaces=False) if tail else ""
        return head + CUT_MARK + end

    # -- hf ----------------------------------------------------------------------------------------------

    def _hf_text(self, job: _Job) -> tuple[str, bool]:
        """Full scoring text and whether a chat template rendered it (then no special tokens are added)."""
        gen = self.generator
        assert isinstance(gen, HFGenerator)
        rendered, templated = gen.render(job.user.rstrip("\n"))
        if templated:
            # the question is the user turn; the answer prefix is the start of the assistant's reply
            return rendered + job.tail, True
        return job.user + job.tail, False

    def _letter_ids(self, text: str, templated: bool, answers: tuple[str, str] = LETTERS
                    ) -> tuple[list[int], int, int]:
        """(context ids, id of "A", id of "B"): the tokens where text + "A" and text + "B" first differ (or the
        two `answers` given, e.g. "Yes" and "No").

        Tokenising the full strings, rather than looking up "A" in the vocabulary, finds the right ids
        whatever the tokenizer does at the boundary: a separate "A", a merged "(A" (then the context
        ends before "("), or a leading-space variant."""
        tokenizer = self.generator._tokenizer  # type: ignore[union-attr]
        ids_a = tokenizer(text + answers[0], add_special_tokens=not templated)["input_ids"]
        ids_b = tokenizer(text + answers[1], add_special_tokens=not templated)["input_ids"]
        c = 0
        while c < min(len(ids_a), len(ids_b)) and ids_a[c] == ids_b[c]:
            c += 1
        if c == 0 or c >= len(ids_a) or c >= len(ids_b):
            raise GenerationError(f"the judge tokenizer cannot tell the answers {answers[0]} and {answers[1]} apart "
                                  "after the prompt")
        return ids_a[:c], ids_a[c], ids_b[c]

    def _score_hf(self, jobs: list[_Job], progress: Progress | None,
                  should_stop: ShouldStop | None) -> list[tuple[float, float | None, bool]]:
        import torch

        gen = self.generator
        assert isinstance(gen, HFGenerator)
        with gen._lock:
            gen._load()
            model, tokenizer, device = gen._model, gen._tokenizer, gen._device
            context = gen.context_length()
            rows = []
            for j, job in enumerate(jobs):
                ids, a, b = self._letter_ids(*self._hf_text(job), job.answers)
                if context is not None and len(ids) > context:
                    what = "comparison" if job.answers == LETTERS else "step question for item"
                    raise GenerationError(f"{what} {job.item}: the judge prompt is {len(ids)} tokens but the "
                                          f"judge model's context is {context}; shorten the responses")
                rows.append((j, ids, a, b))
            # lexicographic order puts rows that share a prefix (same conversation and principle, both
            # orders, all pairs of one prompt) next to each other, so a batch can compute that prefix once
            rows.sort(key=lambda r: r[1])
            out: list[tuple[float, float | None, bool] | None] = [None] * len(jobs)
            size = self.config.batch_size
            for start in range(0, len(rows), size):
                if should_stop is not None and should_stop():
                    raise JudgeCancelled
                batch = rows[start:start + size]
                logp = self._last_logprobs(model, [r[1] for r in batch], tokenizer.pad_token_id, device)  # (B, V)
                letters = torch.tensor([[r[2], r[3]] for r in batch], device=device)
                pair = logp.gather(1, letters).cpu().tolist()  # (B, 2): log p(A), log p(B)
                for r, (la, lb) in zip(batch, pair, strict=True):
                    out[r[0]] = (two_way_softmax(la, lb), math.exp(la) + math.exp(lb), False)
                if progress is not None:
                    progress(min(start + size, len(rows)), len(rows))
        return out  # type: ignore[return-value]

    def _last_logprobs(self, model: Any, rows: list[list[int]], pad: int, device: Any) -> Any:
        """Next-token log-probs after each row, (B, V). Rows sharing a prefix of `SHARED_PREFIX_MIN`+
        tokens run it once (batch 1) and only their suffixes in the batch, over a copy of its KV cache;
        the numbers are those of a full forward (up to float rounding)."""
        import torch

        from training.policy import position_ids_from_mask

        first, last = rows[0], rows[-1]  # rows are sorted, so their common prefix is that of these two
        shared = 0
        limit = min(len(r) for r in rows) - 1  # every row keeps at least one token of its own
        while shared < limit and first[shared] == last[shared]:
            shared += 1
        with torch.no_grad():
            if len(rows) > 1 and shared >= SHARED_PREFIX_MIN and self._share_prefix:
                try:
                    return self._suffix_logprobs(model, rows, shared, pad, device)
                except (TypeError, AttributeError, NotImplementedError, ValueError):
                    self._share_prefix = False  # a model without a reusable cache: full rows from now on
            width = max(len(r) for r in rows)
            input_ids = torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device)
            mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
            logits = model(input_ids=input_ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                           logits_to_keep=1, use_cache=False).logits[:, -1, :].float()
        return torch.log_softmax(logits, dim=-1)

    def _suffix_logprobs(self, model: Any, rows: list[list[int]], shared: int, pad: int, device: Any) -> Any:
        import torch

        # transformers 5 names the argument and output `cache`; 4.x called them `past_key_values`
        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        prefix = torch.tensor([rows[0][:shared]], device=device)  # (1, P)
        cache = model(input_ids=prefix, use_cache=True)[name]  # a fresh cache per batch
        cache.batch_repeat_interleave(len(rows))
        suffixes = [r[shared:] for r in rows]
        width = max(len(s) for s in suffixes)
        input_ids = torch.tensor([[pad] * (width - len(s)) + s for s in suffixes], device=device)  # (B, S)
        # padding sits between the shared prefix and each suffix; it is masked and skipped by the positions
        suffix_mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in suffixes], device=device)
        mask = torch.cat([torch.ones(len(rows), shared, dtype=suffix_mask.dtype, device=device), suffix_mask], 1)
        positions = (shared + suffix_mask.cumsum(-1) - 1).clamp(min=shared)
        logits = model(input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=1,
                       use_cache=True, **{name: cache}).logits[:, -1, :].float()
        return torch.log_softmax(logits, dim=-1)

    def _reason_hf(self, jobs: list[_Job], should_stop: ShouldStop | None) -> list[str]:
        """Greedy chain-of-thought for each job (greedy, so a re-run writes the same reasoning)."""
        import torch

        gen = self.generator
        assert isinstance(gen, HFGenerator)
        steps = self.config.max_new_tokens_cot
        with gen._lock:
            gen._load()
            model, tokenizer, device = gen._model, gen._tokenizer, gen._device
            context = gen.context_length()
            eos = sorted(gen._eos_ids())
            encoded = []
            for job in jobs:
                text, templated = self._hf_text(replace(job, tail=COT_CUE))
                ids = tokenizer(text, add_special_tokens=not templated)["input_ids"]
                if context is not None and len(ids) + steps > context:
                    raise GenerationError(f"comparison {job.item}: the chain-of-thought prompt is {len(ids)} tokens; "
                                          f"with max_new_tokens_cot={steps} it needs more than the judge model's "
                                          f"context of {context}")
                encoded.append(ids)
            texts: list[str] = []
            pad = tokenizer.pad_token_id
            for start in range(0, len(encoded), self.config.batch_size):
                if should_stop is not None and should_stop():
                    raise JudgeCancelled
                batch = encoded[start:start + self.config.batch_size]
                width = max(len(ids) for ids in batch)
                input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch], device=device)
                mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch], device=device)
                with torch.no_grad():
                    out = model.generate(input_ids=input_ids, attention_mask=mask, do_sample=False, num_beams=1,
                                         temperature=None, top_p=None, top_k=None, max_new_tokens=steps,
                                         eos_token_id=eos, pad_token_id=pad)
                for row in out[:, width:].tolist():
                    end = next((t for t, tok in enumerate(row) if tok in eos), len(row))
                    texts.append(tokenizer.decode(row[:end], skip_special_tokens=True))
        return texts

    def _reason(self, jobs: list[_Job], should_stop: ShouldStop | None) -> None:
        """CoT mode: write each job's reasoning and make its tail cue + reasoning + answer prefix."""
        if isinstance(self.generator, HFGenerator):
            texts = self._reason_hf(jobs, should_stop)
        else:
            texts = self._reason_openai(jobs, should_stop)
        for job, text in zip(jobs, texts, strict=True):
            cut = text.find(COT_STOP)
            job.reasoning = (text[:cut] if cut >= 0 else text).strip()
            job.tail = cot_scoring_prompt(COT_CUE, job.reasoning)

    # -- openai ------------------------------------------------------------------------------------------

    def _openai_call(self, job: _Job, body_extra: dict[str, Any], should_stop: ShouldStop | None,
                     for_reasoning: bool) -> Any:
        gen = self.generator
        assert isinstance(gen, OpenAIGenerator)
        body: dict[str, Any] = {"model": gen.model, "n": 1, "temperature": 0.0, "seed": self.config.seed}
        if gen.api == "completions":
            tail = COT_CUE if for_reasoning else job.tail
            body["prompt"] = job.user + tail
            path = "/completions"
        else:
            if for_reasoning:
                messages = [{"role": "user", "content": job.user + COT_CUE}]
            elif job.reasoning is not None:
                messages = [{"role": "user", "content": job.user + COT_CUE},
                            {"role": "assistant", "content": job.reasoning},
                            {"role": "user", "content": job.chat_request}]
            else:
                messages = [{"role": "user", "content": job.user + job.chat_request}]
            body["messages"] = messages
            path = "/chat/completions"
        body.update(body_extra)
        return gen._request("POST", path, body, should_stop)

    def _map_openai(self, jobs: list[_Job], fn: Any, progress: Progress | None,
                    should_stop: ShouldStop | None) -> list[Any]:
        """fn(job) for every job, `concurrency` requests in flight; results in job order."""
        gen = self.generator
        assert isinstance(gen, OpenAIGenerator)
        out: list[Any] = [None] * len(jobs)
        done = 0
        with concurrent.futures.ThreadPoolExecutor(max_workers=gen.concurrency) as pool:
            futures = {}
            for j, job in enumerate(jobs):
                if should_stop is not None and should_stop():
                    break
                futures[pool.submit(fn, job)] = j
            for future in concurrent.futures.as_completed(futures):
                out[futures[future]] = future.result()
                done += 1
                if progress is not None:
                    progress(done, len(jobs))
        if len(futures) < len(jobs):
            raise JudgeCancelled
        return out

    def _score_openai(self, jobs: list[_Job], progress: Progress | None,
                      should_stop: ShouldStop | None) -> list[tuple[float, float | None, bool]]:
        gen = self.generator
        assert isinstance(gen, OpenAIGenerator)
        if gen.api == "chat":
            extra = {"max_tokens": OPENAI_ANSWER_TOKENS, "logprobs": True, "top_logprobs": OPENAI_TOP_LOGPROBS}
        else:
            extra = {"max_tokens": OPENAI_ANSWER_TOKENS, "logprobs": OPENAI_TOP_LOGPROBS}

        def one(job: _Job) -> tuple[float, float | None, bool]:
            return read_openai_answer(self._openai_call(job, extra, should_stop, False), gen.api, job.answers)

        return self._map_openai(jobs, one, progress, should_stop)

    def _reason_openai(self, jobs: list[_Job], should_stop: ShouldStop | None) -> list[str]:
        gen = self.generator
        assert isinstance(gen, OpenAIGenerator)
        extra = {"max_tokens": self.config.max_new_tokens_cot, "stop": [COT_STOP]}

        def one(job: _Job) -> str:
            return _answer_text(self._openai_call(job, extra, should_stop, True), gen.api)

        return self._map_openai(jobs, one, None, should_stop)


class JudgeCancelled(Exception):  # noqa: N818 - a cancel is not an error
    """`should_stop()` returned True between batches; nothing of the call is kept."""


def _check_principles(principles: Sequence[dict[str, Any]]) -> None:
    if not principles:
        raise ValueError("principles: give at least one principle")
    for i, principle in enumerate(principles):
        for name in ("name", "comparison"):
            if not isinstance(principle.get(name), str) or not principle[name]:
                raise ValueError(f"principles[{i}].{name} must be non-empty text")


# ------------------------------------------------------------------------------------- openai answers


def _letter_of(token: str, answers: tuple[str, str] = LETTERS) -> str | None:
    """"A" for tokens such as "A", " A", "(A", "A)"; None otherwise. A word answer ("Yes") matches in any case
    ("yes", " YES"); a letter only as written, so the article "a" is no answer "A"."""
    core = token.strip().lstrip("(").rstrip(").:").strip()
    for answer in answers:
        if core == answer or (len(answer) > 1 and core.casefold() == answer.casefold()):
            return answer
    return None


def _logsumexp(values: list[float]) -> float:
    top = max(values)
    return top + math.log(sum(math.exp(v - top) for v in values))


def letter_logprobs(positions: list[dict[str, float]], answers: tuple[str, str] = LETTERS
                    ) -> tuple[float, float] | None:
    """(log p(A), log p(B)) from the top-logprob lists of the first answer positions, or None (or of the two
    `answers` given).

    The first position whose alternatives include a letter decides; spellings of one letter ("A",
    " A", "(A") are summed. A letter missing from a top-k list has at most the smallest listed
    probability, so that bound stands in for it: the label is then less extreme than the truth, never
    more."""
    for alternatives in positions:
        found: dict[str, list[float]] = {}
        for token, logp in alternatives.items():
            letter = _letter_of(token, answers)
            if letter is not None and logp is not None and math.isfinite(logp):
                found.setdefault(letter, []).append(logp)
        if found:
            floor = min(v for v in alternatives.values() if v is not None and math.isfinite(v))
            first, second = answers
            return (_logsumexp(found[first]) if first in found else floor,
                    _logsumexp(found[second]) if second in found else floor)
    return None


_ANSWER_PATTERNS = (
    re.compile(r"^\s*\(?\s*([AB])\s*(?:\)|\.|:|,|$|\s*$)"),   # "(A)", "A.", "B" alone
    re.compile(r"\(([AB])\)"),                               # "... so (B) is better"
    re.compile(r"answer is:?\s*\(?([AB])\b", re.IGNORECASE),  # "the answer is B"
)


def parse_letter(text: str) -> str | None:
    """The single letter an answer names, or None when it names neither or is ambiguous."""
    for pattern in _ANSWER_PATTERNS:
        hits = {m.group(1) for m in pattern.finditer(text)} if pattern.pattern[0] != "^" else {
            m.group(1) for m in [pattern.match(text)] if m}
        if len(hits) == 1:
            return hits.pop()
        if len(hits) > 1:
            return None
    return None


def _choice(data: Any) -> dict[str, Any]:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise GenerationError("the judge server gave a malformed answer: no choices")
    return choices[0]


def _answer_text(data: Any, api: str) -> str:
    choice = _choice(data)
    if api == "chat":
        message = choice.get("message")
        text = message.get("content") if isinstance(message, dict) else None
    else:
        text = choice.get("text")
    return text if isinstance(text, str) else ""


def _top_logprob_positions(choice: dict[str, Any], api: str) -> list[dict[str, float]]:
    """Per generated position, {token: logprob} of the listed alternatives (and the chosen token)."""
    logprobs = choice.get("logprobs")
    if not isinstance(logprobs, dict):
        return []
    positions: list[dict[str, float]] = []
    if api == "chat":
        for entry in logprobs.get("content") or []:
            if not isinstance(entry, dict):
                continue
            alts = {a["token"]: a["logprob"] for a in entry.get("top_logprobs") or []
                    if isinstance(a, dict) and isinstance(a.get("token"), str)
                    and isinstance(a.get("logprob"), int | float)}
            if isinstance(entry.get("token"), str) and isinstance(entry.get("logprob"), int | float):
                alts.setdefault(entry["token"], entry["logprob"])
            positions.append(alts)
    else:
        tops = logprobs.get("top_logprobs") or []
        tokens = logprobs.get("tokens") or []
        chosen = logprobs.get("token_logprobs") or []
        for t, top in enumerate(tops):
            alts = {k: v for k, v in (top or {}).items() if isinstance(v, int | float)}
            if t < len(tokens) and t < len(chosen) and isinstance(chosen[t], int | float):
                alts.setdefault(tokens[t], chosen[t])
            positions.append(alts)
    return positions


def parse_yes_no(text: str) -> str | None:
    """"Yes" or "No" when the answer opens with that word (any case), else None."""
    match = re.match(r"\s*\(?\s*(yes|no)\b", text, re.IGNORECASE)
    return match.group(1).capitalize() if match else None


def read_openai_answer(data: Any, api: str, answers: tuple[str, str] = LETTERS
                       ) -> tuple[float, float | None, bool]:
    """(p_A over A/B, p(A) + p(B), hard) from one openai response: log-probs when the server gave
    them; otherwise the letter parsed from the text as a hard 1/0 label (½ when it names neither). With
    `answers` ("Yes", "No") the same for p(Yes)."""
    choice = _choice(data)
    found = letter_logprobs(_top_logprob_positions(choice, api), answers)
    if found is not None:
        la, lb = found
        return two_way_softmax(la, lb), math.exp(la) + math.exp(lb), False
    text = _answer_text(data, api)
    word = parse_letter(text) if answers == LETTERS else parse_yes_no(text)
    return {answers[0]: 1.0, answers[1]: 0.0, None: 0.5}.get(word, 0.5), None, True


# -------------------------------------------------------------------------------- K completions, ranks


@dataclass
class JudgeResult:
    """A judge's ranking of the K completions of one prompt."""

    tiers: list[list[int]]
    """Completion ids, best tier first; ids in one tier are tied."""
    pair_probs: dict[tuple[int, int], Verdict]
    """Every pair (i, j), i before j in the given order, judged with i as response A."""
    scores: dict[int, float]
    """Per id: Bradley–Terry strength θ (log π, mean 0) or Copeland score."""
    confidence: float
    """Mean judged p(upper ≻ lower) over pairs in different tiers (½ when all tied)."""
    method: RankingMethod = "bradley_terry"
    """How the tiers were computed."""
    low_confidence: float = 0.6
    """Threshold below which pairs and the ranking are marked for human review."""
    skipped: dict[tuple[int, int], str] = field(default_factory=dict)
    """Pairs left unjudged (too long for the judge model's context), with the reason; the ranking leaves them
    uncompared."""

    def prob(self, i: int, j: int) -> float:
        """p(i ≻ j) from the judged pair, whichever way round it was asked."""
        if (i, j) in self.pair_probs:
            return self.pair_probs[(i, j)].p
        return 1.0 - self.pair_probs[(j, i)].p

    def is_low_confidence(self, i: int, j: int) -> bool:
        p = self.prob(i, j)
        return max(p, 1.0 - p) < self.low_confidence

    @property
    def needs_human(self) -> bool:
        """The ranking as a whole is below the confidence threshold."""
        return self.confidence < self.low_confidence

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: tiers, scores (keys as strings), confidence, method, and every judged pair."""
        return {"tiers": self.tiers, "scores": {str(i): s for i, s in self.scores.items()},
                "confidence": self.confidence, "method": self.method, "needs_human": self.needs_human,
                "pairs": [{"a": i, "b": j, "low_confidence": self.is_low_confidence(i, j), **v.to_dict()}
                          for (i, j), v in self.pair_probs.items()],
                "skipped": [{"a": i, "b": j, "reason": why} for (i, j), why in self.skipped.items()]}


def judge_many(judge: Judge, tasks: Sequence[tuple[str, Sequence[tuple[int, str]], tuple]],
               principles: Sequence[dict[str, Any]], *, progress: Progress | None = None,
               should_stop: ShouldStop | None = None) -> list[JudgeResult]:
    """`judge_prompt_completions` over several prompts, all pairs of all prompts in shared batches.

    Each task is (conversation, [(completion id, text), …], key); pair (i, j) is sampled a principle
    by the key (*key, i, j), so results do not depend on which prompts share the call."""
    items: list[Item] = []
    keys: list[tuple] = []
    spans = []
    for conversation, completions, key in tasks:
        ids = [c[0] for c in completions]
        if len(set(ids)) != len(ids):
            raise ValueError(f"completions: ids must be distinct, got {ids}")
        pairs = [(a, b) for x, a in enumerate(completions) for b in completions[x + 1:]]
        spans.append((len(items), pairs, ids))
        for (i, text_i), (j, text_j) in pairs:
            items.append((conversation, text_i, text_j))
            keys.append((*tuple(key), i, j))
    verdicts = judge.compare(items, principles, keys=keys, progress=progress, should_stop=should_stop)
    results = []
    for start, pairs, ids in spans:
        judged = {(a[0], b[0]): verdicts[start + n] for n, (a, b) in enumerate(pairs)}
        pair_probs = {k: v for k, v in judged.items() if isinstance(v, Verdict)}
        tiers, scores, confidence = rank_from_pairwise(ids, {k: v.p for k, v in pair_probs.items()},
                                                       judge.config.ranking)
        results.append(JudgeResult(tiers, pair_probs, scores, confidence, judge.config.ranking,
                                   judge.config.low_confidence,
                                   {k: v.reason for k, v in judged.items() if isinstance(v, Skipped)}))
    return results


def judge_prompt_completions(judge: Judge, conversation: str, completions: Sequence[tuple[int, str]],
                             principles: Sequence[dict[str, Any]], key: tuple = ()) -> JudgeResult:
    """Judge all K(K−1)/2 pairs of one prompt's completions and rank them (`judge.config.ranking`)."""
    return judge_many(judge, [(conversation, completions, key)], principles)[0]


# ---------------------------------------------------------------------------------- critique, revision


def critique_and_revise(generator_or_judge: Judge | HFGenerator | OpenAIGenerator, conversation: str, response: str,
                        principle: dict[str, Any], *, params: GenerationParams | None = None) -> tuple[str, str]:
    """Supervised CAI stage (Bai et al. 2022, §3.1): critique `response` under the principle's critique
    request, then revise it under its revision request, the critique in context. Returns (critique,
    revision). `params` default: greedy, 256 new tokens."""
    generator = generator_or_judge.generator if isinstance(generator_or_judge, Judge) else generator_or_judge
    for name in ("critique", "revision"):
        if not isinstance(principle.get(name), str) or not principle[name]:
            raise ValueError(f"principle.{name} must be non-empty text for critique and revision")
    params = params or GenerationParams(temperature=0.0, max_new_tokens=256, seed=0)
    critique_prompt = build_critique_prompt(conversation, response, principle)
    critique_params = replace(params, stop=[*params.stop, CRITIQUE_STOP])
    critique = generator.generate([critique_prompt], 1, critique_params)[0][0].text.strip()
    revision_prompt = build_revision_prompt(critique_prompt, critique, principle)
    revision = generator.generate([revision_prompt], 1, params)[0][0].text.strip()
    return critique, revision
