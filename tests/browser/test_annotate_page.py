"""An annotator ranks in real headless Chromium: keyboard only (with a tie), and by dragging with the mouse.

Every test here fails on any console error (a CSP violation is one) that it did not name in advance.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from app.accounts import users
from app.models import Completion, Pair, Prompt, Ranking
from app.projects import projects

PASSWORD = "correct horse battery staple"
pytestmark = pytest.mark.slow
CSP_WATCH = """document.addEventListener('securitypolicyviolation',
  e => console.error('CSP violation: ' + e.violatedDirective + ' ' + e.sourceFile + ':' + e.columnNumber));"""


def watch_console(page) -> None:  # type: ignore[no-untyped-def]
    """Collect console errors and CSP violations on `page`; `page.allowed_console` names the expected ones."""
    page.console_errors = []
    page.allowed_console = []
    page.context.add_init_script(CSP_WATCH)
    page.on("console", lambda m: m.type == "error" and page.console_errors.append(m.text))
    page.on("pageerror", lambda e: page.console_errors.append(str(e)))


def assert_console_clean(page) -> None:  # type: ignore[no-untyped-def]
    unexpected = [e for e in page.console_errors if not any(a in e for a in page.allowed_console)]
    assert unexpected == [], f"console errors on {page.url}: {unexpected}"


@pytest.fixture
def page(chromium):  # type: ignore[no-untyped-def]
    """conftest's page (1366×800), failing the test on any console error it did not expect."""
    context = chromium.new_context(viewport={"width": 1366, "height": 800})
    pg = context.new_page()
    watch_console(pg)
    yield pg
    errors = list(pg.console_errors)
    context.close()
    pg.console_errors = errors
    assert_console_clean(pg)


@pytest.fixture
def new_page(chromium):  # type: ignore[no-untyped-def]
    """Pages in contexts of one's own (a phone, touch, no JavaScript), held to the same rule as `page`."""
    made = []

    def make(width: int = 1366, height: int = 800, **options):  # type: ignore[no-untyped-def]
        pg = chromium.new_context(viewport={"width": width, "height": height}, **options).new_page()
        watch_console(pg)
        made.append(pg)
        return pg

    yield make
    for pg in made:
        pg.context.close()
    for pg in made:
        assert_console_clean(pg)


def _seed(server, n_prompts: int = 2, *, answer=None, prompt=None, rubric: str = "Rank **correct** answers first.",  # type: ignore[no-untyped-def]
          flags: list[str] | None = None, annotators: int = 1) -> tuple[int, str]:
    """A lead, annotators ann@ (ann2@, …), and a K=4 project; `answer(i, j)` and `prompt(i)` give the texts."""
    answer = answer or (lambda i, j: f"Answer {i}.{j}: " + "long text " * 150)
    prompt = prompt or (lambda i: f"What is {i} + {i}? <script>alert(1)</script>")
    with server.session() as db:
        lead = users.create_user(db, "lead@example.org", PASSWORD, "lead")
        project = projects.create_project(db, lead, name="Browser", completions_per_prompt=4, overlap=annotators,
                                          rubric_text=rubric, criteria=["Correct"])
        if flags:
            project.flags = flags
        emails = ["ann@example.org"] + [f"ann{n}@example.org" for n in range(2, annotators + 1)]
        for email in emails:
            ann = users.create_user(db, email, PASSWORD, "annotator")
            projects.add_member(db, project, lead, email=ann.email, role="annotator")
        for i in range(n_prompts):
            row = Prompt(project_id=project.id, text=prompt(i), text_hash=f"h{i}", split="train")
            db.add(row)
            db.flush()
            db.add_all(Completion(prompt_id=row.id, text=answer(i, j)) for j in range(4))
        db.commit()
        return project.id, emails[0]


