"""Fixtures the training tests share: the careless-addition SFT model every learning test starts from and one
intra-op thread for the modules that ask for it
(`pytestmark = pytest.mark.usefixtures("one_thread")`)."""

from __future__ import annotations

import pytest
import torch

from tests.training.tiny import addition_split, careless_sft_set, char_tokenizer, save_tiny, sft, tiny_gpt2
from training.policy import prepare_tokenizer


@pytest.fixture(scope="session")
def addition_sft(tmp_path_factory):
    """A tiny GPT-2 that learned single-digit addition with a systematic +1 slip (3 of 5 SFT targets)."""
    tok = prepare_tokenizer(char_tokenizer())
    rl, heldout = addition_split(60, 40, seed=0)
    model = tiny_gpt2(tok, seed=0)
    sft(model, tok, careless_sft_set(rl + heldout), steps=300, seed=0)
    path = save_tiny(model, tok, tmp_path_factory.mktemp("sft"))
    return path, rl, heldout


@pytest.fixture
def one_thread():
    """Models this small spend their time in thread hand-offs, not arithmetic, when 2 cores are shared."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
