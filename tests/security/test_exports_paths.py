"""Check 16: export file names with `../`, `%2e%2e/`, NUL or absolute paths → 404, files stay in the export
directory and are fetched by id; download names are RFC 6266 encoded."""

from __future__ import annotations

from typing import Any

import pytest

from tests.security.world import World

NAMES = ["../../secret_key", "..%2f..%2fsecret_key", "%2e%2e/%2e%2e/secret_key", "%2e%2e%2f%2e%2e%2fsecret_key",
         "pairs.jsonl%00.txt", "/etc/passwd", "%2fetc%2fpasswd", "..\\..\\secret_key", "pairs.jsonl/../../x",
         "PAIRS.JSONL"]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_traversal_names_are_404(client: Any, world: World) -> None:
    base = f"/api/exports/{world.a.export_id}/files/"
    assert client.get(base + "pairs.jsonl", headers=world.headers("lead")).status_code == 200
    for name in NAMES:
        response = client.get(base + name, headers=world.headers("lead"))
        # (the client may normalise `..` away: then another route answers 4xx; never the file)
        assert response.status_code in (400, 404, 422), (name, response.status_code)
        assert b"chosen" not in response.content and b"root:" not in response.content


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_download_names_are_rfc6266(client: Any, world: World) -> None:
    response = client.get(f"/api/exports/{world.a.export_id}/files/pairs.jsonl", headers=world.headers("lead"))
    disposition = response.headers["content-disposition"]
    assert disposition.startswith("attachment;") and "filename" in disposition
    assert "\n" not in disposition and '"' not in disposition.split("filename", 1)[1].strip('="')
    assert response.headers["x-content-type-options"] == "nosniff"