def _login(page, base: str, email: str) -> None:  # type: ignore[no-untyped-def]
    page.goto(f"{base}/login")
    # The email field has autofocus, but Chromium may apply it after "load": wait for it, then type.
    page.wait_for_function("() => document.activeElement && document.activeElement.name === 'email'")
    page.keyboard.type(email)
    page.keyboard.press("Tab")
    page.keyboard.type(PASSWORD)
    page.keyboard.press("Enter")
    page.wait_for_url(f"{base}/projects")


def _focused_card(page):  # type: ignore[no-untyped-def]
    """(completion id, list id) of the focused response card, or None."""
    return page.evaluate("() => { const a = document.activeElement;"
                         " return a && a.classList.contains('resp') ? [+a.dataset.cid, a.parentNode.id] : null; }")


def _tab_to_unranked_card(page, limit: int = 80) -> str:  # type: ignore[no-untyped-def]
    """Press Tab until a response card that is not ranked yet has the focus; its completion id."""
    for _ in range(limit):
        page.keyboard.press("Tab")
        cid = page.evaluate("() => { const a = document.activeElement;"
                            " return a && a.classList.contains('resp') && a.parentNode.id === 'unranked'"
                            " ? a.dataset.cid : null; }")
        if cid:
            return cid
    raise AssertionError("no unranked response card reachable with Tab")


def test_keyboard_only_ranking_with_a_tie(live_server, page) -> None:  # type: ignore[no-untyped-def]
    project_id, email = _seed(live_server)
    base = live_server.base
    _login(page, base, email)
    page.goto(f"{base}/projects/{project_id}/annotate")
    assert page.locator("#prompt-h").is_visible()
    assert page.locator("script", has_text="alert(1)").count() == 0  # the prompt's markup stayed text
    first_prompt = page.locator(".prompt .text").inner_text()

    shown = [int(c) for c in page.locator("#unranked > .resp").evaluate_all("els => els.map(e => e.dataset.cid)")]
    order = []
    for key in ["1", "2", "3", "4"]:  # focus starts on the first card and moves on to the next unranked one
        cid, where = _focused_card(page)
        assert where == "unranked"
        page.keyboard.press(key)
        order.append(cid)
    assert order == shown
    assert _focused_card(page) == [order[3], "ranked"]  # the last one placed keeps the focus
    page.keyboard.press("=")  # the fourth card ties with the third
    assert page.locator("#rank-status").inner_text().startswith("4 of 4 ranked")
    page.keyboard.press("Control+Enter")
    page.wait_for_selector("#flash")
    assert page.locator(".prompt .text").inner_text() != first_prompt  # the next task, without a reload
    assert page.url.endswith(f"/projects/{project_id}/annotate")
    assert page.locator("#done-total").inner_text() == "1"

    with live_server.session() as db:
        ranking = db.scalar(select(Ranking))
        assert ranking.tiers == [[order[0]], [order[1]], sorted([order[2], order[3]])]
        assert ranking.seconds_spent is not None and ranking.seconds_spent >= 0
        pairs = {(p.chosen_id, p.rejected_id, p.margin) for p in db.scalars(select(Pair))}
        a, b, c, d = order
        assert pairs == {(a, b, 1), (a, c, 2), (a, d, 2), (b, c, 1), (b, d, 1)}


