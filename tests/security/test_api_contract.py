"""The API as a contract (app/web/openapi.py): what `/openapi.json` promises is what the server does.

`make api-check` (tests/security/api_contract.py) fuzzes the whole schema with every Schemathesis check; these
tests pin each promise with a request a client would send.
"""

from __future__ import annotations

import socket
from typing import Any

import pytest

from app.platform import outbound
from app.platform.errors import Invalid
from app.web.deps import MAX_ID
from tests.security.world import World

UNSAFE = {"post", "put", "patch", "delete"}


def _spec(client: Any) -> dict[str, Any]:
    return client.get("/openapi.json").json()


def _operations(spec: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [(method, path, op) for path, ops in spec["paths"].items() for method, op in ops.items()]


def test_every_error_an_operation_answers_is_documented_with_the_one_error_body(client: Any) -> None:
    spec = _spec(client)
    assert spec["components"]["schemas"]["Error"]["properties"]["detail"]["items"] == {
        "$ref": "#/components/schemas/ErrorItem"}
    assert "HTTPValidationError" not in spec["components"]["schemas"]
    for method, path, op in _operations(spec):
        if not path.startswith("/api/"):
            continue
        codes = set(op["responses"])
        assert "401" in codes and op["security"] == [{"bearer": []}], (method, path)
        if "{" in path:
            assert {"403", "404", "422"} <= codes, (method, path)
        if "requestBody" in op:
            assert {"400", "413", "422"} <= codes, (method, path)
        if method in UNSAFE and ("{" in path or "requestBody" in op):
            assert "409" in codes, (method, path)
        for code, answer in op["responses"].items():
            if code.startswith("4"):
                assert answer["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}


def test_an_error_is_sent_as_documented(client: Any, world: World) -> None:
    """401 and 403 come as `{"detail": [{"message"}]}` too, not as a bare string."""
    anonymous = client.get("/api/v1/projects")
    assert anonymous.status_code == 401 and anonymous.headers["www-authenticate"] == "Bearer"
    assert anonymous.json() == {"detail": [{"message": anonymous.json()["detail"][0]["message"]}]}
    forbidden = client.get("/api/v1/users", headers=world.headers("lead"))
    assert forbidden.status_code == 403 and forbidden.json()["detail"][0]["message"] == "this needs the admin role"


def test_ids_in_paths_and_queries_are_bounded_by_what_the_database_holds(client: Any, world: World) -> None:
    spec = _spec(client)
    for method, path, op in _operations(spec):
        for parameter in op.get("parameters", []):
            schema = next((s for s in parameter["schema"].get("anyOf", [parameter["schema"]])
                           if s.get("type") == "integer"), {})
            if parameter["in"] == "path" and schema:
                assert schema["minimum"] == 1 and schema["maximum"] == MAX_ID, (method, path, parameter)
            elif schema and (parameter["name"].endswith("_id") or parameter["name"].endswith("version")):
                assert schema["minimum"] == 1 and schema["maximum"] == MAX_ID, (method, path, parameter)
    for project_id in (0, MAX_ID + 1):
        r = client.get(f"/api/v1/projects/{project_id}", headers=world.headers("lead"))
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == "path.project_id", r.text


def test_the_schema_states_the_servers_rules(client: Any) -> None:
    schemas = _spec(client)["components"]["schemas"]
    gold = schemas["GoldIn"]["properties"]["tiers"]
    assert gold["minItems"] == 2 and gold["items"]["minItems"] == 1
    assert gold["items"]["items"] == {"type": "integer", "minimum": 1, "maximum": MAX_ID}
    email = schemas["UserIn"]["properties"]["email"]
    assert email["pattern"] and email["maxLength"] == 320 and "format" not in email  # see FORMATS_NOT_CLAIMED
    assert schemas["MemberIn"]["properties"]["role"]["enum"] == ["lead", "annotator", "engineer"]
    flags = schemas["RankingIn"]["properties"]["flags"]
    assert flags["additionalProperties"] is False and list(flags["patternProperties"]) == ["^[0-9]{1,10}$"]


@pytest.mark.parametrize("body, field", [
    ({"enabled": 0}, "enabled"),          # no 0 for false
    ({"enabled": "true"}, "enabled"),     # no string for a boolean
    ({"enabled": True, "extra": 1}, "extra"),  # no unknown field
])
def test_json_bodies_are_strict(client: Any, world: World, body: dict[str, Any], field: str) -> None:
    r = client.put(f"/api/v1/projects/{world.a.project_id}/ai-labels", json=body, headers=world.headers("lead"))
    assert r.status_code == 422 and r.json()["detail"][0]["field"] == field, r.text


def test_integers_are_json_numbers_not_strings(client: Any, world: World) -> None:
    url = f"/api/v1/projects/{world.a.project_id}/rubrics"
    refused = client.post(url, json={"text": "Rank.", "base_version": "1"}, headers=world.headers("lead"))
    assert refused.status_code == 422 and refused.json()["detail"][0]["field"] == "base_version"
    # JSON (and JSON Schema) has one number type: 1.0 is the integer 1.
    saved = client.post(url, json={"text": "Rank.", "base_version": 1.0}, headers=world.headers("lead"))
    assert saved.status_code == 201 and saved.json()["version"] == 2, saved.text


def test_a_page_form_still_converts_its_text(app: Any, world: World) -> None:
    """The constitution editor posts its priorities as text; the API model it builds (strict for JSON) takes them."""
    from app.web.forms import ConstitutionForm

    form = ConstitutionForm.model_validate({"base_version": "1", "p-0-name": "Honest", "p-0-comparison": "Which?",
                                            "p-0-priority": "3"})
    assert form.to_api().principles[0].priority == 3


def test_a_405_names_every_method_the_path_serves(client: Any, world: World) -> None:
    headers = world.headers("lead")
    for method, path, allowed in [("OPTIONS", "/api/v1/projects", "GET, POST"),
                                  ("DELETE", "/api/v1/projects", "GET, POST"),
                                  ("PUT", f"/api/v1/exports/{world.a.export_id}", "DELETE, GET"),
                                  ("DELETE", f"/api/projects/{world.a.project_id}/rubrics", "GET, POST")]:
        r = client.request(method, path, headers=headers)
        assert r.status_code == 405 and r.headers["allow"] == allowed, (method, path, r.headers.get("allow"))


def test_a_created_project_links_to_what_uses_it(client: Any) -> None:
    spec = _spec(client)
    links = spec["paths"]["/api/v1/projects"]["post"]["responses"]["201"]["links"]
    ids = {op["operationId"]: (m, p) for m, p, op in _operations(spec)}
    targets = {ids[name] for name in links}
    for target in [("post", "/api/v1/projects/{project_id}/rubrics"), ("post", "/api/v1/projects/{project_id}/imports"),
                   ("post", "/api/v1/projects/{project_id}/rankings"), ("post", "/api/v1/projects/{project_id}/exports"),
                   ("get", "/api/v1/projects/{project_id}/training-runs")]:
        assert target in targets, target
    assert all(link["parameters"] == {"project_id": "$response.body#/id"} for link in links.values())
    export = spec["paths"]["/api/v1/projects/{project_id}/exports"]["post"]["responses"]["202"]["links"]
    delete = next(link for name, link in export.items() if ids[name] == ("delete", "/api/v1/exports/{export_id}"))
    assert delete["parameters"] == {"export_id": "$response.body#/export_id"}


def test_operation_ids_are_the_handlers_names_for_generated_clients(client: Any) -> None:
    spec = _spec(client)
    ids = [op["operationId"] for _, _, op in _operations(spec)]
    assert len(ids) == len(set(ids))
    assert spec["paths"]["/api/v1/projects"]["post"]["operationId"] == "create_project"
    assert spec["paths"]["/api/v1/projects/{project_id}/rankings"]["post"]["operationId"] == "submit_ranking"


def test_the_api_is_versioned_and_the_unversioned_name_still_works(client: Any, world: World) -> None:
    headers = world.headers("lead")
    versioned = client.get("/api/v1/projects", headers=headers)
    plain = client.get("/api/projects", headers=headers)
    assert versioned.status_code == plain.status_code == 200 and versioned.json() == plain.json()
    assert "deprecation" not in versioned.headers
    assert plain.headers["deprecation"] == "true"
    assert plain.headers["link"] == '</api/v1/projects>; rel="successor-version"'
    assert all(p.startswith("/api/v1/") for p in _spec(client)["paths"] if p.startswith("/api"))


def test_outbound_hosts_none_refuses_every_url_without_resolving_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_dns(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("resolved a name")

    monkeypatch.setattr(socket, "getaddrinfo", no_dns)
    monkeypatch.setattr(outbound, "_refuse_all", True)
    for url in ("https://api.example.org/v1", "http://10.0.0.1:8000/v1", "http://localhost/v1"):
        with pytest.raises(Invalid, match="PREFLAB_OUTBOUND_HOSTS=none") as refused:
            outbound.check_base_url(url, field="generator.base_url")
        assert refused.value.field == "generator.base_url"
    with pytest.raises(ValueError, match="switched off"):
        outbound.address_guard(allow_private=True)("10.0.0.1")


def test_only_a_listed_rule_excuses_a_refusal() -> None:
    """`make api-check` lets a schema-valid request be refused only for a rule in schema_exceptions, and lets no
    other kind of failure through."""
    from tests.security.schema_exceptions import EXCEPTIONS, allowed

    members = "POST /api/v1/projects/{project_id}/members"
    refusal = 'answered 422: {"detail":[{"message":"no user with email a@b.co","field":"email"}]}'
    assert allowed(members, "positive_data_acceptance", refusal)
    assert not allowed(members, "status_code_conformance", refusal)
    assert not allowed(members, "positive_data_acceptance", 'answered 422: {"detail":[{"message":"String should '
                                                           'have at most 320 characters","field":"email"}]}')
    assert all(reason for _, _, reason in EXCEPTIONS)
