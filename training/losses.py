"""Pure tensor functions for reward models, process reward models, SFT, DPO/IPO, PPO and GRPO/GSPO: one per formula.

Conventions: `B` responses, `T` tokens, `V` vocabulary. `mask` is 1.0 on response tokens and 0.0 on
padding (right padding unless a function says otherwise). Log-probs are per token, already gathered
at the sampled token. Every loss is returned as a scalar to minimise. `old_logp` and `ref_logp` are
detached inside the losses: they are data from rollout time, never something to differentiate.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

# ----------------------------------------------------------------------------------------------
# masked reductions


def masked_sum(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m over `dim` (all elements when None): the sum over unmasked positions only."""
    return (x * mask).sum() if dim is None else (x * mask).sum(dim=dim)


def masked_mean(x: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Σ x·m / Σ m over `dim` (all elements when None); 0 where the mask is empty, never NaN."""
    # clamp rather than +eps so a fractional mask still divides exactly; an empty mask has numerator 0
    return masked_sum(x, mask, dim) / (mask.sum() if dim is None else mask.sum(dim=dim)).clamp(min=1e-8)


def masked_var(x: Tensor, mask: Tensor, unbiased: bool = True) -> Tensor:
    """Var over unmasked positions, Σ m·(x − μ)² / (Σ m − 1) with Bessel's correction when `unbiased`."""
    mean = masked_mean(x, mask)
    n = mask.sum()
    var = masked_sum((x - mean) ** 2, mask) / n.clamp(min=1e-8)
    if unbiased:
        var = var * n / (n - 1).clamp(min=1e-8) if n > 1 else var
    return var


def masked_whiten(x: Tensor, mask: Tensor, shift_mean: bool = True) -> Tensor:
    """x̂ = (x − μ) / √(σ² + 1e-8) over unmasked positions (μ added back when not `shift_mean`); padding → 0."""
    mean, var = masked_mean(x, mask), masked_var(x, mask)
    whitened = (x - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened * mask


# ----------------------------------------------------------------------------------------------
# reward model (Bradley–Terry)


def _weighted_mean(loss: Tensor, weight: Tensor | None) -> Tensor:
    if weight is None:
        return loss.mean()
    return (loss * weight).sum() / weight.sum().clamp(min=1e-8)


def bradley_terry_loss(r_c: Tensor, r_r: Tensor, margin: Tensor | None = None, weight: Tensor | None = None) -> Tensor:
    """L = −log σ(r_c − r_r − m), weighted mean over pairs (Bradley & Terry 1952; margin m: Llama 2)."""
    delta = r_c - r_r  # (B,)
    if margin is not None:
        delta = delta - margin
    return _weighted_mean(-F.logsigmoid(delta), weight)


def soft_bradley_terry_loss(r_c: Tensor, r_r: Tensor, p: Tensor, weight: Tensor | None = None) -> Tensor:
    """L = −[p·log σ(Δ) + (1−p)·log σ(−Δ)], Δ = r_c − r_r: BT cross-entropy against a soft label p(c ≻ r)."""
    delta = r_c - r_r  # (B,)
    loss = -(p * F.logsigmoid(delta) + (1 - p) * F.logsigmoid(-delta))
    return _weighted_mean(loss, weight)


def reward_centering_loss(r_c: Tensor, r_r: Tensor, coef: float) -> Tensor:
    """L = c·mean((r_c + r_r)²): pulls rewards towards zero mean (Eisenstein et al. 2023, "Helping or Herding")."""
    return coef * ((r_c + r_r) ** 2).mean()


# ----------------------------------------------------------------------------------------------
# process reward model


def step_bce_loss(s: Tensor, y: Tensor, mask: Tensor, num_steps: Tensor | float | None = None) -> Tensor:
    """L = −Σ_j m_j·[y_j·log σ(s_j) + (1 − y_j)·log σ(−s_j)] / N, N = Σ_j m_j unless given: binary cross-entropy
    of each labelled step's score at its separator token (Lightman et al. 2023, PRM800K; Wang et al. 2024,
    Math-Shepherd)."""
    # s, y, mask: (B, T); mask is 1 at each step's separator token; N is passed in for a larger (global) batch
    loss = -(y * F.logsigmoid(s) + (1 - y) * F.logsigmoid(-s))
    total = mask.sum().clamp(min=1.0) if num_steps is None else num_steps
    return masked_sum(loss, mask) / total


# ----------------------------------------------------------------------------------------------
# supervised fine-tuning


def sft_loss(logp: Tensor, mask: Tensor, num_tokens: Tensor | float | None = None) -> Tensor:
    """L = −Σ_t m_t·log π(y_t | x, y_<t) / N, N = Σ_t m_t unless given: the token-mean NLL of the targets."""
    # logp, mask: (B, T); N is passed in when the mean is over a larger (global) batch than this one
    total = mask.sum().clamp(min=1.0) if num_tokens is None else num_tokens
    return -(logp * mask).sum() / total


# ----------------------------------------------------------------------------------------------
# direct preference optimisation


def dpo_logits(logp_c: Tensor, logp_r: Tensor, ref_logp_c: Tensor, ref_logp_r: Tensor) -> Tensor:
    """h = (log π(y_c) − log π_ref(y_c)) − (log π(y_r) − log π_ref(y_r)): the log-ratio margin; (B,) sequence sums."""
    return (logp_c - ref_logp_c.detach()) - (logp_r - ref_logp_r.detach())


def dpo_loss(h: Tensor, beta: float, p: Tensor | None = None, margin: Tensor | None = None,
             weight: Tensor | None = None) -> Tensor:
    """L = −[p·log σ(β·h − m) + (1 − p)·log σ(−(β·h − m))] (Rafailov et al. 2023; p < 1: conservative DPO's label
    smoothing, Mitchell 2023; m: a margin, as in the reward model), weighted mean over pairs."""
    z = beta * h  # (B,)
    if margin is not None:
        z = z - margin
    loss = -F.logsigmoid(z) if p is None else -(p * F.logsigmoid(z) + (1 - p) * F.logsigmoid(-z))
    return _weighted_mean(loss, weight)


def ipo_loss(h: Tensor, beta: float, p: Tensor | None = None, weight: Tensor | None = None) -> Tensor:
    """L = (h − (2p − 1)/(2β))² (Azar et al. 2023, IPO: h regressed to 1/(2β) for a sure preference, p = 1; to 0 for
    a coin flip), weighted mean over pairs."""
    target = 1 / (2 * beta) if p is None else (2 * p - 1) / (2 * beta)  # () or (B,)
    return _weighted_mean((h - target) ** 2, weight)


# ----------------------------------------------------------------------------------------------
# PPO


def _per_token(adv: Tensor) -> Tensor:
    """A sequence advantage (B,) becomes (B, 1) so it broadcasts over tokens; (B, T) is left as is."""
    return adv.unsqueeze(-1) if adv.dim() == 1 else adv


def _clipped_surrogate(ratio: Tensor, adv: Tensor, clip_eps: float, clip_eps_high: float | None) -> Tensor:
    """min(r·A, clip(r, 1−ε, 1+ε_high)·A), elementwise."""
    high = clip_eps if clip_eps_high is None else clip_eps_high
    return torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + high) * adv)


