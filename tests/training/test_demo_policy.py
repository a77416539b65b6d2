"""The demo's tiny policy: any text round-trips through its tokenizer, it loads offline and samples."""

from __future__ import annotations

from transformers import AutoModelForCausalLM, AutoTokenizer

from training.demo_policy import write_demo_policy


def test_demo_policy_loads_offline_and_samples(tmp_path) -> None:
    path = write_demo_policy(tmp_path / "policy")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path)
    text = "Natalia sold clips to 48 of her friends in April. Wie viele? ✓ 3×4\n"
    ids = tokenizer(text, return_tensors="pt")
    assert tokenizer.decode(ids["input_ids"][0]) == text
    out = model.generate(**ids, max_new_tokens=8, do_sample=True, pad_token_id=tokenizer.pad_token_id)
    assert out.shape[1] > ids["input_ids"].shape[1]


def test_a_complete_copy_is_kept_and_a_partial_one_rebuilt(tmp_path) -> None:
    path = write_demo_policy(tmp_path / "policy")
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    assert write_demo_policy(path) == path and (path / "model.safetensors").stat().st_mtime_ns == stamp
    (path / "model.safetensors").unlink()
    write_demo_policy(path)
    assert (path / "model.safetensors").exists() and not (tmp_path / "policy.partial").exists()
