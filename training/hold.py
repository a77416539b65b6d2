"""Hold points: a test stops a process at a named point of its work and lets it go itself.

Crash tests must kill a trainer or a job *mid-work*, whatever the machine's speed. They set
`PREFLAB_TEST_HOLD="POINT=PATH"` in the environment of the process under test; when that process reaches POINT
(e.g. `train.step.8`, `job.progress.8`), it creates `PATH.held` and waits until PATH exists. The test waits
for `PATH.held`, does what it must (kill, cancel, signal), and creates PATH to release it. Unset, a hold point
costs one dictionary lookup.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

ENV = "PREFLAB_TEST_HOLD"


def hold(point: str, *, give_up: Callable[[], bool] | None = None) -> None:
    """Wait at `point` while the environment asks for a hold there; `give_up()` true ends the wait early."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    name, _, path = spec.partition("=")
    if name != point or not path:
        return
    release = Path(path)
    Path(f"{path}.held").touch()
    while not release.exists() and not (give_up is not None and give_up()):
        time.sleep(0.01)
