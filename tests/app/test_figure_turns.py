"""Views of the agreement figures take turns in a server process: a crowd of leads reloading the page waits for its
turn in the event loop, while every other request goes on being served."""

from __future__ import annotations

import asyncio

import httpx

from app.web.deps import FIGURE_VIEWS


def test_a_view_of_the_figures_waits_for_its_turn_while_other_requests_are_served(
        app, db, make_user, make_project, token_for) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    token = token_for(db, lead)
    db.commit()

    async def scenario() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://testserver",
                                     headers={"Authorization": f"Bearer {token}"}) as client:
            turn = FIGURE_VIEWS.semaphore()
            await turn.acquire()  # another lead's view holds the turn
            try:
                view = asyncio.create_task(client.get(f"/api/projects/{project.id}/agreement"))
                other = await client.get(f"/api/projects/{project.id}")
                assert other.status_code == 200  # served while the view waits
                done, _ = await asyncio.wait({view}, timeout=0.5)
                assert not done  # still waiting: it runs no query until its turn
            finally:
                turn.release()
            assert (await view).status_code == 200
            assert (await client.get(f"/api/projects/{project.id}/agreement")).status_code == 200  # turn given back

    asyncio.run(scenario())
