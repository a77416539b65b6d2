"""Checks 9 and 10: autoescape everywhere, no `|safe`/`Markup` on user data, an allowlist Markdown sanitiser,
hx-disable on containers of user text, and the security headers (CSP exact, no unsafe-eval, HSTS outside dev).

The browser-side half of check 8 (the XSS corpus inert on every page) is tests/browser/test_xss.py.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from app.web.rendering import CSP, TEMPLATES_DIR, render_markdown, templates
from tests.conftest import TEST_SECRET

APP_DIR = Path(__file__).resolve().parents[2] / "app"
REQUIRED_CSP = {"default-src": "'self'", "object-src": "'none'", "base-uri": "'none'", "frame-ancestors": "'none'"}


def test_autoescape_is_on_for_every_template_name() -> None:
    env = templates.env
    for name in ("page.html", "partial.htm", "fragment.txt", "no_extension", "x.xml"):
        assert env.autoescape is True or env.autoescape(name), name
    rendered = env.from_string("{{ x }}").render(x='<img src=x onerror="alert(1)">')
    assert rendered == "&lt;img src=x onerror=&#34;alert(1)&#34;&gt;"


def test_no_template_marks_anything_safe_or_turns_autoescape_off() -> None:
    offenders = []
    for path in sorted(TEMPLATES_DIR.rglob("*.html")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\|\s*safe\b|Markup\s*\(|autoescape\s+false|\{%-?\s*autoescape", line):
                offenders.append(f"{path.name}:{n}: {line.strip()}")
    assert offenders == []


def test_markup_is_built_only_by_the_markdown_sanitiser() -> None:
    offenders = []
    for path in sorted(APP_DIR.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\bMarkup\s*\(|markupsafe\.Markup|HTMLResponse\(\s*f[\"']", line):
                offenders.append(f"{path.relative_to(APP_DIR.parent)}:{n}")
    # The sanitiser's, and the two that mark our own autoescaped template output (a cached page fragment) as HTML.
    assert offenders == [f"app/web/rendering.py:{n}" for n in _markup_lines()], offenders


def _markup_lines() -> list[int]:
    lines = (APP_DIR / "web" / "rendering.py").read_text().splitlines()
    allowed = ("return Markup(clean)", "return Markup(html)  # noqa: S704 - the autoescaped output",
               "return Markup(html)  # noqa: S704 - only ever render_fragment")
    return [i for i, line in enumerate(lines, 1) if any(a in line for a in allowed)]


@pytest.mark.parametrize("source, forbidden", [
    ("<script>alert(1)</script>", "<script"),
    ('<img src=x onerror="alert(1)">', "<img"),
    ("[x](javascript:alert(1))", 'href="javascript'),
    ("[x](JaVaScRiPt:alert(1))", 'href="javascript'),
    ("<a href='javascript:alert(1)'>x</a>", 'href="javascript'),
    ("[x](data:text/html;base64,PHNjcmlwdD4=)", 'href="data'),
    ('<div hx-get="/api/users" hx-trigger="load">x</div>', "hx-get"),
    ("<a href=\"/x\" onclick=\"alert(1)\">x</a>", "onclick"),
    ("<iframe src=//evil.example></iframe>", "<iframe"),
    ("<style>body{display:none}</style>", "<style"),
    ('![i](http://evil.example/pixel.png)', "<img"),
])
def test_markdown_goes_through_an_allowlist_sanitiser(source: str, forbidden: str) -> None:
    html = str(render_markdown(source)).lower()
    # Escaped text (&lt;div hx-get…) is inert; only a real tag or attribute counts.
    needle = forbidden if forbidden.startswith("<") else "<[a-z][^<>]*" + re.escape(forbidden)
    assert not re.search(needle if not forbidden.startswith("<") else re.escape(forbidden), html), html


def test_containers_of_user_html_carry_hx_disable() -> None:
    """Every place that renders sanitised Markdown (the only user-derived HTML) sits inside hx-disable."""
    offenders = []
    for path in sorted(TEMPLATES_DIR.rglob("*.html")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(r"\|\s*markdown\b", line) and "hx-disable" not in line:
                offenders.append(f"{path.name}:{n}")
    assert offenders == []


def _directives(header: str) -> dict[str, str]:
    return {part.strip().split(" ", 1)[0]: part.strip().split(" ", 1)[1] if " " in part.strip() else ""
            for part in header.split(";") if part.strip()}


def test_csp_and_security_headers_on_pages_api_errors_and_static(client: Any, world: Any) -> None:
    for url, headers in (("/login", {}), ("/api/me", world.headers("lead")), ("/api/projects/999999", world.headers("lead")),
                         ("/static/preflab.css", {}), ("/no/such/page", {})):
        response = client.get(url, headers=headers)
        assert "content-security-policy-report-only" not in response.headers
        csp = response.headers["content-security-policy"]
        assert csp == CSP == (
            "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
            "object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"), url
        directives = _directives(csp)
        for name, value in REQUIRED_CSP.items():
            assert directives[name] == value
        assert "unsafe-eval" not in csp and "unsafe-inline" not in csp
        assert response.headers["x-content-type-options"] == "nosniff"
        assert response.headers["referrer-policy"] in ("same-origin", "no-referrer", "strict-origin-when-cross-origin")
        assert response.headers["x-frame-options"] == "DENY"
        assert "strict-transport-security" not in response.headers  # dev over plain http


def test_htmx_is_configured_for_a_csp_without_unsafe_eval(client: Any) -> None:
    page = client.get("/login").text
    config = re.search(r'<meta name="htmx-config" content=\'([^\']*)\'', page)
    assert config, "htmx-config meta missing"
    import json

    settings = json.loads(config.group(1))
    assert settings["allowEval"] is False and settings["allowScriptTags"] is False
    assert settings["selfRequestsOnly"] is True
    assert "<script>" not in page and " on" not in re.sub(r"<(?!\w)", "", page).split("<body", 1)[1].split(">", 1)[0]


def test_hsts_and_secure_cookies_outside_dev(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    from app.main import create_app
    from app.platform.migrate import upgrade
    from app.platform.settings import Settings

    url = f"sqlite:///{tmp_path}/prod.db"
    upgrade(url)
    app = create_app(Settings(env="production", database_url=url, secret_key=TEST_SECRET, data_dir=tmp_path))
    try:
        with TestClient(app, base_url="https://preflab.example") as client:
            response = client.get("/login")
        assert response.headers["strict-transport-security"].startswith("max-age=")
        assert int(response.headers["strict-transport-security"].split("=")[1].split(";")[0]) >= 15552000
        assert "Secure" in response.headers["set-cookie"] and "HttpOnly" in response.headers["set-cookie"]
    finally:
        app.state.engine.dispose()
