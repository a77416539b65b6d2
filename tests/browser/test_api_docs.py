"""/docs draws the API's operations with Swagger UI served by the app itself (app/static/vendor, pinned in
package.json): nothing from a CDN, nothing the CSP refuses, for a visitor and for a logged-in user alike."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.accounts import users
from tests.browser.conftest import IN_CI
from tests.browser.test_annotate_page import PASSWORD, _login, new_page  # noqa: F401 - fixture

pytestmark = pytest.mark.slow
BUNDLE = Path(__file__).resolve().parents[2] / "app" / "static" / "vendor" / "swagger-ui-bundle.js"


def _operations_drawn(pg, base: str) -> None:  # type: ignore[no-untyped-def]
    outside: list[str] = []
    pg.on("request", lambda r: r.url.startswith(base) or r.url.startswith("data:") or outside.append(r.url))
    response = pg.goto(f"{base}/docs")
    assert response.status == 200 and "script-src 'self'" in response.headers["content-security-policy"]
    pg.wait_for_selector(".opblock-summary-path", timeout=15_000)
    paths = pg.locator(".opblock-summary-path").all_inner_texts()
    assert "/api/v1/projects/{project_id}/rankings" in paths and len(paths) > 50
    assert pg.locator(".opblock-tag-section").count() > 5  # grouped by tag, as the schema names them
    # An operation opens and shows its parameters and answers.
    pg.locator(".opblock-summary-path", has_text="/api/v1/exports/{export_id}").first.click()
    pg.wait_for_selector(".opblock.is-open .responses-wrapper")
    assert outside == [], f"/docs fetched from outside the app: {outside}"


def test_the_api_docs_render_every_operation_from_the_app_itself(live_server, new_page) -> None:  # noqa: F811
    if not BUNDLE.is_file():
        if IN_CI:
            pytest.fail(f"{BUNDLE} missing: run `make vendor`", pytrace=False)
        pytest.skip(reason="Swagger UI not vendored (make vendor)")
    _operations_drawn(new_page(), live_server.base)  # a visitor: the schema is public
    with live_server.session() as db:
        users.create_user(db, "eng@example.org", PASSWORD, "engineer")
        db.commit()
    for size in ({"width": 1366, "height": 900}, {"width": 390, "height": 844, "is_mobile": True, "has_touch": True}):
        pg = new_page(**size)
        _login(pg, live_server.base, "eng@example.org")
        _operations_drawn(pg, live_server.base)
        assert pg.locator("header.top nav a[href='/docs']").count() == 1  # the app's own header, logged in
        assert pg.evaluate("document.documentElement.scrollWidth") <= size["width"]  # no sideways scroll
