"""Every loss against numbers a person can check by hand (the comments show the arithmetic)."""

import math

import pytest
import torch

from training.losses import (
    bradley_terry_loss,
    clip_advantages,
    clip_fraction,
    dpo_logits,
    dpo_loss,
    entropy_from_logits,
    first_error_advantages,
    gae,
    group_advantages,
    grpo_loss,
    gspo_clip_fraction,
    gspo_loss,
    ipo_loss,
    kl_k1,
    kl_k2,
    kl_k3,
    kl_penalized_reward,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_whiten,
    mean_process_advantages,
    min_process_advantages,
    mixed_advantages,
    per_token_rewards,
    ppo_clip_loss,
    process_advantages,
    progress_advantages,
    reward_centering_loss,
    sft_loss,
    soft_bradley_terry_loss,
    value_loss,
)


def t(x):
    return torch.tensor(x, dtype=torch.float64)


LOG2 = math.log(2.0)


# --- masked reductions -------------------------------------------------------------------------


def test_masked_sum_and_mean_ignore_padding():
    x = t([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    assert masked_sum(x, mask).item() == pytest.approx(7.0)  # 1 + 2 + 4
    assert masked_mean(x, mask).item() == pytest.approx(7.0 / 3.0)
    assert masked_sum(x, mask, dim=-1).tolist() == pytest.approx([3.0, 4.0])
    assert masked_mean(x, mask, dim=-1).tolist() == pytest.approx([1.5, 4.0])


def test_masked_mean_of_empty_row_is_zero_not_nan():
    out = masked_mean(t([[1.0, 2.0], [3.0, 4.0]]), t([[1.0, 1.0], [0.0, 0.0]]), dim=-1)
    assert out.tolist() == pytest.approx([1.5, 0.0])


def test_masked_whiten():
    # unmasked 1, 2, 3: mean 2, unbiased variance (1 + 0 + 1) / 2 = 1; the padded 100 is ignored and zeroed
    x, mask = t([1.0, 2.0, 3.0, 100.0]), t([1.0, 1.0, 1.0, 0.0])
    assert masked_whiten(x, mask).tolist() == pytest.approx([-1.0, 0.0, 1.0, 0.0], abs=1e-6)
    assert masked_whiten(x, mask, shift_mean=False).tolist() == pytest.approx([1.0, 2.0, 3.0, 0.0], abs=1e-6)


# --- Bradley–Terry -----------------------------------------------------------------------------


def test_bradley_terry_hand_values():
    # Δ = 0 → −log σ(0) = log 2; Δ = 2 → log(1 + e^−2) = 0.126928
    assert bradley_terry_loss(t([0.0]), t([0.0])).item() == pytest.approx(LOG2)
    assert bradley_terry_loss(t([2.0]), t([0.0])).item() == pytest.approx(math.log1p(math.exp(-2)))
    # a margin of 1 on Δ = 1 leaves σ(0): log 2
    assert bradley_terry_loss(t([1.0]), t([0.0]), margin=t([1.0])).item() == pytest.approx(LOG2)


def test_bradley_terry_weighted_mean():
    # losses [log 2, 0.126928] with weights [1, 3]: (0.693147 + 3·0.126928) / 4 = 0.268483
    loss = bradley_terry_loss(t([0.0, 2.0]), t([0.0, 0.0]), weight=t([1.0, 3.0]))
    assert loss.item() == pytest.approx((LOG2 + 3 * math.log1p(math.exp(-2))) / 4)
    assert loss.item() == pytest.approx(0.268483, abs=1e-6)


def test_soft_bradley_terry_equals_hard_at_p_one():
    r_c, r_r = t([0.3, -1.0, 2.5]), t([0.1, 0.4, -0.5])
    hard = bradley_terry_loss(r_c, r_r)
    soft = soft_bradley_terry_loss(r_c, r_r, p=t([1.0, 1.0, 1.0]))
    assert soft.item() == pytest.approx(hard.item())
    # p = 0 is the hard loss with the pair swapped
    swapped = soft_bradley_terry_loss(r_c, r_r, p=t([0.0, 0.0, 0.0]))
    assert swapped.item() == pytest.approx(bradley_terry_loss(r_r, r_c).item())


def test_soft_bradley_terry_half_label():
    # p = ½, Δ = 2: ½·(log(1 + e^−2) + log(1 + e^2)) = ½·(0.126928 + 2.126928) = 1.126928
    loss = soft_bradley_terry_loss(t([2.0]), t([0.0]), p=t([0.5]))
    assert loss.item() == pytest.approx(1.126928, abs=1e-6)


def test_soft_bradley_terry_is_minimised_where_sigma_delta_equals_p():
    delta = torch.zeros(1, dtype=torch.float64, requires_grad=True)
    opt = torch.optim.SGD([delta], lr=1.0)
    for _ in range(500):
        opt.zero_grad()
        soft_bradley_terry_loss(delta, torch.zeros(1, dtype=torch.float64), p=t([0.8])).backward()
        opt.step()
    assert torch.sigmoid(delta).item() == pytest.approx(0.8, abs=1e-4)


def test_reward_centering():
    # c·mean((1 + 1)², (2 − 2)²) = 0.01·mean(4, 0) = 0.02
    assert reward_centering_loss(t([1.0, 2.0]), t([1.0, -2.0]), coef=0.01).item() == pytest.approx(0.02)


# --- PPO ---------------------------------------------------------------------------------------


def _ppo_case(r: float, a: float, **kw):
    logp = torch.log(t([[r]])).requires_grad_(True)
    loss = ppo_clip_loss(logp, t([[0.0]]), t([[a]]), t([[1.0]]), clip_eps=0.2, **kw)
    loss.backward()
    return loss.item(), logp.grad.item()


def test_positive_advantage_ratio_above_interval_is_clipped():
    # A = +1, r = 1.5: r·A = 1.5, clip(r)·A = 1.2; min keeps 1.2, a constant: no further push up
    loss, grad = _ppo_case(1.5, 1.0)
    assert loss == pytest.approx(-1.2) and grad == 0.0


def test_positive_advantage_ratio_below_interval_keeps_full_gradient():
    # A = +1, r = 0.5: r·A = 0.5, clip(r)·A = 0.8; min keeps 0.5 and its gradient d(−r)/dlogp = −r = −0.5
    loss, grad = _ppo_case(0.5, 1.0)
    assert loss == pytest.approx(-0.5) and grad == pytest.approx(-0.5)


def test_negative_advantage_is_not_let_off_the_hook():
    # A = −1, r = 1.5: r·A = −1.5, clip(r)·A = −1.2; min keeps −1.5, so the full penalty stays
    loss, grad = _ppo_case(1.5, -1.0)
    assert loss == pytest.approx(1.5) and grad == pytest.approx(1.5)


def test_negative_advantage_ratio_below_interval_is_clipped():
    # A = −1, r = 0.5: r·A = −0.5, clip(r)·A = −0.8; min keeps −0.8, a constant: no further push down
    loss, grad = _ppo_case(0.5, -1.0)
    assert loss == pytest.approx(0.8) and grad == 0.0


def test_clip_higher_widens_only_the_upper_bound():
    # ε_high = 0.28: A = +1, r = 1.5 → min(1.5, 1.28) = 1.28; the lower side still clips at 0.8
    assert _ppo_case(1.5, 1.0, clip_eps_high=0.28)[0] == pytest.approx(-1.28)
    assert _ppo_case(0.5, -1.0, clip_eps_high=0.28)[0] == pytest.approx(0.8)


def test_ppo_loss_is_a_masked_token_mean_and_takes_sequence_advantages():
    # ratios 1 on both real tokens, A = 2 broadcast from (B,): mean(2, 2) = 2; the pad token (r = 10) is ignored
    logp = torch.log(t([[1.0, 1.0, 10.0]]))
    loss = ppo_clip_loss(logp, t([[0.0, 0.0, 0.0]]), t([2.0]), t([[1.0, 1.0, 0.0]]), clip_eps=0.2)
    assert loss.item() == pytest.approx(-2.0)


def test_clip_fraction_counts_the_two_clipped_sign_cases():
    # the four cases above as one batch: (1.5, +1) and (0.5, −1) are clipped → 2 / 4
    logp = torch.log(t([[1.5, 0.5, 1.5, 0.5]]))
    adv = t([[1.0, 1.0, -1.0, -1.0]])
    frac = clip_fraction(logp, torch.zeros_like(logp), adv, torch.ones_like(logp), clip_eps=0.2)
    assert frac.item() == pytest.approx(0.5)


# --- KL ----------------------------------------------------------------------------------------


def test_kl_estimators_hand_values():
    # π = 0.5, π_ref = 0.25: k1 = log 2; k2 = ½(log 2)² = 0.240227; k3 = 0.5 − (−log 2) − 1 = 0.193147
    logp, ref_logp = torch.log(t([0.5])), torch.log(t([0.25]))
    assert kl_k1(logp, ref_logp).item() == pytest.approx(LOG2)
    assert kl_k2(logp, ref_logp).item() == pytest.approx(0.5 * LOG2**2)
    assert kl_k3(logp, ref_logp).item() == pytest.approx(0.5 + LOG2 - 1)
    assert kl_k3(logp, ref_logp).item() == pytest.approx(0.193147, abs=1e-6)


def test_k3_is_zero_when_policies_agree_and_never_negative():
    x = torch.linspace(-3, 3, 13, dtype=torch.float64)
    assert kl_k3(x, x).abs().max().item() == 0.0
    assert (kl_k3(x, x.flip(0)) >= 0).all()


def test_kl_estimators_are_unbiased_on_samples_where_expected():
    # KL(p‖q) for p = [0.7, 0.3], q = [0.4, 0.6]; k1 and k3 average to it under samples of p
    p, q = t([0.7, 0.3]), t([0.4, 0.6])
    exact = (p * (p / q).log()).sum()
    logp, ref_logp = p.log(), q.log()
    assert (p * kl_k1(logp, ref_logp)).sum().item() == pytest.approx(exact.item())
    assert (p * kl_k3(logp, ref_logp)).sum().item() == pytest.approx(exact.item())


def test_kl_penalized_reward_sequence_level():
    # k1 on the two real tokens: (−1 + 1.5) + (−2 + 1) = −0.5; R = 1 − 0.1·(−0.5) = 1.05
    logp, ref_logp, mask = t([[-1.0, -2.0, 0.0]]), t([[-1.5, -1.0, 5.0]]), t([[1.0, 1.0, 0.0]])
    assert kl_penalized_reward(t([1.0]), logp, ref_logp, mask, beta=0.1).item() == pytest.approx(1.05)


def test_per_token_rewards_put_the_score_on_the_last_real_token():
    # −β·k1 = [−0.05, +0.1, 0]; the score 1.0 lands on token 1, the last unmasked one
    logp, ref_logp, mask = t([[-1.0, -2.0, 0.0]]), t([[-1.5, -1.0, 5.0]]), t([[1.0, 1.0, 0.0]])
    rewards = per_token_rewards(t([1.0]), logp, ref_logp, mask, beta=0.1)
    assert rewards.tolist()[0] == pytest.approx([-0.05, 1.1, 0.0])
    # summing the shaped rewards gives back the sequence-level KL-penalised reward
    assert rewards.sum().item() == pytest.approx(kl_penalized_reward(t([1.0]), logp, ref_logp, mask, 0.1).item())


# --- GAE, value, entropy -----------------------------------------------------------------------


def test_two_step_gae_by_hand():
    # γ = 0.9, λ = 0.95, r = [0, 1], V = [0.5, 0.8], the episode ends after step 1:
    # δ1 = 1 − 0.8 = 0.2, Â1 = 0.2;  δ0 = 0 + 0.9·0.8 − 0.5 = 0.22, Â0 = 0.22 + 0.9·0.95·0.2 = 0.391
    # returns = Â + V = [0.891, 1.0]. A second, padded row gives the same numbers and zeros on padding.
    rewards = t([[0.0, 1.0, 0.0], [0.0, 1.0, 7.0]])
    values = t([[0.5, 0.8, 0.0], [0.5, 0.8, 3.0]])
    mask = t([[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.95)
    for row in range(2):
        assert adv[row].tolist() == pytest.approx([0.391, 0.2, 0.0])
        assert ret[row].tolist() == pytest.approx([0.891, 1.0, 0.0])


def test_gae_with_lambda_one_and_gamma_one_is_return_minus_value():
    rewards, values, mask = t([[1.0, 2.0, 3.0]]), t([[0.5, 0.5, 0.5]]), torch.ones(1, 3, dtype=torch.float64)
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=1.0)
    assert ret.tolist()[0] == pytest.approx([6.0, 5.0, 3.0])
    assert adv.tolist()[0] == pytest.approx([5.5, 4.5, 2.5])


def test_value_loss_clipped_and_unclipped():
    # V = 1, V_old = 0, R = 2, ε = 0.2: (V − R)² = 1, V_clip = 0.2, (0.2 − 2)² = 3.24; ½·max = 1.62
    v, old, ret, mask = t([[1.0]]), t([[0.0]]), t([[2.0]]), t([[1.0]])
    assert value_loss(v, old, ret, mask, clip_eps=0.2).item() == pytest.approx(1.62)
    assert value_loss(v, old, ret, mask).item() == pytest.approx(0.5)


def test_entropy_from_logits():
    # uniform over 4 → log 4; probabilities [¼, ¾] → ¼·log 4 + ¾·log(4/3) = 0.562335
    logits = t([[[0.0, 0.0, 0.0, 0.0], [0.0, math.log(3.0), -math.inf, -math.inf]]])
    h = entropy_from_logits(logits[:, :1])
    assert h.item() == pytest.approx(math.log(4.0))
    h2 = entropy_from_logits(t([[[0.0, math.log(3.0)]]]))
    assert h2.item() == pytest.approx(0.562335, abs=1e-6)


def test_logprobs_from_logits():
    logits = t([[[0.0, math.log(3.0)]]])  # probabilities [¼, ¾]
    assert logprobs_from_logits(logits, torch.tensor([[1]])).item() == pytest.approx(math.log(0.75))


# --- group advantages --------------------------------------------------------------------------


def test_what_is_two_plus_three_group_advantages():
    # Five answers to "What is 2+3?", rewarded [1, 0, 1, 1, 0] (right/wrong). mean = 0.6;
    # unbiased std = √((3·0.4² + 2·0.6²) / 4) = √0.3 = 0.547723;
    # right answers: 0.4 / 0.547723 = +0.730297, wrong ones: −0.6 / 0.547723 = −1.095445
    adv, zero_std = group_advantages(t([1.0, 0.0, 1.0, 1.0, 0.0]), group_size=5, eps=0.0)
    expected = [0.730297, -1.095445, 0.730297, 0.730297, -1.095445]
    assert adv.tolist() == pytest.approx(expected, abs=1e-6)
    assert zero_std == 0.0
    assert adv.sum().item() == pytest.approx(0.0, abs=1e-9)  # advantages within a group sum to zero


def test_group_advantages_default_eps_and_zero_variance_groups():
    # second group all right: std 0, no signal, advantages 0, and it is reported as 1 of 2 groups
    adv, zero_std = group_advantages(t([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]), group_size=5)
    assert adv[:5].tolist() == pytest.approx([0.4 / (0.3**0.5 + 1e-4), -0.6 / (0.3**0.5 + 1e-4)] * 1
                                             + [0.4 / (0.3**0.5 + 1e-4)] * 2 + [-0.6 / (0.3**0.5 + 1e-4)])
    assert adv[5:].abs().max().item() == 0.0
    assert zero_std == 0.5


def test_group_advantages_no_scaling_and_batch_scaling():
    rewards = t([1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0])
    adv, _ = group_advantages(rewards, group_size=5, scale="none")
    assert adv.tolist() == pytest.approx([0.4, -0.6, 0.4, 0.4, -0.6, 0.0, 0.0, 0.0, 0.0, 0.0])
    # batch std: mean 0.8 over all ten, unbiased std √((8·0.04 + 2·0.64) / 9) = √(1.6 / 9) = 0.421637
    adv, _ = group_advantages(rewards, group_size=5, scale="batch", eps=0.0)
    assert adv[0].item() == pytest.approx(0.4 / math.sqrt(1.6 / 9))
    with pytest.raises(ValueError, match="scale"):
        group_advantages(rewards, group_size=5, scale="median")  # type: ignore[arg-type]


def test_process_advantages_sum_normalised_rewards_of_later_steps():
    # one group of two completions: steps [1, 0] and [0]. All steps: mean ⅓, unbiased std √⅓ = 0.57735;
    # normalised: 1 → +1.154701, 0 → −0.577350. Step advantages are the sums from each step onwards:
    # completion a: [1.154701 − 0.577350, −0.577350] = [0.577350, −0.577350]; completion b: [−0.577350]
    out = process_advantages([[1.0, 0.0], [0.0]], group_size=2, eps=0.0)
    assert out[0] == pytest.approx([0.577350, -0.577350], abs=1e-6)
    assert out[1] == pytest.approx([-0.577350], abs=1e-6)
    with pytest.raises(ValueError, match="group_size"):
        process_advantages([[1.0]], group_size=2)


def _sum_form_as_it_was(step_rewards, group_size, eps=1e-4):
    """The sum form as `process_advantages` computed it before the other credit forms joined it, kept verbatim."""
    out = []
    for start in range(0, len(step_rewards), group_size):
        group = step_rewards[start:start + group_size]
        flat = torch.tensor([r for steps in group for r in steps], dtype=torch.float64)
        mean = flat.mean() if flat.numel() else torch.tensor(0.0, dtype=torch.float64)
        std = flat.std() if flat.numel() > 1 else torch.tensor(0.0, dtype=torch.float64)
        for steps in group:
            normed = (torch.tensor(steps, dtype=torch.float64) - mean) / (std + eps)
            out.append(normed.flip(0).cumsum(0).flip(0).tolist())
    return out


def test_sum_form_is_unchanged_to_1e_9():
    gen = torch.Generator().manual_seed(0)
    lengths = torch.randint(1, 9, (24,), generator=gen).tolist()
    rewards = [torch.rand(n, generator=gen, dtype=torch.float64).tolist() for n in lengths]
    rewards[3] = [0.5] * len(rewards[3])
    for got, want in zip(process_advantages(rewards, 8), _sum_form_as_it_was(rewards, 8), strict=True):
        assert got == pytest.approx(want, abs=1e-9, rel=0)


# One group of two: a = [1, 0, 1] (its middle step wrong), b = [1, 1]. Five steps, mean 0.8, unbiased std √0.2:
# a reward of 1 normalises to 0.2/√0.2 = 0.447214, a 0 to −0.8/√0.2 = −1.788854.
CREDIT_GROUP = [[1.0, 0.0, 1.0], [1.0, 1.0]]


def test_sum_form_by_hand():
    a, b = process_advantages(CREDIT_GROUP, group_size=2, eps=0.0)
    # a: [0.447 − 1.789 + 0.447, −1.789 + 0.447, 0.447]; b: [0.447 + 0.447, 0.447]
    assert a == pytest.approx([-0.894427, -1.341641, 0.447214], abs=1e-6)
    assert b == pytest.approx([0.894427, 0.447214], abs=1e-6)


def test_mean_form_divides_the_sum_by_the_steps_left():
    a, b = mean_process_advantages(CREDIT_GROUP, group_size=2, eps=0.0)
    # a: [−0.894427 / 3, −1.341641 / 2, 0.447214 / 1]; b: [0.894427 / 2, 0.447214 / 1]
    assert a == pytest.approx([-0.298142, -0.670820, 0.447214], abs=1e-6)
    assert b == pytest.approx([0.447214, 0.447214], abs=1e-6)


def test_min_form_credits_each_step_with_the_worst_step_after_it():
    # returns G_j = min over k ≥ j: a [0, 0, 1], b [1, 1]; five returns, mean 0.6, unbiased std √0.3 = 0.547723:
    # 0 → −1.095445, 1 → +0.730297. a's first step is right, yet the wrong step after it sets its return.
    a, b = min_process_advantages(CREDIT_GROUP, group_size=2, eps=0.0)
    assert a == pytest.approx([-1.095445, -1.095445, 0.730297], abs=1e-6)
    assert b == pytest.approx([0.730297, 0.730297], abs=1e-6)
    # PURE's PRM+VR: an outcome of 1 on b's last step (1 + 1 = 2) lifts that step only, the first keeps min = 1.
    # Returns a [0, 0], b [1, 2]: mean 0.75, std √(2.75 / 3) = 0.957427 → b [0.261116, 1.305582]
    assert min_process_advantages([[1.0, 0.0], [1.0, 2.0]], 2, eps=0.0)[1] == pytest.approx(
        [0.261116, 1.305582], abs=1e-6)


def test_first_error_form_credits_the_verified_prefix_and_penalises_from_the_first_error_on():
    # verified prefix v: a [1, 0, 0] (its third step is right but follows the error), b [1, 1];
    # five values, mean 0.6, std √0.3: 1 → +0.730297, 0 → −1.095445
    a, b = first_error_advantages(CREDIT_GROUP, group_size=2, threshold=0.5, eps=0.0)
    assert a == pytest.approx([0.730297, -1.095445, -1.095445], abs=1e-6)
    assert b == pytest.approx([0.730297, 0.730297], abs=1e-6)
    # a PRM's probabilities: 0.4 is below the threshold, so the second step is the first error
    assert first_error_advantages([[0.9, 0.4], [0.9, 0.9]], 2, eps=0.0)[0][1] < 0
    # every step verified everywhere: nothing to tell apart, no credit
    assert first_error_advantages([[1.0], [1.0, 1.0]], 2) == [[0.0], [0.0, 0.0]]


def test_progress_form_is_the_change_in_success_probability_at_unit_rms():
    # V_0 = 0.5 for both; a: V = [0.5, 0.25, 0] → gains [0, −0.25, −0.25]; b: V = [0.5, 1] → gains [0, +0.5].
    # Not centred; rms over the five gains = √((0.0625·2 + 0.25) / 5) = √0.075 = 0.273861
    a, b = progress_advantages([[0.5, 0.25, 0.0], [0.5, 1.0]], [0.5, 0.5], group_size=2, eps=0.0)
    assert a == pytest.approx([0.0, -0.912871, -0.912871], abs=1e-6)
    assert b == pytest.approx([0.0, 1.825742], abs=1e-6)
    with pytest.raises(ValueError, match="v0"):
        progress_advantages([[1.0]], [0.5, 0.5], group_size=1)


def test_mix_adds_alpha_times_the_process_advantage_each_at_unit_rms():
    # outcome [1, −1] has rms 1; process a [2, 0], b [−2] has rms √(8/3) = 1.632993 → [1.224745, 0, −1.224745].
    # α = 0.5: a [1 + 0.612372, 1 + 0], b [−1 − 0.612372]
    a, b = mixed_advantages([1.0, -1.0], [[2.0, 0.0], [-2.0]], group_size=2, alpha=0.5, eps=0.0)
    assert a == pytest.approx([1.612372, 1.0], abs=1e-6)
    assert b == pytest.approx([-1.612372], abs=1e-6)
    # α = 0 is the outcome advantage on every step
    assert mixed_advantages([2.0, -2.0], [[5.0, 1.0], [3.0]], 2, alpha=0.0, eps=0.0) == [[1.0, 1.0], [-1.0]]


def test_advantage_clip_bounds_every_token():
    assert clip_advantages(t([[3.0, -0.5, -2.0]]), 1.0).tolist() == [[1.0, -0.5, -1.0]]
    with pytest.raises(ValueError, match="clip"):
        clip_advantages(t([1.0]), 0.0)


# --- GRPO / GSPO -------------------------------------------------------------------------------

# two responses, T = 3: the first has 2 tokens, the second 1; all ratios 1, A = [+1, −1]
MASK = t([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
ZEROS = torch.zeros(2, 3, dtype=torch.float64)


def test_grpo_aggregations_by_hand():
    # per-token loss −A: row 1 [−1, −1], row 2 [+1]
    adv = t([1.0, -1.0])
    seq = grpo_loss(ZEROS, ZEROS, ZEROS, adv, MASK, clip_eps=0.2, beta=0.0, aggregation="sequence")
    assert seq.item() == pytest.approx(0.0)  # mean(mean(−1, −1), mean(1)) = 0
    tok = grpo_loss(ZEROS, ZEROS, ZEROS, adv, MASK, clip_eps=0.2, beta=0.0, aggregation="token")
    assert tok.item() == pytest.approx(-1.0 / 3.0)  # (−1 − 1 + 1) / 3
    dr = grpo_loss(ZEROS, ZEROS, None, adv, MASK, clip_eps=0.2, beta=0.0, aggregation="dr_grpo")
    assert dr.item() == pytest.approx(-1.0 / 6.0)  # (−1) / (B·T = 6)
    dr8 = grpo_loss(ZEROS, ZEROS, None, adv, MASK, clip_eps=0.2, beta=0.0, aggregation="dr_grpo", max_tokens=4)
    assert dr8.item() == pytest.approx(-1.0 / 8.0)  # (−1) / (2·4)


def test_grpo_kl_term_adds_beta_k3():
    # π = 0.5, π_ref = 0.25 on every token: k3 = 0.193147, β = 0.1 adds 0.0193147 to every token's loss
    logp = torch.full((2, 3), math.log(0.5), dtype=torch.float64)
    ref_logp = torch.full((2, 3), math.log(0.25), dtype=torch.float64)
    loss = grpo_loss(logp, logp, ref_logp, t([1.0, -1.0]), MASK, clip_eps=0.2, beta=0.1)
    assert loss.item() == pytest.approx(0.1 * (0.5 + LOG2 - 1))
    with pytest.raises(ValueError, match="ref_logp"):
        grpo_loss(logp, logp, None, t([1.0, -1.0]), MASK, clip_eps=0.2, beta=0.1)


def test_grpo_clips_per_token_and_takes_process_advantages():
    # token ratios [1.5, 1.0] with A = +1 on both: min(1.5, 1.2) = 1.2 and 1.0 → loss −(1.2 + 1.0)/2 = −1.1
    logp = torch.log(t([[1.5, 1.0]]))
    loss = grpo_loss(logp, torch.zeros(1, 2, dtype=torch.float64), None, t([1.0]), t([[1.0, 1.0]]), 0.2, 0.0)
    assert loss.item() == pytest.approx(-1.1)
    # (B, T) advantages from process supervision: A = [2, −1] at ratio 1 → −(2 − 1)/2 = −0.5
    loss = grpo_loss(torch.zeros(1, 2, dtype=torch.float64), torch.zeros(1, 2, dtype=torch.float64), None,
                     t([[2.0, -1.0]]), t([[1.0, 1.0]]), 0.2, 0.0)
    assert loss.item() == pytest.approx(-0.5)


def test_grpo_gradient_raises_logp_of_good_answers():
    logp = torch.zeros(2, 3, dtype=torch.float64, requires_grad=True)
    grpo_loss(logp, logp.detach(), None, t([1.0, -1.0]), MASK, 0.2, 0.0).backward()
    # sequence aggregation: d loss / d logp = −A / (2 responses · own length)
    assert logp.grad.flatten().tolist() == pytest.approx([-0.25, -0.25, 0.0, 0.5, 0.0, 0.0])


def test_gspo_uses_the_length_normalised_sequence_ratio():
    # row 1: token log-ratios [log 2, 0] → s = exp(log 2 / 2) = √2 = 1.414214, padding ignored;
    # A = +1 → min(√2, 1.2) = 1.2.  Row 2: one token, s = 1, A = −1 → −1.  loss = −mean(1.2, −1) = −0.1
    logp = t([[LOG2, 0.0, 5.0], [0.0, 0.0, 0.0]])
    loss = gspo_loss(logp, ZEROS, None, t([1.0, -1.0]), MASK, clip_eps=0.2, beta=0.0)
    assert loss.item() == pytest.approx(-0.1)
    # A = −1 on the first row: min(−√2, −1.2) = −√2, the full penalty stays
    loss = gspo_loss(logp, ZEROS, None, t([-1.0, -1.0]), MASK, clip_eps=0.2, beta=0.0)
    assert loss.item() == pytest.approx(-(-math.sqrt(2) - 1.0) / 2)
    frac = gspo_clip_fraction(logp, ZEROS, t([1.0, -1.0]), MASK, clip_eps=0.2)
    assert frac.item() == pytest.approx(0.5)


def test_gspo_differs_from_grpo_on_mixed_token_ratios():
    # token ratios [2, ½], A = +1, ε = 0.2. GRPO: mean(min(2, 1.2), min(½, 0.8)) = 0.85 → −0.85.
    # GSPO: s = exp((log 2 − log 2) / 2) = 1, inside the interval → −1.0
    logp, old, mask = t([[LOG2, -LOG2]]), torch.zeros(1, 2, dtype=torch.float64), t([[1.0, 1.0]])
    assert grpo_loss(logp, old, None, t([1.0]), mask, 0.2, 0.0).item() == pytest.approx(-0.85)
    assert gspo_loss(logp, old, None, t([1.0]), mask, 0.2, 0.0).item() == pytest.approx(-1.0)


def test_gspo_kl_term_and_shape_check():
    logp = torch.full((2, 3), math.log(0.5), dtype=torch.float64)
    ref_logp = torch.full((2, 3), math.log(0.25), dtype=torch.float64)
    loss = gspo_loss(logp, logp, ref_logp, t([1.0, -1.0]), MASK, clip_eps=0.2, beta=0.1)
    assert loss.item() == pytest.approx(0.1 * (0.5 + LOG2 - 1))  # −mean(1, −1) = 0, plus β·k3
    with pytest.raises(ValueError, match="per sequence"):
        gspo_loss(logp, logp, None, t([[1.0, 1.0, 1.0]] * 2), MASK, 0.2, 0.0)


# ----------------------------------------------------------------------------------------------
# SFT, DPO, IPO


def test_sft_loss_is_the_token_mean_nll_of_the_targets_only():
    # row 1 targets log p = −1, −3 (−5 is prompt, masked); row 2 target −2: NLL (1 + 3 + 2) / 3 tokens = 2
    logp, mask = t([[-5.0, -1.0, -3.0], [-4.0, -2.0, 0.0]]), t([[0, 1, 1], [0, 1, 0]])
    assert sft_loss(logp, mask).item() == pytest.approx(2.0)
    # over a global batch of 12 target tokens (this process holds 3 of them): 6 / 12
    assert sft_loss(logp, mask, num_tokens=12).item() == pytest.approx(0.5)


def test_dpo_logits_are_the_difference_of_log_ratios():
    # (−1 − (−2)) − (−3 − (−2.5)) = 1 + 0.5 = 1.5
    assert dpo_logits(t([-1.0]), t([-3.0]), t([-2.0]), t([-2.5])).item() == pytest.approx(1.5)


def test_dpo_loss_by_hand_hard_soft_and_with_a_margin():
    h = t([1.5, -0.5])
    # β = 2: z = 3, −1 → −log σ(3) = 0.048587, −log σ(−1) = 1.313262; mean 0.680925
    assert dpo_loss(h, beta=2.0).item() == pytest.approx((0.048587 + 1.313262) / 2, abs=1e-6)
    # p = 0.8 on the first pair: 0.8·0.048587 + 0.2·3.048587 = 0.648587; p = 1 on the second: 1.313262
    assert dpo_loss(h, 2.0, p=t([0.8, 1.0])).item() == pytest.approx((0.648587 + 1.313262) / 2, abs=1e-6)
    # margin 1 on the first: z = 2 → −log σ(2) = 0.126928; weights 3 : 1
    loss = dpo_loss(h, 2.0, margin=t([1.0, 0.0]), weight=t([3.0, 1.0]))
    assert loss.item() == pytest.approx((3 * 0.126928 + 1.313262) / 4, abs=1e-6)


def test_a_coin_flip_label_has_no_gradient_at_the_reference():
    # p = 0.5 at h = 0: d/dh of −½[log σ(βh) + log σ(−βh)] = −½β(1 − σ) + ½βσ = 0
    h = t([0.0]).requires_grad_()
    dpo_loss(h, 0.1, p=t([0.5])).backward()
    assert h.grad.item() == pytest.approx(0.0, abs=1e-12)


def test_ipo_loss_regresses_h_to_one_over_two_beta():
    # β = 0.25: target 1/(2β) = 2; h = 3 → (3 − 2)² = 1; h = 2 → 0
    assert ipo_loss(t([3.0, 2.0]), beta=0.25).item() == pytest.approx(0.5)
    # p = 0.75: target (2·0.75 − 1)/(2·0.25) = 1; h = 3 → 4
    assert ipo_loss(t([3.0]), 0.25, p=t([0.75])).item() == pytest.approx(4.0)
