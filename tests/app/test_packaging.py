"""Installing preflab is quiet and ships every file the app serves: `make setup` builds the package, and setuptools
prints a screenful of "Package would be ignored" for each folder of files that pyproject.toml does not declare."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(300)
def test_a_build_warns_about_nothing_and_ships_static_vendor_migrations_and_templates(tmp_path: Path) -> None:
    source = tmp_path / "src"
    junk = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
    for name in ("app", "training", "migrations", "templates"):
        shutil.copytree(REPO / name, source / name, ignore=junk)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
                            "--wheel-dir", str(tmp_path / "dist"), str(source)],
                           capture_output=True, text=True, timeout=280)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    said = build.stdout + build.stderr
    assert "would be ignored" not in said and "SetuptoolsDeprecationWarning" not in said, said[-4000:]
    (wheel,) = (tmp_path / "dist").glob("preflab-*.whl")
    shipped = set(zipfile.ZipFile(wheel).namelist())
    assert {"app/static/preflab.css", "app/static/vendor/README.md", "migrations/alembic.ini",
            "migrations/versions/0001_initial_schema.py", "app/demo/gsm8k_demo.jsonl", "preflab/client.py",
            "templates/base.html", "templates/training_run.html"} <= shipped
    # Every page's template ships: an install from the wheel (not editable) renders them from site-packages.
    assert {f"templates/{p.name}" for p in (REPO / "templates").glob("*.html")} <= shipped
    # Whatever `make vendor` put beside the README ships too (the package serves it at /static/vendor).
    vendored = {f"app/static/vendor/{p.name}" for p in (REPO / "app" / "static" / "vendor").iterdir() if p.is_file()}
    assert vendored <= shipped, sorted(vendored - shipped)
