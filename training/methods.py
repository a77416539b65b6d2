"""The training methods, named once: what each trains on, what it trains, and where its config and trainer live.

`python -m training` takes its commands from here; the app takes its run kinds, the API's `kind`, the database's
check on `training_runs.kind` and the rules a run is checked against. Reading it is cheap: it imports neither torch
nor transformers, not even the config module, so the web process can validate a run without loading a trainer.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

EXPORT_KINDS = ("pairs", "steps", "sft", "prompts")
"""The export kinds a method can train on (the app's export kinds that hold training rows)."""


@dataclass(frozen=True)
class Method:
    """One training method: a `python -m training` command, a kind of training run in the app. Its properties are
    off unless the entry turns them on."""

    kind: str
    """Its name everywhere: the command, the run's kind, the API's `kind`, the database's value."""
    config: str
    """Its config dataclass, as a dotted path ("training.config.SFTConfig"), imported only by `config_class`."""
    trainer: str
    """The module whose `main(argv)` runs it ("training.sft") and whose `COMMAND` declares its flags."""
    export_kind: str
    """The export it trains on: pairs, steps, sft or prompts."""
    description: str
    """One line for `python -m training --help`."""
    trains_policy: bool = False
    """Its model is a causal LM: it needs a base model and can sample into a project. Otherwise it trains a reward
    model (an encoder with a new head, the shipped MiniLM unless one is named)."""
    online: bool = False
    """It samples rollouts and scores them while training, so it needs a reward-model run or reward functions."""
    takes_reward_run: bool = False
    """A run may name a finished reward-model run: the reward an online method optimises, or the model a reward
    model is retrained from. The others learn from their export alone."""
    process_rewards: bool = False
    """Its reward may be a process reward model's (a prm run's) step scores instead of one score per answer."""
    iterates: bool = False
    """A round of iterative RLHF can start from a finished run: retrain its reward model, then it, then sample."""

    def __post_init__(self) -> None:
        if self.export_kind not in EXPORT_KINDS:
            raise ValueError(f"export_kind must be one of {', '.join(EXPORT_KINDS)}, got {self.export_kind!r}")
        if self.online and not (self.trains_policy and self.takes_reward_run):
            raise ValueError(f"{self.kind}: an online method samples a policy and scores it with a reward run")
        if (self.process_rewards or self.iterates) and not self.online:
            raise ValueError(f"{self.kind}: process rewards and iteration need an online method")

    @property
    def data_field(self) -> str:
        """The config field the export's file goes into: methods that sample read prompts, the others train rows."""
        return "prompts" if self.export_kind == "prompts" else "train"

    def config_class(self) -> type:
        """The config dataclass, imported now (training.config imports no torch)."""
        module, _, name = self.config.rpartition(".")
        found = getattr(importlib.import_module(module), name)
        if not isinstance(found, type):
            raise TypeError(f"{self.config} is not a class")
        return found


METHODS: tuple[Method, ...] = (
    Method("sft", "training.config.SFTConfig", "training.sft", "sft",
           "supervised fine-tuning on an SFT export (prompt/completion or chat messages)",
           trains_policy=True),
    Method("reward", "training.config.RewardConfig", "training.reward_model", "pairs",
           "train a Bradley–Terry reward model on a pairs export",
           takes_reward_run=True),
    Method("prm", "training.config.PRMConfig", "training.prm", "steps",
           "train a process reward model (a score per step) on a steps export"),
    Method("dpo", "training.config.DPOConfig", "training.dpo", "pairs",
           "direct preference optimisation (DPO or IPO) of a policy on a pairs export",
           trains_policy=True),
    Method("rft", "training.config.RFTConfig", "training.rft", "prompts",
           "rejection-sampling fine-tuning, offline or online, on a prompts export",
           trains_policy=True, online=True, takes_reward_run=True),
    Method("grpo", "training.config.GRPOConfig", "training.grpo", "prompts",
           "train a policy with GRPO or GSPO on a prompts export",
           trains_policy=True, online=True, takes_reward_run=True, process_rewards=True, iterates=True),
    Method("ppo", "training.config.PPOConfig", "training.ppo", "prompts",
           "train a policy with PPO (value model, reference, reward model)",
           trains_policy=True, online=True, takes_reward_run=True, iterates=True),
)
"""Every method, in the order the CLI, the API and the training form list them."""

BY_KIND: dict[str, Method] = {method.kind: method for method in METHODS}
KINDS: tuple[str, ...] = tuple(BY_KIND)
POLICY_KINDS: tuple[str, ...] = tuple(m.kind for m in METHODS if m.trains_policy)
ONLINE_KINDS: tuple[str, ...] = tuple(m.kind for m in METHODS if m.online)
PROCESS_REWARD_KINDS: tuple[str, ...] = tuple(m.kind for m in METHODS if m.process_rewards)
ITERATING_KINDS: tuple[str, ...] = tuple(m.kind for m in METHODS if m.iterates)

