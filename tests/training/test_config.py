"""Configs: the fields GRPO and PPO share live once (RLConfig), keep their docs, checks and `--set` names."""

from __future__ import annotations

import dataclasses

import pytest

from training.config import RLConfig, field_docs, load_config
from training.grpo import GRPOConfig
from training.ppo import PPOConfig


def test_grpo_and_ppo_share_the_rl_fields_with_their_own_defaults():
    shared = {f.name for f in dataclasses.fields(RLConfig)}
    for cls in (GRPOConfig, PPOConfig):
        assert shared <= {f.name for f in dataclasses.fields(cls)}
    # a subclass may redeclare a shared field for another default, in the shared field's place
    assert (GRPOConfig().lr, PPOConfig().lr) == (1e-6, 1e-5)
    assert (GRPOConfig().max_new_tokens, PPOConfig().max_new_tokens) == (256, 128)
    assert [f.name for f in dataclasses.fields(PPOConfig)][:3] == ["model", "out", "steps"]  # TrainConfig's first


def test_every_field_has_its_doc_inherited_or_its_own():
    from training.config import DPOConfig, RewardConfig, RFTConfig, SFTConfig

    for cls in (GRPOConfig, PPOConfig, SFTConfig, RewardConfig, DPOConfig, RFTConfig):
        docs = field_docs(cls)
        assert list(docs) == [f.name for f in dataclasses.fields(cls)]
        assert all(docs.values())
    assert field_docs(PPOConfig)["lr"] == "AdamW learning rate (policy and value model)."
    assert field_docs(GRPOConfig)["lr"] == "AdamW learning rate."
    assert "Pass@K" in field_docs(PPOConfig)["eval_k"]


@pytest.mark.parametrize("cls", [GRPOConfig, PPOConfig])
@pytest.mark.parametrize(("key", "value"), [("lr", "0"), ("top_p", "1.5"), ("steps", "0"), ("warmup_steps", "-1"),
                                            ("mixed_precision", "fp8"), ("eval_temperature", "0")])
def test_shared_checks_name_the_field_in_both_trainers(cls, key, value):
    with pytest.raises(ValueError, match=f"^{key}"):
        load_config(cls, None, [f"{key}={value}"])


def test_set_reaches_shared_and_own_fields():
    config = load_config(GRPOConfig, None, ["lr=3e-4", "group_size=4", "lora=true", "stop=[\"\\n\"]"])
    assert (config.lr, config.group_size, config.stop) == (3e-4, 4, ["\n"])
    assert config.lora_settings is not None and config.lora_settings.r == 16
    ppo = load_config(PPOConfig, None, ["reward_weights=[0.5]", "reward_fn=gsm8k_exact_match", "vf_coef=0.2"])
    assert (ppo.reward_weights, ppo.vf_coef) == ([0.5], 0.2)
    with pytest.raises(ValueError, match="reward_weights"):
        PPOConfig(reward_weights=[1.0, 2.0])


def test_set_values_are_coerced_strictly_and_errors_name_the_field():
    config = load_config(GRPOConfig, None, ["reward_fn=gsm8k_exact_match,format_regex", "eval_temperature=none",
                                            "server_base_url=http://x", "server_model=7", "lora_target_modules=q_proj"])
    assert config.reward_fn == ["gsm8k_exact_match", "format_regex"] and config.eval_temperature is None
    assert config.server_model == "7" and config.lora_target_modules == "q_proj"  # text stays text
    for item, field in [("group_size=3.5", "group_size"), ("lora=maybe", "lora"), ("reward_weights=[1, \"x\"]",
                        "reward_weights\\[1\\]"), ("aggregation=mean", "aggregation")]:
        with pytest.raises(ValueError, match=f"^{field}"):
            load_config(GRPOConfig, None, [item, "reward_fn=a"])
