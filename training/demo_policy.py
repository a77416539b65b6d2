"""A tiny causal LM built in code, the demo's stand-in for SmolLM2-135M-Instruct where speed matters (tests run the
demo's GRPO, PPO, RFT and *Sample into project* on it: `setup_demo(settings, "tiny")`).

It is a 2-layer GPT-2 over a byte-level tokenizer (any text encodes, nothing is unknown), randomly initialised:
its answers are noise until it is trained, which is enough to exercise the training loop, not to show a model.
Built in a second or two on a CPU; a few megabytes on disk.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD, EOS = "<pad>", "<eos>"
# GSM8K questions run to ~900 bytes; the rest is room for an answer.
CONTEXT = 2048


def byte_tokenizer() -> PreTrainedTokenizerFast:
    """One token per byte (GPT-2's printable byte alphabet), plus pad and end-of-sequence."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: i for i, token in enumerate([PAD, EOS, *alphabet])}
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=backend, pad_token=PAD, eos_token=EOS,
                                   clean_up_tokenization_spaces=False, model_max_length=CONTEXT)


def write_demo_policy(path: Path, seed: int = 0) -> Path:
    """Write the model and tokenizer to `path` (safetensors) unless a complete copy is already there."""
    path = Path(path)
    if (path / "config.json").exists() and (path / "model.safetensors").exists():
        return path
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    tokenizer = byte_tokenizer()
    torch.manual_seed(seed)
    # Dropout off: RL needs the same log-probabilities when sampling and when training.
    config = GPT2Config(vocab_size=len(tokenizer), n_positions=CONTEXT, n_embd=64, n_layer=2, n_head=4,
                        resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=tokenizer.eos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    staging = path.with_name(path.name + ".partial")
    for leftover in (staging, path):
        shutil.rmtree(leftover, ignore_errors=True)
    GPT2LMHeadModel(config).save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    # Whole or not at all: a demo interrupted mid-write builds it again next time.
    staging.replace(path)
    return path
