"""`make api-check` and `make api-fuzz`: every Schemathesis check against the app's own OpenAPI schema, in-process.

A fresh SQLite database holds the security suite's seeded world (tests/security/world.py); three identities call
every operation: `outsider` (the lead of project B, a privileged caller on their own objects and a stranger on A's),
`annotator` (a member of project A without lead rights) and `admin` (who reaches what only admins may: model
endpoints, accounts, a generator's server URL). Generated path ids are mostly swapped for real ones of
either project, otherwise nearly every call would stop at a 404. The outbound rules refuse every host without
resolving it (`PREFLAB_OUTBOUND_HOSTS=none`), so the operations that take a URL run too and nothing leaves the box.

Every phase runs (examples, coverage, fuzzing, and the stateful phase over the schema's `links`) with every check.
A failure fails the run unless `tests/security/schema_exceptions.py` lists its operation and rule with a reason.

    python -m tests.security.api_contract                      # the CI run: fixed seed, a small budget
    python -m tests.security.api_contract --seed random --examples 100   # make api-fuzz
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

IDENTITIES = ("outsider", "annotator", "admin")

# Path parameter → attribute of ProjectObjects holding a real id of that kind.
_ID_FIELDS = {"project_id": "project_id", "prompt_id": "prompt_id", "job_id": "job_id", "export_id": "export_id",
              "run_id": "run_id", "revision_id": "revision_id", "assignment_id": "assignment_id"}


def real_ids(world: Any, path_parameters: dict[str, Any] | None) -> dict[str, Any] | None:
    """Swap generated integer ids for project A's or B's real ones, chosen by the generated value itself (so a
    failing example replays): n % 3 == 0 keeps the generated id, 1 takes A's, 2 takes B's. An id below 1 breaks the
    schema (every id is at least 1) and stays: a negative case must stay negative, or a request that only looks
    invalid to Schemathesis is counted as wrongly accepted."""
    if not path_parameters:
        return path_parameters
    out = dict(path_parameters)
    for name, value in path_parameters.items():
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            continue
        if name == "user_id":
            out[name] = (value, world.user_ids["victim"], world.user_ids["outsider"])[value % 3]
        elif name == "endpoint_id" and value % 2:
            out[name] = world.endpoint_id
        elif name in _ID_FIELDS and value % 3:
            objects = world.a if value % 3 == 1 else world.b
            out[name] = getattr(objects, _ID_FIELDS[name])
        elif name == "version" and value % 2:
            out[name] = 1
    return out


def make_app(data_dir: Path) -> Any:
    from app.main import create_app
    from app.platform.migrate import upgrade
    from app.platform.settings import Settings

    url = f"sqlite:///{data_dir}/preflab.db"
    upgrade(url)
    settings = Settings(env="dev", database_url=url, secret_key="api-contract-" + "x" * 40, data_dir=data_dir,
                        max_upload_mb=2, max_import_rows=5000, outbound_hosts="none", worker_heartbeat_max_age_s=0)
    return create_app(settings)


def seed_world(app: Any) -> Any:
    from tests.security.world import seed

    session = app.state.session_factory()
    try:
        return seed(session, app.state.settings.data_dir)
    finally:
        session.close()


def config(seed: int, examples: int, headers: dict[str, str]) -> Any:
    import schemathesis
    from schemathesis.config._checks import NEGATIVE_DATA_REJECTION_EXPECTED_STATUSES as _REJECTIONS

    return schemathesis.Config.from_dict({
        "seed": seed,
        "headers": headers,
        "suppress-health-check": ["all"],
        "generation": {"mode": "all", "max-examples": examples, "no-shrink": True, "database": "none"},
        "cache": {"enabled": False},
        # A body over the server's size limit (a draft's 16 KiB, an upload's PREFLAB_MAX_UPLOAD_MB) is refused
        # with 413 before it is parsed: a rejection too, declared on those operations.
        "checks": {"enabled": True, "negative_data_rejection": {"expected-statuses": [*_REJECTIONS, "413"]}},
        "phases": {"stateful": {"max-steps": 8}},
        "output": {"sanitization": {"enabled": False}},
    })


def _answer(recorder: Any, case_id: str) -> str:
    interaction = recorder.interactions.get(case_id)
    response = interaction.response if interaction is not None else None
    if response is None:
        return "(no response)"
    return f"answered {response.status_code}: {response.content[:400].decode(errors='replace')}"


PHASES = ("examples", "coverage", "fuzzing", "stateful")


def run(app: Any, world: Any, who: str, *, seed: int, examples: int,
        calls: dict[str, int]) -> Iterator[tuple[str, str, str]]:
    """(operation, check, message) for each failure found while calling every operation as `who`; `calls` counts
    the requests sent per phase."""
    import schemathesis
    from schemathesis import engine
    from schemathesis.engine import events

    schema = schemathesis.openapi.from_asgi("/openapi.json", app, config=config(seed, examples, world.headers(who)))

    @schema.hook("map_path_parameters")
    def _real(context: Any, path_parameters: dict[str, Any] | None) -> dict[str, Any] | None:
        return real_ids(world, path_parameters)

    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            calls[event.phase.value] = calls.get(event.phase.value, 0) + len(event.recorder.interactions)
            for case_id, checks in event.recorder.checks.items():
                for check in checks:
                    if check.failure_info is not None:
                        failure = check.failure_info.failure
                        yield failure.operation or event.label or "?", check.name, (
                            f"{failure.title}: {failure.message}\n{check.failure_info.code_sample}\n"
                            f"{_answer(event.recorder, case_id)}")
        elif isinstance(event, events.NonFatalError):
            yield event.label, "error", str(event.info)
        elif isinstance(event, events.FatalError):
            yield "engine", "fatal", repr(event.exception)
        elif isinstance(event, events.PhaseFinished) and event.phase.name.value in PHASES:
            if event.phase.skip_reason is not None:
                yield "engine", "phase", f"the {event.phase.name.value} phase did not run: {event.phase.skip_reason}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", default="1", help="an integer, or `random`")
    parser.add_argument("--examples", type=int, default=10, help="examples per operation and phase")
    parser.add_argument("--as", dest="identities", action="append", choices=IDENTITIES,
                        help="only this identity (repeatable; default: both)")
    args = parser.parse_args(argv)
    seed = random.randrange(2**31) if args.seed == "random" else int(args.seed)
    from tests.security.schema_exceptions import allowed

    found = 0
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="preflab-api-check-") as tmp:
        app = make_app(Path(tmp))
        for who in args.identities or IDENTITIES:
            world = seed_world(app)
            seen: set[tuple[str, str, str]] = set()
            calls: dict[str, int] = {}
            for operation, check, message in run(app, world, who, seed=seed, examples=args.examples, calls=calls):
                key = (operation, check, message.split("\n")[0])
                if key in seen or allowed(operation, check, message):
                    continue
                seen.add(key)
                found += 1
                print(f"--- {operation} as {who}: {check}\n{message}\n", flush=True)
            print(f"as {who}: " + ", ".join(f"{n} requests in the {phase} phase" for phase, n in calls.items()),
                  flush=True)
            from tests.conftest import _empty_tables

            _empty_tables(app.state.engine)
    print(f"api-check: seed {seed}, {args.examples} examples, {found} failure(s), "
          f"{time.monotonic() - started:.0f} s", flush=True)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
