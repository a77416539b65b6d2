"""PPO's actor-critic: a scalar value head on the policy's hidden states, or on a separate critic model.

Two layouts, chosen by `PPOConfig.critic`:

- **shared** (default): V(s_t) = w·h_t + b on the policy's last hidden state. One forward pass gives
  log-probs, entropy and values; the only extra memory is the head (H + 1 parameters) and its
  optimiser state. The value loss also trains the policy's trunk.
- **separate critic**: a second decoder (any causal-LM directory; its LM head is not used) with its
  own head. It costs a whole second model — weights, gradients and AdamW's two moments, about 4× the
  model's parameter bytes on top of the policy — and a second forward/backward per minibatch, in
  exchange for a value function that cannot disturb the policy's features. This is the memory
  GRPO saves by having no critic at all.

A bidirectional encoder (BERT, MiniLM) must not be the critic: V(s_t) would see the tokens after t.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from training.losses import entropy_from_logits, logprobs_from_logits
from training.policy import position_ids_from_mask, unwrap
from training.weights import SAFE_LOAD, require_safetensors

HEAD_FILE = "value_head.safetensors"
ENCODERS = {"bert", "roberta", "deberta", "deberta-v2", "xlm-roberta", "distilbert", "electra", "mpnet"}
"""Bidirectional model types refused as critics."""


def hidden_size(model: nn.Module) -> int:
    """Width of the last hidden state of a (possibly peft-wrapped) transformers model."""
    config: Any = unwrap(model).config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    for name in ("hidden_size", "n_embd", "d_model"):
        if getattr(config, name, None):
            return int(getattr(config, name))
    raise ValueError(f"cannot tell the hidden size of {type(model).__name__}")


class ValueHead(nn.Module):
    """V(s) = w·h + b: one linear map from a hidden state (…, H) to a scalar value (…)."""

    def __init__(self, hidden: int) -> None:
        super().__init__()
        self.linear = nn.Linear(hidden, 1)
        # zero init: V ≡ 0 at the start, so the first value-loss gradients do not push random
        # directions into a shared trunk before the head has learned anything
        nn.init.zeros_(self.linear.weight)
        nn.init.zeros_(self.linear.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.linear(hidden.to(self.linear.weight.dtype)).squeeze(-1)


class ActorCritic(nn.Module):
    """The policy π_θ and the value model V_φ as one module, so one optimiser and one DDP wrapper cover both."""

    def __init__(self, policy: nn.Module, critic: nn.Module | None = None) -> None:
        super().__init__()
        self.policy = policy
        self.critic = critic
        self.value_head = ValueHead(hidden_size(critic if critic is not None else policy))

    @property
    def shared(self) -> bool:
        return self.critic is None

    def forward(self, input_ids: Tensor, attention_mask: Tensor, response_mask: Tensor, temperature: float = 1.0,
                with_entropy: bool = False) -> tuple[Tensor, Tensor | None, Tensor]:
        """(logp, entropy, values) of the response (the last R columns), each (B, R), 0 on padding.

        Column t holds log π(y_t | x, y_<t) and V(x, y_<t): the value of the state in which y_t is chosen.
        """
        width = response_mask.shape[1]
        mask = response_mask.to(torch.float32)
        position_ids = position_ids_from_mask(attention_mask)
        out = self.policy(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                          logits_to_keep=width + 1, use_cache=False, output_hidden_states=self.shared)
        logits = out.logits[:, -width - 1:-1, :].float()  # (B, R, V): position t predicts response token t
        if temperature != 1.0:
            logits = logits / temperature
        logp = logprobs_from_logits(logits, input_ids[:, -width:]) * mask  # (B, R)
        entropy = entropy_from_logits(logits) * mask if with_entropy else None
        if self.critic is None:  # shared
            hidden = out.hidden_states[-1][:, -width - 1:-1, :]  # (B, R, H), after the final norm
        else:
            hidden = self.critic(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                                 use_cache=False).last_hidden_state[:, -width - 1:-1, :]
        values = self.value_head(hidden).float() * mask  # (B, R)
        return logp, entropy, values

    def save_value_model(self, path: str | Path) -> None:
        """PATH/value_head.safetensors, plus the critic backbone (save_pretrained) when it is separate."""
        from safetensors.torch import save_file

        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().cpu().contiguous() for k, v in self.value_head.state_dict().items()},
                  str(path / HEAD_FILE))
        if self.critic is not None:
            critic: Any = self.critic  # save_pretrained is the transformers model's own, not nn.Module's
            critic.save_pretrained(path, safe_serialization=True)

    def load_value_model(self, path: str | Path) -> None:
        from safetensors.torch import load_file

        path = Path(path)
        self.value_head.load_state_dict(load_file(str(path / HEAD_FILE)))
        if self.critic is not None:
            self.critic.load_state_dict(load_file(str(path / "model.safetensors")))


def load_critic(path: str | Path, dtype: torch.dtype | None = None) -> nn.Module:
    """The decoder of a causal-LM directory (`AutoModel`: hidden states, no LM head) to carry a value head."""
    from transformers import AutoConfig, AutoModel

    path = Path(path)
    if not path.is_dir():
        raise ValueError(f"critic: {path} is not a directory")
    config = AutoConfig.from_pretrained(path)
    if getattr(config, "is_encoder_decoder", False) or config.model_type in ENCODERS:
        raise ValueError(f"critic: {path} is a {config.model_type} encoder; a value V(s_t) needs a causal decoder")
    require_safetensors(path, "critic")
    kwargs: dict[str, Any] = {"dtype": dtype} if dtype is not None else {}
    model = AutoModel.from_pretrained(path, **kwargs, **SAFE_LOAD)
    model.eval()  # dropout off, as for the policy: values at rollout and at update time must agree
    return model