def ppo_clip_loss(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, clip_eps: float,
                  clip_eps_high: float | None = None) -> Tensor:
    """PPO clipped surrogate, L = mean(min(r·A, clip(r, 1−ε, 1+ε_high)·A)) (Schulman et al. 2017), as a loss.

    ε_high defaults to ε; a larger one is DAPO's "clip-higher" (Yu et al. 2025).
    """
    ratio = torch.exp(logp - old_logp.detach())  # (B, T)
    surrogate = _clipped_surrogate(ratio, _per_token(adv), clip_eps, clip_eps_high)  # (B, T)
    return -masked_mean(surrogate, mask)


def clip_fraction(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, clip_eps: float,
                  clip_eps_high: float | None = None) -> Tensor:
    """Fraction of tokens where min(·) picks the clipped term, i.e. where the PPO gradient is zero."""
    with torch.no_grad():
        ratio = torch.exp(logp - old_logp)  # (B, T)
        adv = _per_token(adv)
        clipped = _clipped_surrogate(ratio, adv, clip_eps, clip_eps_high) < ratio * adv  # (B, T)
        return masked_mean(clipped.to(mask.dtype if mask.is_floating_point() else torch.float32), mask)


# ----------------------------------------------------------------------------------------------
# KL between policy and reference, estimated from samples of the policy (Schulman 2020, "Approximating KL")


