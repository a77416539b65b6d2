"""pip-audit of the installed environment, strict about what it really audited.

pip-audit asks PyPI's JSON API for each installed release's known vulnerabilities. When that API cannot be reached
(no network) or serves no per-release data (a mirror), pip-audit still prints "No known vulnerabilities found" while
every package is "not found on PyPI": that is no audit at all, and this script says so instead of passing quietly.

Exit status: 1 for a vulnerability not in ACCEPTED; 0 with a clear NOT AUDITED message when nothing could be checked
(2 instead with PREFLAB_AUDIT_REQUIRED=1, for a release job that must audit); 0 when everything audited is clean.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

# Vulnerability id → why it does not apply to preflab. Keep in step with SECURITY.md ("Dependency audit").
ACCEPTED: dict[str, str] = {}


def main() -> int:
    required = os.environ.get("PREFLAB_AUDIT_REQUIRED") == "1"
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "audit.json"
        cmd = [sys.executable, "-m", "pip_audit", "--progress-spinner", "off", "--local", "--skip-editable",
               "--format", "json", "--output", str(report)]
        for vuln_id in ACCEPTED:
            cmd += ["--ignore-vuln", vuln_id]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            return not_audited("pip-audit took over 10 minutes (the vulnerability service is not answering)", required)
        if not report.is_file():
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            return not_audited(f"pip-audit could not run: {last}", required)
        deps = json.loads(report.read_text())["dependencies"]
    return judge(deps, required)


def judge(deps: list[dict], required: bool) -> int:
    """The exit status for pip-audit's JSON `dependencies`, with one line per finding."""
    audited = [d for d in deps if not d.get("skip_reason")]
    skipped = [d for d in deps if d.get("skip_reason")]
    if not audited:
        return not_audited(f"all {len(deps)} packages were skipped (first reason: {skipped[0]['skip_reason']}); "
                           "PyPI's per-release JSON API is unreachable from here", required)
    found = [(d["name"], d["version"], v) for d in audited for v in d.get("vulns", [])]
    for name, version, vuln in found:
        fixed = ", ".join(vuln.get("fix_versions") or []) or "no fixed release"
        print(f"pip-audit: {name} {version}: {vuln['id']} (fixed in {fixed}) {vuln.get('description', '')[:200]}")
    if skipped:
        print(f"pip-audit: not on PyPI, not audited: {', '.join(d['name'] for d in skipped)}")
    print(f"pip-audit: {len(audited)} packages audited, {len(found)} known vulnerabilities"
          + (f" ({len(ACCEPTED)} accepted in SECURITY.md)" if ACCEPTED else ""))
    return 1 if found else 0


def not_audited(why: str, required: bool) -> int:
    print(f"pip-audit: NOT AUDITED: {why}. Run `make audit` where pypi.org is reachable before a release.")
    return 2 if required else 0


if __name__ == "__main__":
    sys.exit(main())
