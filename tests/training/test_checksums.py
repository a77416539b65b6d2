"""The node-side check of an export's files (`python -m training.checksums`), run before a cluster run trains."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path


def test_a_file_that_differs_or_is_missing_is_named_and_stops_the_command(tmp_path: Path) -> None:
    good = tmp_path / "pairs.jsonl"
    good.write_text('{"prompt": "a"}\n')
    sha = hashlib.sha256(good.read_bytes()).hexdigest()

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "training.checksums", *args], capture_output=True, text=True,
                              timeout=60)

    assert check(str(good), sha).returncode == 0
    missing = tmp_path / "README.md"
    done = check(str(good), "0" * 64, str(missing), sha)
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        f"error: the export is not the one the app wrote: {good}: sha256 {sha}, the export's card says {'0' * 64}",
        f"error: the export is not the one the app wrote: {missing}: cannot be read on this node "
        "(No such file or directory)"]
    assert check(str(good)).returncode == 2  # a file without its sha256 is a usage error