def kl_k1(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k1 = log π(x) − log π_ref(x) per token: unbiased, high variance, can be negative."""
    return logp - ref_logp


def kl_k2(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k2 = ½·(log π(x) − log π_ref(x))² per token: biased, low variance, ≥ 0."""
    return 0.5 * (logp - ref_logp) ** 2


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 = exp(log π_ref − log π) − (log π_ref − log π) − 1 per token: unbiased, ≥ 0 (used by GRPO)."""
    log_ratio = ref_logp - logp
    return torch.exp(log_ratio) - log_ratio - 1


def kl_penalized_reward(score: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float) -> Tensor:
    """R = r_RM − β·Σ_t (log π − log π_ref) per sequence (Ziegler et al. 2019; Ouyang et al. 2022)."""
    return score - beta * masked_sum(kl_k1(logp, ref_logp), mask, dim=-1)  # (B,)


def last_token_index(mask: Tensor) -> Tensor:
    """Index of the last unmasked token of each row (B,); 0 for an empty row."""
    positions = torch.arange(mask.shape[-1], device=mask.device)  # (T,)
    return ((mask > 0).long() * positions).argmax(dim=-1)


def per_token_rewards(score: Tensor, logp: Tensor, ref_logp: Tensor, mask: Tensor, beta: float) -> Tensor:
    """r_t = −β·(log π − log π_ref)_t on every token, plus r_RM on the last one (Ziegler et al. 2019); (B, T)."""
    rewards = -beta * kl_k1(logp, ref_logp) * mask  # (B, T)
    last = last_token_index(mask)  # (B,)
    rewards = rewards.scatter_add(-1, last.unsqueeze(-1), score.to(rewards.dtype).unsqueeze(-1))
    return rewards


# ----------------------------------------------------------------------------------------------
# advantages and values


def gae(rewards: Tensor, values: Tensor, mask: Tensor, gamma: float, lam: float) -> tuple[Tensor, Tensor]:
    """Â_t = Σ_l (γλ)^l δ_{t+l}, δ_t = r_t + γ·V_{t+1} − V_t (Schulman et al. 2016); returns (Â, Â + V), both (B, T).

    Sequences are right-padded: the step after the last unmasked token is terminal (V = 0), and
    padding positions get advantage and return 0.
    """
    B, T = rewards.shape
    mask = mask.to(values.dtype)
    advantages = torch.zeros_like(values)  # (B, T)
    next_adv = torch.zeros(B, dtype=values.dtype, device=values.device)
    next_value = torch.zeros_like(next_adv)
    next_mask = torch.zeros_like(next_adv)
    for t in reversed(range(T)):
        # next_mask zeroes the bootstrap past the end of a sequence, which makes the end terminal
        delta = rewards[:, t] + gamma * next_value * next_mask - values[:, t]
        next_adv = (delta + gamma * lam * next_mask * next_adv) * mask[:, t]
        advantages[:, t] = next_adv
        next_value, next_mask = values[:, t], mask[:, t]
    returns = (advantages + values) * mask
    return advantages.detach(), returns.detach()


def value_loss(values: Tensor, old_values: Tensor, returns: Tensor, mask: Tensor,
               clip_eps: float | None = None) -> Tensor:
    """L_V = ½·mean(max((V − R)², (V_clip − R)²)), V_clip = V_old + clip(V − V_old, ±ε) (OpenAI baselines PPO2).

    Without `clip_eps` it is ½·mean((V − R)²).
    """
    loss = (values - returns) ** 2  # (B, T)
    if clip_eps is not None:
        old_values = old_values.detach()
        v_clipped = old_values + (values - old_values).clamp(-clip_eps, clip_eps)
        loss = torch.max(loss, (v_clipped - returns) ** 2)
    return 0.5 * masked_mean(loss, mask)


def entropy_from_logits(logits: Tensor) -> Tensor:
    """H = logsumexp(z) − Σ softmax(z)·z: entropy of the next-token distribution; (B, T, V) → (B, T)."""
    return torch.logsumexp(logits, dim=-1) - (torch.softmax(logits, dim=-1) * logits).sum(dim=-1)


def logprobs_from_logits(logits: Tensor, labels: Tensor) -> Tensor:
    """log softmax(z)[y] per position: the log-probability of each label token; (B, T, V), (B, T) → (B, T)."""
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, labels.unsqueeze(-1)).squeeze(-1)


# ----------------------------------------------------------------------------------------------
# GRPO / GSPO

AdvantageScale = Literal["group", "batch", "none"]


def group_advantages(rewards: Tensor, group_size: int, scale: AdvantageScale = "group",
                     eps: float = 1e-4) -> tuple[Tensor, float]:
    """A_i = (r_i − mean(r_group)) / (std + eps) (Shao et al. 2024, DeepSeekMath); returns (A, zero-std fraction).

    `rewards` holds N contiguous groups of G. `scale`: "group" divides by each group's std,
    "batch" by the std of the whole batch, "none" does not divide (Dr. GRPO, Liu et al. 2025).
    Standard deviations are unbiased (Bessel), as torch.std and the DeepSeekMath/TRL code compute them.
    """
    if rewards.dim() != 1 or rewards.numel() % group_size != 0:
        raise ValueError(f"rewards must be a flat tensor of N·{group_size} values, got shape {tuple(rewards.shape)}")
    rewards = rewards if rewards.is_floating_point() else rewards.float()
    grouped = rewards.view(-1, group_size)  # (N, G)
    mean = grouped.mean(dim=1, keepdim=True)  # (N, 1)
    std = grouped.std(dim=1, keepdim=True) if group_size > 1 else torch.zeros_like(mean)  # (N, 1)
    zero_std_fraction = (std.squeeze(1) < 1e-8).float().mean().item()
    centred = grouped - mean
    if scale == "group":
        adv = centred / (std + eps)
    elif scale == "batch":
        adv = centred / (rewards.std() + eps)
    elif scale == "none":
        adv = centred
    else:
        raise ValueError(f"scale must be 'group', 'batch' or 'none', got {scale!r}")
    return adv.reshape(-1), zero_std_fraction


def _groups(step_values: list[list[float]], group_size: int) -> list[list[list[float]]]:
    """The ragged per-step values cut into contiguous groups of `group_size` completions."""
    if len(step_values) % group_size != 0:
        raise ValueError(f"got {len(step_values)} completions, not a multiple of group_size={group_size}")
    return [step_values[start:start + group_size] for start in range(0, len(step_values), group_size)]


def _group_stats(group: list[list[float]]) -> tuple[Tensor, Tensor]:
    """Mean and unbiased std over every step of every completion of one group (0 when there are too few)."""
    flat = torch.tensor([r for steps in group for r in steps], dtype=torch.float64)
    mean = flat.mean() if flat.numel() else torch.tensor(0.0, dtype=torch.float64)
    std = flat.std() if flat.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
    return mean, std


def _normalised(group: list[list[float]], eps: float) -> list[Tensor]:
    """Each completion's steps as (r − mean) / (std + eps), mean and std over the group's steps."""
    mean, std = _group_stats(group)
    return [(torch.tensor(steps, dtype=torch.float64) - mean) / (std + eps) for steps in group]


def process_advantages(step_rewards: list[list[float]], group_size: int, eps: float = 1e-4) -> list[list[float]]:
    """A_j = Σ_{k ≥ j} r̃_k, r̃ = (r − mean) / (std + eps) over the group's steps (DeepSeekMath §4.1.3, process RL).

    `step_rewards[i]` holds the per-step rewards of completion i; completions come in contiguous groups
    of `group_size`. The result has the same ragged shape: the advantage of step j of each completion,
    which every token of that step receives. Its size grows with the steps left after j.
    """
    out: list[list[float]] = []
    for group in _groups(step_rewards, group_size):
        for normed in _normalised(group, eps):
            # reverse cumulative sum: each step is credited with every normalised reward from it onwards
            out.append(normed.flip(0).cumsum(0).flip(0).tolist())
    return out


def mean_process_advantages(step_rewards: list[list[float]], group_size: int, eps: float = 1e-4
                            ) -> list[list[float]]:
    """A_j = Σ_{k ≥ j} r̃_k / (n − j): DeepSeekMath's process credit (§4.1.3) divided by the n − j steps it sums.

    The sum form grows with the steps left, like a larger learning rate early in a long answer; the mean keeps
    every step's credit on the scale of one normalised reward. r̃ is normalised over the group as in the sum form.
    """
    out: list[list[float]] = []
    for group in _groups(step_rewards, group_size):
        for normed in _normalised(group, eps):
            left = torch.arange(normed.numel(), 0, -1, dtype=torch.float64)  # n − j for j = 0 … n − 1
            out.append((normed.flip(0).cumsum(0).flip(0) / left).tolist())
    return out


def min_process_advantages(step_rewards: list[list[float]], group_size: int, eps: float = 1e-4
                           ) -> list[list[float]]:
    """A_j = (G_j − mean) / (std + eps), G_j = min_{k ≥ j} r_k (Cheng et al. 2025, PURE, "Stop Summation: Min-Form
    Credit Assignment"): a step's return is the worst step reward from it onwards, normalised over the group's steps.

    PURE's PRM+VR adds the verifiable (outcome) reward to the last step's reward before the minimum, as
    `compute_rewards` puts outcome rewards on the last step. Its code baselines with RLOO per token; this
    normalises over the group's step returns, as the other forms here do.
    """
    returns: list[list[float]] = []
    for steps in step_rewards:
        r = torch.tensor(steps, dtype=torch.float64)
        # reverse running minimum: the smallest reward from each step to the end
        returns.append(torch.cummin(r.flip(0), dim=0).values.flip(0).tolist() if r.numel() else [])
    return [normed.tolist() for group in _groups(returns, group_size) for normed in _normalised(group, eps)]


def first_error_advantages(step_rewards: list[list[float]], group_size: int, threshold: float = 0.5,
                           eps: float = 1e-4) -> list[list[float]]:
    """A_j = (v_j − mean) / (std + eps), v_j = 1 while every step up to j has r ≥ τ, else 0: the verified prefix is
    credited, the first wrong step and every step after it penalised (the prefix form of step-verified rewards:
    Uesato et al. 2022 and Lightman et al. 2023 label a step good only when every step up to it is).

    Mean and std are over the group's steps of v, so a group whose steps are all verified (or all not) gets 0.
    """
    verified: list[list[float]] = []
    for steps in step_rewards:
        ok = torch.tensor([r >= threshold for r in steps], dtype=torch.float64)
        verified.append(torch.cumprod(ok, dim=0).tolist() if ok.numel() else [])
    return [normed.tolist() for group in _groups(verified, group_size) for normed in _normalised(group, eps)]


def progress_advantages(values: list[list[float]], v0: Sequence[float], group_size: int, eps: float = 1e-4
                        ) -> list[list[float]]:
    """A_j = (V_j − V_{j−1}) / (rms + eps) (Setlur et al. 2024, "Rewarding Progress"): a step's credit is the change
    in the estimated probability of success across it, V_j after step j and V_0 = `v0[i]` before the first step.

    `values[i][j]` is V after step j of completion i (a Monte-Carlo estimate, a soft-label PRM's score, or the
    outcome for the last step). The progress is an advantage already (Q − V), so it is not centred: it is only
    rescaled to unit root-mean-square over the group's steps, so its size matches the other forms'.
    """
    if len(v0) != len(values):
        raise ValueError(f"v0 has {len(v0)} values for {len(values)} completions")
    gains: list[list[float]] = []
    for start, steps in zip(v0, values, strict=True):
        v = torch.tensor([start, *steps], dtype=torch.float64)
        gains.append((v[1:] - v[:-1]).tolist())
    out: list[list[float]] = []
    for group in _groups(gains, group_size):
        flat = torch.tensor([g for steps in group for g in steps], dtype=torch.float64)
        rms = flat.pow(2).mean().sqrt() if flat.numel() else torch.tensor(0.0, dtype=torch.float64)
        out += [(torch.tensor(steps, dtype=torch.float64) / (rms + eps)).tolist() for steps in group]
    return out


def _unit_rms(values: Tensor, eps: float) -> Tensor:
    return values / (values.pow(2).mean().sqrt() + eps) if values.numel() else values


def mixed_advantages(outcome_adv: Sequence[float], process_adv: list[list[float]], group_size: int, alpha: float,
                     eps: float = 1e-4) -> list[list[float]]:
    """A_ij = Â^o_i + α·Â^p_ij, each part rescaled to unit root-mean-square over its group (Setlur et al. 2024 train
    on Q + α·A^μ, the outcome's value plus α times a process advantage; PURE mixes its verifiable reward in too).

    `outcome_adv[i]` is completion i's outcome advantage, `process_adv[i][j]` its step j's process advantage; the
    result is per step, every step of a completion carrying its outcome part.
    """
    if len(outcome_adv) != len(process_adv):
        raise ValueError(f"{len(outcome_adv)} outcome advantages for {len(process_adv)} completions")
    out: list[list[float]] = []
    outcome = torch.tensor(list(outcome_adv), dtype=torch.float64)
    for g, group in enumerate(_groups(process_adv, group_size)):
        a_o = _unit_rms(outcome[g * group_size:(g + 1) * group_size], eps)  # (G,)
        flat = _unit_rms(torch.tensor([a for steps in group for a in steps], dtype=torch.float64), eps)
        k = 0
        for i, steps in enumerate(group):
            out.append((a_o[i] + alpha * flat[k:k + len(steps)]).tolist())
            k += len(steps)
    return out


def clip_advantages(adv: Tensor, clip: float) -> Tensor:
    """A ← clip(A, −c, c) per token: bounds any one token's credit, so a long chain's summed process credit cannot
    act as a larger learning rate against a fixed β (the scale control for the sum form)."""
    if clip <= 0:
        raise ValueError(f"clip must be positive, got {clip}")
    return adv.clamp(-clip, clip)


Aggregation = Literal["sequence", "token", "dr_grpo"]


def grpo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, clip_eps: float,
              beta: float, aggregation: Aggregation = "sequence", clip_eps_high: float | None = None,
              max_tokens: int | None = None) -> Tensor:
    """L = −agg_t[min(r_t·A, clip(r_t, 1−ε, 1+ε_high)·A) − β·k3_t], r_t = π/π_old (Shao et al. 2024, DeepSeekMath).

    `adv` is (B,) for outcome rewards or (B, T) for process rewards. `aggregation`: "sequence" averages
    each response's tokens, then responses (DeepSeekMath); "token" averages all tokens of the batch
    (DAPO, Yu et al. 2025); "dr_grpo" sums and divides by B·max_tokens, a constant (Liu et al. 2025),
    where `max_tokens` defaults to T. `ref_logp` may be None when beta is 0.
    """
    ratio = torch.exp(logp - old_logp.detach())  # (B, T)
    per_token = -_clipped_surrogate(ratio, _per_token(adv), clip_eps, clip_eps_high)  # (B, T)
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when beta != 0")
        per_token = per_token + beta * kl_k3(logp, ref_logp.detach())
    if aggregation == "sequence":
        return masked_mean(per_token, mask, dim=-1).mean()
    if aggregation == "token":
        return masked_mean(per_token, mask)
    if aggregation == "dr_grpo":
        normaliser = mask.shape[0] * (mask.shape[-1] if max_tokens is None else max_tokens)
        return masked_sum(per_token, mask) / normaliser
    raise ValueError(f"aggregation must be 'sequence', 'token' or 'dr_grpo', got {aggregation!r}")


def gspo_loss(logp: Tensor, old_logp: Tensor, ref_logp: Tensor | None, adv: Tensor, mask: Tensor, clip_eps: float,
              beta: float, clip_eps_high: float | None = None) -> Tensor:
    """L = −mean_i[min(s_i·A_i, clip(s_i, 1−ε, 1+ε_high)·A_i)], s_i = exp(mean_t(log π − log π_old)) (GSPO, Zheng 2025).

    The ratio and the clipping are per sequence: a response is kept or dropped whole. `adv` is (B,).
    The KL term, when beta > 0, is each response's mean k3, averaged over responses.
    """
    if adv.dim() != 1:
        raise ValueError(f"GSPO takes one advantage per sequence, shape (B,); got {tuple(adv.shape)}")
    log_s = masked_mean(logp - old_logp.detach(), mask, dim=-1)  # (B,) length-normalised log-ratio
    s = torch.exp(log_s)  # (B,)
    loss = -_clipped_surrogate(s, adv, clip_eps, clip_eps_high).mean()
    if beta != 0.0:
        if ref_logp is None:
            raise ValueError("ref_logp is required when beta != 0")
        loss = loss + beta * masked_mean(kl_k3(logp, ref_logp.detach()), mask, dim=-1).mean()
    return loss


def gspo_clip_fraction(logp: Tensor, old_logp: Tensor, adv: Tensor, mask: Tensor, clip_eps: float,
                       clip_eps_high: float | None = None) -> Tensor:
    """Fraction of sequences whose GSPO term is clipped (zero gradient)."""
    with torch.no_grad():
        s = torch.exp(masked_mean(logp - old_logp, mask, dim=-1))  # (B,)
        return (_clipped_surrogate(s, adv, clip_eps, clip_eps_high) < s * adv).float().mean()
