"""Check 15: oversized and hostile uploads are refused early, with bounded memory and nothing imported."""

from __future__ import annotations

import json
import resource
from typing import Any

from sqlalchemy import func, select

from app.models import Prompt


def _lead_client(db: Any, make_user: Any, make_project: Any, token_for: Any, api: Any) -> tuple[Any, int]:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead)
    client = api(token_for(db, lead))
    db.commit()
    return client, project.id


def test_a_2_gb_streamed_upload_is_refused_without_reading_it(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import httpx

    from app.accounts import users
    from app.projects import projects
    from tests.browser.conftest import LiveServer

    server = LiveServer(tmp_path)  # a real uvicorn server: the test client would buffer the body itself
    server.start()
    try:
        with server.session() as db:
            lead = users.create_user(db, "lead@example.org", "correct horse battery staple", "lead")
            project = projects.create_project(db, lead, name="p", completions_per_prompt=2, overlap=1,
                                              rubric_text="r", criteria=[])
            _, token = users.create_token(db, lead)
            db.commit()
            pid = project.id
        sent = 0

        def body():  # type: ignore[no-untyped-def]
            nonlocal sent
            yield b'--x\r\nContent-Disposition: form-data; name="file"; filename="big.jsonl"\r\n\r\n'
            chunk = b"x" * (1 << 20)
            for _ in range(2048):  # 2 GiB if anyone read it all
                sent += len(chunk)
                yield chunk

        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            r = httpx.post(f"{server.base}/api/projects/{pid}/imports", content=body(), timeout=60,
                           headers={"content-type": "multipart/form-data; boundary=x",
                                    "authorization": f"Bearer {token}"})
            status = r.status_code
        except httpx.HTTPError:
            status = 413  # the server answered and closed while the client was still sending
        assert status == 413 and sent > 0
        assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 300_000  # KiB: nothing buffered
        with server.session() as db:
            assert db.scalar(select(func.count(Prompt.id))) == 0
    finally:
        server.stop()


def test_a_declared_huge_body_is_refused_before_reading(db, app, make_user, make_project, token_for, api) -> None:
    client, pid = _lead_client(db, make_user, make_project, token_for, api)
    r = client.post(f"/api/projects/{pid}/imports", content=b"tiny",
                    headers={"content-type": "multipart/form-data; boundary=x", "content-length": str(2 << 30)})
    assert r.status_code == 413


def test_deeply_nested_json_is_a_clear_4xx_and_imports_nothing(db, app, make_user, make_project, token_for,
                                                               api) -> None:
    client, pid = _lead_client(db, make_user, make_project, token_for, api)
    deep = '{"prompt": "p", "metadata": ' + '{"a": ' * 10_000 + "1" + "}" * 10_000 + "}\n"
    r = client.post(f"/api/projects/{pid}/imports", files={"file": ("deep.jsonl", deep.encode())})
    assert r.status_code == 422
    assert r.json()["detail"][0]["line"] == 1
    assert db.scalar(select(func.count(Prompt.id))) == 0
    db.rollback()
    # The JSON API itself: a nested request body is refused as invalid, never a 500.
    nested = json.loads('{"name": "x", "completions_per_prompt": 4, "rubric": {"text": "t", "criteria": '
                        + "[" * 500 + "]" * 500 + "}}")
    assert client.post("/api/projects", json=nested).status_code == 422


def test_a_csv_bad_deep_in_the_file_names_its_line(db, app, make_user, make_project, token_for, api) -> None:
    client, pid = _lead_client(db, make_user, make_project, token_for, api)
    rows = ["prompt,completion_1,completion_2"] + [f"q{i},a{i},b{i}" for i in range(1, 4000)]
    rows.insert(3500, 'q-bad,"unterminated')
    r = client.post(f"/api/projects/{pid}/imports", files={"file": ("big.csv", "\n".join(rows).encode())})
    assert r.status_code == 422
    assert any(d["line"] >= 3500 for d in r.json()["detail"])
    assert db.scalar(select(func.count(Prompt.id))) == 0
