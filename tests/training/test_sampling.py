"""The shared decoding core (training.sampling): the context-length guard, and that the app's hf backend and
RL rollouts decode alike and import in the right direction."""

from __future__ import annotations

import subprocess
import sys
import warnings

import pytest
import torch

from tests.training.tiny import char_tokenizer, save_tiny, tiny_gpt2
from training.generation import GenerationParams, HFGenerator
from training.policy import generate_rollouts, prepare_tokenizer, token_logprobs
from training.sampling import context_length, fit_generation_length


def test_fit_generation_length_clamps_with_a_warning_or_refuses():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing to say when it fits, or when the limit is unknown
        assert fit_generation_length(32, 8, 24) == 24
        assert fit_generation_length(None, 10_000, 256) == 256
    with pytest.warns(UserWarning, match=r"max_new_tokens=256 .*up to 20 tokens .*256 positions.* at most 236"):
        assert fit_generation_length(256, 20, 256) == 236
    with pytest.warns(UserWarning, match="max_new_tokens_cot=9"):
        assert fit_generation_length(10, 3, 9, what="max_new_tokens_cot") == 7
    with pytest.raises(ValueError, match=r"prompts of up to 12 tokens leave no room .* model's 12 positions"):
        fit_generation_length(12, 12, 4)


def test_rollouts_past_the_models_positions_are_clamped_or_refused():
    # a GPT-2 with 12 positions: prompt "13+4=" (5 tokens) + 12 new tokens would index position 16 of 12
    tok = prepare_tokenizer(char_tokenizer())
    model = tiny_gpt2(tok, seed=0, n_positions=12).eval()
    assert context_length(model, tok) == 12
    with pytest.warns(UserWarning, match=r"max_new_tokens=12 .*up to 5 tokens .*12 positions.* at most 7"):
        r = generate_rollouts(model, tok, ["1+2=", "13+4="], n=2, max_new_tokens=12, seed=0)
    assert r.input_ids.shape[1] <= 12 and r.response_ids.shape[1] <= 7
    logp, _ = token_logprobs(model, r.input_ids, r.attention_mask, r.response_mask)  # scoring fits too
    assert torch.allclose(logp, r.old_logp, atol=1e-5)
    with pytest.raises(ValueError, match="prompts of up to 12 tokens leave no room"):
        generate_rollouts(model, tok, ["1" * 12], n=1, max_new_tokens=4, seed=0)


def test_hf_backend_and_rollouts_decode_alike(tmp_path):
    # one decoder: greedy, the app's backend and a rollout continue a prompt with the same tokens
    tok = char_tokenizer()
    model = tiny_gpt2(tok, seed=3, n_positions=64)
    generator = HFGenerator(save_tiny(model, tok, tmp_path / "m"), device="cpu")
    samples = generator.generate(["1+2=", "13+4="], 1, GenerationParams(max_new_tokens=8, temperature=0))
    rollouts = generate_rollouts(generator._model, generator._tokenizer, ["1+2=", "13+4="], n=1, max_new_tokens=8,
                                 greedy=True)
    assert [group[0].text for group in samples] == rollouts.texts
    assert [group[0].completion_tokens for group in samples] == rollouts.lengths.tolist()
    generator.close()


def test_generation_imports_neither_policy_nor_torch():
    # the web process imports training.generation to validate generator specs; torch costs seconds there
    code = ("import sys, training.generation\n"
            "assert 'training.policy' not in sys.modules, 'training.policy was imported'\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