def test_drag_with_the_mouse_and_a_draft_survives_reload(live_server, page) -> None:  # type: ignore[no-untyped-def]
    project_id, email = _seed(live_server, n_prompts=1)
    base = live_server.base
    page.set_viewport_size({"width": 1366, "height": 2400})  # every card on screen, so the mouse can reach it
    _login(page, base, email)
    page.goto(f"{base}/projects/{project_id}/annotate")

    def drag_first_unranked_to_end_of_ranked() -> int:
        # Sortable animates the cards into place after a drop (`el.animated` holds its timer meanwhile): a card is
        # grabbed where it stands once they stand still, not where it is passing through.
        page.wait_for_function("() => [...document.querySelectorAll('.resp')].every(e => !e.animated)")
        card = page.locator("#unranked > .resp").first
        cid = int(card.get_attribute("data-cid"))
        box = card.locator(".letter").bounding_box()
        page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
        page.mouse.down()
        page.mouse.move(box["x"] + 10, box["y"] + 10, steps=5)
        page.wait_for_selector(".sortable-fallback", state="attached")  # the card is lifted: the drag has begun
        # The target is measured once the card is lifted: the drag itself may shift the layout.
        target = page.locator("#ranked").bounding_box()
        x, y = target["x"] + target["width"] / 2, target["y"] + target["height"] - 12  # the drop room at the end
        page.mouse.move(x, y, steps=20)
        # Hold still over the drop room until Sortable has placed the card there, as a hand waits for the gap to
        # open: its pointer fallback tests the position under the pointer on a timer, so a release in the same
        # instant as the last move can land before it looked (seen once in CI, on a loaded machine).
        page.wait_for_selector(f'#ranked .resp.sortable-ghost[data-cid="{cid}"]', state="attached")
        page.mouse.up()
        page.wait_for_function(f"() => document.querySelector('#ranked .resp[data-cid=\"{cid}\"]:not(.sortable-ghost)')"
                               " !== null && !document.querySelector('.sortable-fallback')")
        return cid

    order = [drag_first_unranked_to_end_of_ranked() for _ in range(2)]
    page.reload()  # the draft is kept in this browser
    assert [int(x) for x in page.locator("#ranked > .resp").evaluate_all("els => els.map(e => e.dataset.cid)")] \
        == order
    order += [drag_first_unranked_to_end_of_ranked() for _ in range(2)]
    page.get_by_role("button", name="Submit ranking").click()
    page.wait_for_selector("#queue-empty")

    with live_server.session() as db:
        ranking = db.scalar(select(Ranking))
        assert ranking.tiers == [[c] for c in order]
        assert db.scalar(select(Pair).where(Pair.chosen_id == order[0], Pair.rejected_id == order[3])).margin == 3


def test_a_refused_submit_keeps_the_ranking_on_screen(live_server, page) -> None:  # type: ignore[no-untyped-def]
    project_id, email = _seed(live_server, n_prompts=1)
    base = live_server.base
    page.allowed_console = ["the server responded with a status of 422", "Response Status Error Code 422"]
    _login(page, base, email)
    page.goto(f"{base}/projects/{project_id}/annotate")
    for key in ["1", "2", "3", "4"]:
        _tab_to_unranked_card(page)
        page.keyboard.press(key)
    # Meanwhile the lead saves a new rubric version: the submit is refused as stale.
    with live_server.session() as db:
        from app.models import Project, User
        from app.projects import rubrics

        project = db.get(Project, project_id)
        lead = db.scalar(select(User).where(User.email == "lead@example.org"))
        rubrics.create_version(db, project, lead, text="New rules", criteria=[], base_version=1)
        db.commit()
    page.get_by_role("button", name="Submit ranking").click()
    error = page.locator("#submit-error")
    error.wait_for(state="visible")
    assert "rubric" in error.inner_text() and "kept" in error.inner_text()
    assert page.locator("#ranked > .resp").count() == 4
    with live_server.session() as db:
        assert db.scalar(select(Ranking)) is None


def test_import_errors_show_on_the_page_after_an_htmx_upload(live_server, page, tmp_path) -> None:  # type: ignore[no-untyped-def]
    project_id, _ = _seed(live_server, n_prompts=1)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok", "completions": ["a", "b"]}\n{"prompt": 42}\n')
    page.allowed_console = ["the server responded with a status of 4"]
    _login(page, live_server.base, "lead@example.org")
    page.goto(f"{live_server.base}/projects/{project_id}/import")
    page.set_input_files("input[type=file]", str(bad))
    page.get_by_role("button", name="Import").click()
    alert = page.locator("#result [role=alert]")
    alert.wait_for(state="visible")
    assert "Nothing was imported" in alert.inner_text() and "2" in alert.locator("td").first.inner_text()
    assert page.url.endswith("/import")  # swapped in place, no navigation
