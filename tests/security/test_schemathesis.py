"""Schemathesis against the app's own OpenAPI schema, in-process: no 5xx, and every documented response matches.

Two identities call every operation: `outsider` (the lead of project B) and `annotator` (a member of project A), so
each operation is tried by a privileged and an unprivileged caller, on their own and on the other project's objects.
Generated path ids are mostly swapped for real ones from the seeded world (see `_real_ids`), otherwise nearly every
call would stop at a 404 before reaching the code worth fuzzing. Positive and negative cases both run; the budget
(examples per operation, no coverage or stateful phase) keeps the whole file to a couple of minutes on 2 cores.
"""

from __future__ import annotations

import os
import traceback
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from tests.conftest import only_on
from tests.security.world import World

# Per operation, positive and negative cases together; PREFLAB_FUZZ_EXAMPLES=200 for a deeper run by hand.
MAX_EXAMPLES = int(os.environ.get("PREFLAB_FUZZ_EXAMPLES", "20"))

# Path parameter → attribute of ProjectObjects holding a real id of that kind.
_ID_FIELDS = {"project_id": "project_id", "prompt_id": "prompt_id", "job_id": "job_id", "export_id": "export_id",
              "run_id": "run_id", "revision_id": "revision_id"}


def _real_ids(world: World, path_parameters: dict[str, Any]) -> dict[str, Any]:
    """Swap generated integer ids for project A's or B's real ones, chosen by the generated value itself (so a
    failing example replays and shrinks like any other): n % 3 == 0 keeps the random id, 1 takes A's, 2 takes B's."""
    out = dict(path_parameters)
    for name, value in path_parameters.items():
        if name == "user_id" and isinstance(value, int):
            out[name] = (value, world.user_ids["victim"], world.user_ids["outsider"])[value % 3]
        elif name in _ID_FIELDS and isinstance(value, int) and value % 3:
            objects = world.a if value % 3 == 1 else world.b
            out[name] = getattr(objects, _ID_FIELDS[name])
        elif name == "version" and isinstance(value, int) and value % 2:
            out[name] = 1
    return out


CHECKS = [not_a_server_error, response_schema_conformance]
SETTINGS = settings(max_examples=MAX_EXAMPLES, deadline=None, database=None, derandomize=True,
                    suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate, Phase.shrink])


def _where(exc: BaseException) -> str:
    """The end of the traceback of an exception the app raised (schemathesis' own failures explain themselves)."""
    from schemathesis.core.failures import Failure

    if isinstance(exc, BaseExceptionGroup):
        return "\n".join(_where(e) for e in exc.exceptions)
    return "" if isinstance(exc, Failure) else "".join(traceback.format_exception(exc)[-6:])


def fuzz(app: Any, world: World, who: str) -> list[str]:
    """Run every operation's positive and negative cases as `who`; return one line per failing operation."""
    # Hypothesis drives each operation's strategy directly (`APIOperation.as_strategy`): schemathesis' pytest
    # plugin does not work with pytest 9 (it sets `Node._nodeid`), and one loop reports every failing operation.
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    headers = world.headers(who)
    failures: list[str] = []
    for result in schema.get_all_operations():
        operation = result.ok()
        cases = st.one_of(operation.as_strategy(GenerationMode.POSITIVE), operation.as_strategy(GenerationMode.NEGATIVE))

        @SETTINGS
        @given(case=cases)
        def check(case: Any) -> None:
            case.path_parameters = _real_ids(world, case.path_parameters or {})
            case.call_and_validate(headers=headers, checks=CHECKS)

        try:
            check()
        except (Exception, BaseExceptionGroup) as exc:  # schemathesis' FailureGroup is a BaseExceptionGroup
            failures.append(f"{operation.label} as {who}: {exc}\n{_where(exc)}")
    return failures


@pytest.mark.timeout(600)
@pytest.mark.parametrize("who", ["outsider", "annotator"])
def test_no_server_errors_and_responses_match_the_schema(app: Any, world: World, who: str) -> None:
    only_on(app.state.engine, "postgresql", "`make api-check` runs every check on SQLite")
    failures = fuzz(app, world, who)
    assert not failures, "\n\n".join(failures)


# The fixes for what the fuzzing found, pinned by plain tests.

def test_the_documented_422_body_is_the_one_sent(app: Any, world: World, client: Any) -> None:
    item = app.openapi()["components"]["schemas"]["ErrorItem"]
    assert item["required"] == ["message"] and set(item["properties"]) == {"field", "message", "line"}
    r = client.post(f"/api/projects/{world.a.project_id}/exports", json={"format": "csv"},
                    headers=world.headers("lead"))
    assert r.status_code == 422
    assert r.json() == {"detail": [{"field": "format", "message": r.json()["detail"][0]["message"]}]}


def test_numbers_beyond_the_database_and_nul_in_text_are_422_not_500(world: World, client: Any,
                                                                      database_url: str) -> None:
    huge = 2**64 + 1
    r = client.post(f"/api/training-runs/{huge}/iterate", json={}, headers=world.headers("lead"))
    assert r.status_code in (404, 422), r.text  # SQLite cannot bind it (422); Postgres compares it and finds none
    nul_in_text = client.post(f"/api/projects/{world.a.project_id}/rankings", headers=world.headers("annotator"),
                              json={"rubric_version": 1, "submission_id": "\x00"})
    nul_in_json = client.post(f"/api/projects/{world.a.project_id}/constitutions", headers=world.headers("lead"),
                              json={"base_version": 1, "principles": [{"name": "x", "comparison": "a\x00b"}]})
    for r in (nul_in_text, nul_in_json):
        assert r.status_code < 500, r.text
        if database_url.startswith("postgresql"):  # Postgres text and JSONB cannot hold NUL; SQLite stores it
            assert r.status_code == 422 and "NUL" in r.json()["detail"][0]["message"], r.text
