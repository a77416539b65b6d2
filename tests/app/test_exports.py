"""Exports end to end on SQLite and Postgres: rank through the API, export through the real job worker, read back.

Every export here goes through `POST /api/projects/{id}/exports` and `Worker.run_one()` (or the writer directly,
where the test needs a hook between batches), and is read by the libraries engineers use: `datasets`,
`training.data` and, when installed, TRL's RewardTrainer.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from app.annotation.pairs import expand_tiers
from app.exports import writer as export_writer
from app.exports.sinks import JsonlSink
from app.models import Completion, Export, Job, Pair, Prompt, Ranking
from app.projects import projects

PAIR_COLUMNS = ["pair_id", "prompt_id", "ranking_id", "prompt", "chosen", "rejected", "chosen_id", "rejected_id",
                "source", "annotator", "rubric_version", "constitution_version", "margin", "weight", "p", "split"]
FILE_OF = {"jsonl": "pairs.jsonl", "parquet": "pairs.parquet", "hf": "pairs"}


# ------------------------------------------------------------------------------------------------
# helpers


def _seed(db, make_user, make_project, *, n_prompts=4, k=3, annotators=2, heldout=(3,)):  # type: ignore[no-untyped-def]
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=k, overlap=annotators)
    engineer = make_user(db, "engineer")
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    people = [make_user(db, "annotator") for _ in range(annotators)]
    for person in people:
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    for i in range(n_prompts):
        prompt = Prompt(project_id=project.id, text=f"question {i}", text_hash=f"h{i}-{project.id}",
                        split="heldout" if i in heldout else "train", reference=str(i))
        db.add(prompt)
        db.flush()
        db.add_all(Completion(prompt_id=prompt.id, text=f"answer {i}.{j}") for j in range(k))
    db.flush()
    return lead, engineer, project, people


def _rank_everything(db, api, token_for, project, people) -> int:  # type: ignore[no-untyped-def]
    """Every annotator ranks every prompt through the queue API, best completion id first; returns pairs made."""
    clients = [api(token_for(db, p)) for p in people]
    db.commit()
    made = 0
    for client in clients:
        while True:
            r = client.get(f"/api/projects/{project.id}/tasks/next")
            if r.status_code == 204:
                break
            task = r.json()
            ids = sorted(c["id"] for c in task["completions"])
            body = {"assignment_id": task["assignment_id"], "tiers": [[i] for i in ids],
                    "rubric_version": task["rubric"]["version"], "submission_id": f"s-{task['assignment_id']}"}
            sub = client.post(f"/api/projects/{project.id}/rankings", json=body)
            assert sub.status_code == 201, sub.text
            made += sub.json()["pairs_created"]
    return made


def _run_worker(app) -> None:  # type: ignore[no-untyped-def]
    from app.worker import Worker

    worker = Worker(app.state.settings, session_factory=app.state.session_factory, heartbeat_s=0.2)
    assert worker.run_one(), "no job to run"


def _export(client, app, project_id: int, **body: Any) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    r = client.post(f"/api/projects/{project_id}/exports", json=body)
    assert r.status_code == 202, r.text
    accepted = r.json()
    assert set(accepted) == {"export_id", "job_id"}
    _run_worker(app)
    out = client.get(f"/api/exports/{accepted['export_id']}").json()
    assert out["status"] == "ready", (out, client.get(f"/api/jobs/{accepted['job_id']}").text)
    return out


def _download(client, out: dict[str, Any], dest: Path) -> Path:  # type: ignore[no-untyped-def]
    """Fetch every file of an export through the API into `dest`, checking each against its sha256."""
    for name, sha in out["files"].items():
        r = client.get(f"/api/exports/{out['id']}/files/{name}")
        assert r.status_code == 200, r.text
        assert hashlib.sha256(r.content).hexdigest() == sha
        assert r.headers["content-disposition"].startswith("attachment; filename=")
        (dest / name).parent.mkdir(parents=True, exist_ok=True)
        (dest / name).write_bytes(r.content)
    return dest


def _load(fmt: str, path: Path):  # type: ignore[no-untyped-def]
    import datasets

    if fmt == "hf":
        return datasets.load_from_disk(str(path))
    return datasets.load_dataset("json" if fmt == "jsonl" else "parquet", data_files=str(path), split="train")


# ------------------------------------------------------------------------------------------------
# round trip


def test_rank_export_and_load_in_every_format(db, app, make_user, make_project, token_for, api, tmp_path) -> None:
    from training.data import load_pairs, split_train_heldout

    lead, engineer, project, people = _seed(db, make_user, make_project)
    made = _rank_everything(db, api, token_for, project, people)
    assert made == 4 * 3 * 2  # 4 prompts × C(3, 2) pairs × 2 annotators
    client = api(token_for(db, engineer))
    db.commit()
    pair_ids = sorted(db.scalars(select(Pair.id)))
    db.commit()  # end the read: on SQLite an open transaction holds the write lock the API needs
    project_id = project.id  # read once: after a rollback, touching `project` would reopen a (locking) transaction
    for fmt in ("jsonl", "parquet", "hf"):
        out = _export(client, app, project_id, kind="pairs", format=fmt)
        assert out["row_count"] == made and out["row_counts"] == {
            "source.human": made, "split.heldout": 6, "split.train": 18}
        assert "README.md" in out["files"] and len(out["sha256"]) == 64
        # the row records the snapshot it read: Postgres xmin:xmax:xip list, or SQLite's read transaction
        assert out["snapshot"].startswith(("postgres ", "sqlite "))
        local = _download(client, out, tmp_path / fmt)
        ds = _load(fmt, local / FILE_OF[fmt])
        assert ds.column_names == PAIR_COLUMNS and ds.num_rows == made
        assert ds["pair_id"] == pair_ids  # ordered by pair id
        row = ds[0]
        ranking = db.get(Ranking, row["ranking_id"])
        pair = db.get(Pair, row["pair_id"])
        # Lineage: the row traces back to its ranking, the (pseudonymous) annotator and the rubric version.
        assert (row["chosen_id"], row["rejected_id"], row["margin"]) == (pair.chosen_id, pair.rejected_id, pair.margin)
        assert row["chosen"] == db.get(Completion, pair.chosen_id).text
        assert row["annotator"] == export_writer.annotator_pseudonym(
            app.state.settings.resolved_secret(), project_id, ranking.annotator_id)
        assert row["rubric_version"] == 1
        assert row["source"] == "human" and row["p"] == 1.0 and row["weight"] == 1.0
        assert len({a for a in ds["annotator"]}) == 2
        rows = load_pairs(local / FILE_OF[fmt])
        train, heldout = split_train_heldout(rows)
        assert (len(train), len(heldout)) == (18, 6)
        assert rows[0].extra["pair_id"] == pair_ids[0]
        db.rollback()
    card = (tmp_path / "hf" / "README.md").read_text()
    assert "Rank correct answers first." in card and "mean pairwise agreement: 1.0000" in card
    assert "mean share of votes for the majority direction: 1.0000" in card and "unanimous pairs: 12" in card


def test_two_exports_of_unchanged_data_are_byte_identical(db, app, make_user, make_project, token_for, api) -> None:
    _, engineer, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    client = api(token_for(db, engineer))
    db.commit()
    for fmt in ("jsonl", "parquet", "hf"):
        for kind in ("pairs", "rankings", "prompts", "sft"):
            first = _export(client, app, project.id, kind=kind, format=fmt)
            second = _export(client, app, project.id, kind=kind, format=fmt)
            assert first["id"] != second["id"]
            assert first["files"] == second["files"] and first["sha256"] == second["sha256"], (kind, fmt)
            assert first["sha256"] == export_writer.manifest_sha256(first["files"])


def test_other_kinds_load_with_their_columns(db, app, make_user, make_project, token_for, api, tmp_path) -> None:
    import datasets

    from training.data import load_prompts

    _, engineer, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    client = api(token_for(db, engineer))
    db.commit()
    out = _export(client, app, project.id, kind="prompts", format="parquet")
    prompts = load_prompts(_download(client, out, tmp_path / "p") / "prompts.parquet")
    assert [p.reference for p in prompts] == ["0", "1", "2", "3"] and prompts[3].split == "heldout"
    out = _export(client, app, project.id, kind="rankings", format="hf")
    ds = datasets.load_from_disk(str(_download(client, out, tmp_path / "r") / "rankings"))
    assert ds.num_rows == 8 and ds.column_names[:6] == ["ranking_id", "prompt_id", "prompt", "completion_ids",
                                                         "completions", "tiers"]
    assert ds[0]["tiers"] == [[i] for i in ds[0]["completion_ids"]]
    out = _export(client, app, project.id, kind="sft", format="jsonl")
    rows = [json.loads(line) for line in (_download(client, out, tmp_path / "s") / "sft.jsonl").read_text().splitlines()]
    # Both annotators put the lowest completion id first: that completion is each prompt's SFT target.
    first_ids = {p.id: min(c.id for c in p.completions) for p in db.scalars(select(Prompt))}
    assert [(r["prompt_id"], r["completion_id"], r["votes"], r["origin"]) for r in rows] == [
        (pid, cid, 2, "best_ranked") for pid, cid in sorted(first_ids.items())]


# ------------------------------------------------------------------------------------------------
# aggregation and splits


def _rank(db, project, prompt, who, tiers, source="human"):  # type: ignore[no-untyped-def]
    ranking = Ranking(project_id=project.id, prompt_id=prompt.id, source=source, annotator_id=who.id,
                      rubric_id=project.current_rubric_id, tiers=tiers, display_order=[c for t in tiers for c in t])
    db.add(ranking)
    db.flush()
    for spec in expand_tiers(tiers):
        db.add(Pair(ranking_id=ranking.id, prompt_id=prompt.id, chosen_id=spec.chosen, rejected_id=spec.rejected,
                    margin=spec.margin, source=source))
    db.flush()
    return ranking


def test_aggregated_mode_on_a_hand_made_conflict(db, engine, make_user, make_project, tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3, overlap=4)
    a1, a2, a3, a4, a5 = (make_user(db, "annotator") for _ in range(5))
    prompt = Prompt(project_id=project.id, text="q", text_hash="q", split="train")
    db.add(prompt)
    db.flush()
    x, y, z = (Completion(prompt_id=prompt.id, text=t) for t in ("x", "y", "z"))
    db.add_all([x, y, z])
    db.flush()
    # x≻y: 3 votes to 1 (a conflict, agreement 0.75); x≻z: 3–0; y vs z: 2–2 (no majority, always dropped).
    _rank(db, project, prompt, a1, [[x.id], [y.id], [z.id]])
    _rank(db, project, prompt, a2, [[x.id], [y.id], [z.id]])
    _rank(db, project, prompt, a3, [[x.id], [z.id], [y.id]])
    _rank(db, project, prompt, a4, [[z.id], [y.id]])  # partial rankings: x left out
    _rank(db, project, prompt, a5, [[y.id], [x.id]])
    db.commit()

    def export(conflicts: str, **filters: Any) -> list[dict[str, Any]]:
        spec = export_writer.ExportSpec(project.id, "pairs", "jsonl", filters, "aggregated", conflicts)
        out = tmp_path / f"{conflicts}-{len(filters)}"
        export_writer.write_export(engine, spec, out, secret="s" * 40, batch_size=2)
        return [json.loads(line) for line in (out / "pairs.jsonl").read_text().splitlines()]

    kept = export("keep")
    assert [(r["chosen_id"], r["rejected_id"], r["votes"], r["total_votes"], r["weight"]) for r in kept] == [
        (x.id, y.id, 3, 4, 0.75), (x.id, z.id, 3, 3, 1.0)]
    assert kept[0]["agreement"] == 0.75 and kept[0]["p"] == 1.0 and len(kept[0]["ranking_ids"]) == 3
    assert len(set(kept[0]["annotators"])) == 3 and kept[1]["margin"] == pytest.approx(5 / 3)
    assert [(r["chosen_id"], r["rejected_id"]) for r in export("drop")] == [(x.id, z.id)]
    assert [(r["chosen_id"], r["rejected_id"]) for r in export("keep", min_agreement=0.8)] == [(x.id, z.id)]

    # Raw mode with a minimum agreement keeps each vote whose direction has that much support.
    spec = export_writer.ExportSpec(project.id, "pairs", "jsonl", {"min_agreement": 0.75})
    export_writer.write_export(engine, spec, tmp_path / "raw", secret="s" * 40)
    raw = [json.loads(line) for line in (tmp_path / "raw" / "pairs.jsonl").read_text().splitlines()]
    assert sorted((r["chosen_id"], r["rejected_id"]) for r in raw) == sorted([(x.id, y.id)] * 3 + [(x.id, z.id)] * 3)


def test_a_heldout_prompt_never_reaches_the_train_split(db, engine, make_user, make_project, tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    for i in range(6):
        prompt = Prompt(project_id=project.id, text=f"q{i}", text_hash=f"q{i}", split="heldout" if i % 3 else "train")
        db.add(prompt)
        db.flush()
        a, b = Completion(prompt_id=prompt.id, text="a"), Completion(prompt_id=prompt.id, text="b")
        db.add_all([a, b])
        db.flush()
        _rank(db, project, prompt, lead, [[a.id], [b.id]])
    db.commit()
    heldout = set(db.scalars(select(Prompt.id).where(Prompt.split == "heldout")))
    for aggregation in ("raw", "aggregated"):
        for split in (None, "train"):
            spec = export_writer.ExportSpec(project.id, "pairs", "parquet", {"split": split} if split else {},
                                            aggregation)
            out = tmp_path / f"{aggregation}-{split}"
            export_writer.write_export(engine, spec, out, secret="s" * 40)
            import pyarrow.parquet as pq

            table = pq.read_table(out / "pairs.parquet").to_pylist()
            assert table, "the fixture has pairs"
            for row in table:
                assert (row["split"] == "heldout") == (row["prompt_id"] in heldout)
            if split == "train":
                assert not {r["prompt_id"] for r in table} & heldout


def test_chat_prompts_export_in_the_conversational_layout(db, engine, make_user, make_project, tmp_path) -> None:
    from training.data import load_pairs

    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=2)
    chat = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]
    for i, messages in enumerate([chat, None]):
        prompt = Prompt(project_id=project.id, text=f"q{i}", text_hash=f"q{i}", messages=messages)
        db.add(prompt)
        db.flush()
        a, b = Completion(prompt_id=prompt.id, text="good"), Completion(prompt_id=prompt.id, text="bad")
        db.add_all([a, b])
        db.flush()
        _rank(db, project, prompt, lead, [[a.id], [b.id]])
    db.commit()
    for fmt in ("jsonl", "parquet", "hf"):
        spec = export_writer.ExportSpec(project.id, "pairs", fmt)
        export_writer.write_export(engine, spec, tmp_path / fmt, secret="s" * 40)
        ds = _load(fmt, tmp_path / fmt / FILE_OF[fmt])
        assert ds[0]["prompt"] == chat and ds[0]["chosen"] == [{"role": "assistant", "content": "good"}]
        assert ds[1]["prompt"] == [{"role": "user", "content": "q1"}]  # a text prompt becomes one user turn
        rows = load_pairs(tmp_path / fmt / FILE_OF[fmt])
        assert rows[0].prompt == chat and rows[0].chosen == "good"


# ------------------------------------------------------------------------------------------------
# snapshot isolation


def test_a_concurrent_writer_does_not_change_a_postgres_export(db, engine, make_user, make_project, tmp_path) -> None:
    if engine.dialect.name != "postgresql":
        pytest.skip(reason="REPEATABLE READ snapshot: Postgres")
    from app.platform.db import make_session_factory

    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3, overlap=5)
    people = [make_user(db, "annotator") for _ in range(5)]
    prompt = Prompt(project_id=project.id, text="q", text_hash="q")
    db.add(prompt)
    db.flush()
    db.add_all(Completion(prompt_id=prompt.id, text=t) for t in "abc")
    db.flush()
    ids = sorted(db.scalars(select(Completion.id)))
    for who in people[:2]:
        _rank(db, project, prompt, who, [[i] for i in ids])
    db.commit()
    before = db.scalar(select(func.count(Pair.id)))
    other = make_session_factory(engine)
    inserted = []

    def meanwhile(done: int, total: int) -> None:
        # Another connection commits new rankings (and their pairs) between the export's batches.
        with other() as session:
            person = session.merge(people[2 + len(inserted)])
            _rank(session, project, session.get(Prompt, prompt.id), person, [[i] for i in reversed(ids)])
            session.commit()
        inserted.append(done)

    spec = export_writer.ExportSpec(project.id, "pairs", "jsonl")
    result = export_writer.write_export(engine, spec, tmp_path / "snap", secret="s" * 40, batch_size=2,
                                        progress=meanwhile)
    assert len(inserted) == 3  # 6 pairs in batches of 2: new rankings landed three times mid-export
    assert db.scalar(select(func.count(Pair.id))) == before + 9
    rows = (tmp_path / "snap" / "pairs.jsonl").read_text().splitlines()
    assert result.row_count == len(rows) == before == 6
    assert result.snapshot.startswith("postgres ")
    assert "## Counts\n\n- rows: 6\n" in (tmp_path / "snap" / "README.md").read_text()


# ------------------------------------------------------------------------------------------------
# bad input, permissions, deletion


def test_bad_requests_are_4xx_and_write_nothing(db, app, make_user, make_project, token_for, api) -> None:
    lead, engineer, project, people = _seed(db, make_user, make_project)
    stranger_lead = make_user(db, "lead")
    tokens = {"eng": token_for(db, engineer), "ann": token_for(db, people[0]), "stranger": token_for(db, stranger_lead)}
    db.commit()
    exports_root = Path(app.state.settings.data_dir) / "exports"
    on_disk = sorted(exports_root.rglob("*")) if exports_root.exists() else []
    eng = api(tokens["eng"])
    url = f"/api/projects/{project.id}/exports"
    cases = [
        (eng, {"kind": "pairs", "format": "csv"}, 422, "format"),
        (eng, {"kind": "triples", "format": "jsonl"}, 422, "kind"),
        (eng, {"format": "jsonl", "filters": {"colour": "red"}}, 422, "filters.colour"),
        (eng, {"format": "jsonl", "filters": {"source": ["robot"]}}, 422, "filters.source"),
        (eng, {"format": "jsonl", "filters": {"rubric_versions": [7]}}, 422, "filters.rubric_versions"),
        (eng, {"format": "jsonl", "filters": {"min_agreement": 2}}, 422, "filters.min_agreement"),
        (eng, {"format": "jsonl", "filters": {"created_after": "yesterday"}}, 422, "filters.created_after"),
        (eng, {"kind": "prompts", "format": "jsonl", "filters": {"source": "human"}}, 422, "filters.source"),
        (eng, {"kind": "rankings", "format": "jsonl", "aggregation": "aggregated"}, 422, "aggregation"),
        (api(tokens["ann"]), {"format": "jsonl"}, 403, None),
        (api(tokens["stranger"]), {"format": "jsonl"}, 404, None),
    ]
    for client, body, status, field in cases:
        r = client.post(url, json=body)
        assert r.status_code == status, (body, r.text)
        if field:
            assert field in json.dumps(r.json()["detail"]), (field, r.text)
    assert eng.post("/api/projects/999999/exports", json={"format": "jsonl"}).status_code == 404
    assert api(None).get(url).status_code == 401
    db.expire_all()
    assert db.scalar(select(func.count(Export.id))) == 0 and db.scalar(select(func.count(Job.id))) == 0
    assert (sorted(exports_root.rglob("*")) if exports_root.exists() else []) == on_disk


def test_an_empty_selection_is_an_empty_export_that_says_so(db, app, make_user, make_project, token_for, api) -> None:
    _, engineer, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    client = api(token_for(db, engineer))
    db.commit()
    out = _export(client, app, project.id, kind="pairs", format="parquet", filters={"source": ["ai"]})
    assert out["row_count"] == 0 and out["empty"] is True
    job = client.get(f"/api/jobs/{out['job_id']}").json()
    assert "filters select nothing" in job["message"]
    card = client.get(f"/api/exports/{out['id']}/files/README.md").text
    assert "rows: 0  (empty: the filters select nothing)" in card


def test_download_delete_and_tombstone(db, app, make_user, make_project, token_for, api) -> None:
    lead, engineer, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    other_lead = make_user(db, "lead")
    other_project = make_project(db, lead=other_lead)
    outsider = make_user(db, "engineer")
    projects.add_member(db, other_project, other_lead, email=outsider.email, role="engineer")
    tokens = {"eng": token_for(db, engineer), "lead": token_for(db, lead), "out": token_for(db, outsider)}
    db.commit()
    eng, boss, stranger = api(tokens["eng"]), api(tokens["lead"]), api(tokens["out"])
    out = _export(eng, app, project.id, kind="pairs", format="hf")
    name = "pairs/state.json"
    assert eng.get(f"/api/exports/{out['id']}/files/{name}").status_code == 200
    # Only names the Export row lists are served: no traversal, no other files of the data dir.
    for bad in ("../../secret_key", "pairs/..%2f..%2fstate.json", "pairs", "nope.jsonl", "%2e%2e/%2e%2e/secret_key"):
        assert eng.get(f"/api/exports/{out['id']}/files/{bad}").status_code in (404, 422), bad
    # Someone outside the project sees nothing, not even that the export exists.
    assert stranger.get(f"/api/exports/{out['id']}").status_code == 404
    assert stranger.get(f"/api/exports/{out['id']}/files/README.md").status_code == 404
    assert stranger.delete(f"/api/exports/{out['id']}").status_code == 404
    assert eng.delete(f"/api/exports/{out['id']}").status_code == 403  # engineers export; leads delete
    # as a killed attempt that was never retried would have left it
    leftover = Path(db.get(Export, out["id"]).path).parent / f".tmp-{out['id']}-deadbeef"
    db.rollback()
    (leftover / "pairs").mkdir(parents=True)
    gone = boss.delete(f"/api/exports/{out['id']}")
    assert not leftover.exists()
    assert gone.status_code == 200 and gone.json()["status"] == "deleted"
    assert gone.json()["sha256"] == out["sha256"] and gone.json()["files"] == out["files"]  # the tombstone
    assert not Path(db.get(Export, out["id"]).path).exists()
    db.rollback()
    r = eng.get(f"/api/exports/{out['id']}/files/README.md")
    assert r.status_code == 410 and "deleted" in r.text
    listed = eng.get(f"/api/projects/{out['project_id']}/exports").json()
    assert [(e["id"], e["status"]) for e in listed] == [(out["id"], "deleted")]


def test_deleting_while_the_job_is_queued_leaves_nothing(db, app, make_user, make_project, token_for, api) -> None:
    lead, _, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    boss = api(token_for(db, lead))
    db.commit()
    accepted = boss.post(f"/api/projects/{project.id}/exports", json={"format": "jsonl"}).json()
    assert boss.delete(f"/api/exports/{accepted['export_id']}").status_code == 200
    assert boss.get(f"/api/jobs/{accepted['job_id']}").json()["state"] == "cancelled"
    from app.worker import Worker

    assert not Worker(app.state.settings, session_factory=app.state.session_factory).run_one()  # nothing to run
    export = db.get(Export, accepted["export_id"])
    assert export.path is None and export.files == {} and export.deleted_at is not None


# ------------------------------------------------------------------------------------------------
# pages and CLI


def test_exports_page_requests_and_lists_an_export(db, app, make_user, make_project, browser) -> None:
    lead, _, project, _ = _seed(db, make_user, make_project)
    db.commit()
    b = browser()
    b.login(lead.email)
    page = b.get(f"/projects/{project.id}/exports")
    assert page.status_code == 200 and "New export" in page.text and "No exports yet." in page.text
    bad = b.post(f"/projects/{project.id}/exports", {"kind": "pairs", "format": "jsonl", "min_agreement": "lots"})
    assert bad.status_code == 422 and "filters.min_agreement" in bad.text
    assert b.post(f"/projects/{project.id}/exports", {"kind": "pairs", "format": "jsonl"}, csrf=False
                  ).status_code == 403
    ok = b.post(f"/projects/{project.id}/exports", {"kind": "pairs", "format": "parquet", "source": ["human"],
                                                     "split": "train", "flagged": "exclude"})
    assert ok.status_code == 303
    _run_worker(app)
    page = b.get(f"/projects/{project.id}/exports")
    export = db.scalar(select(Export))
    assert export.filters == {"source": ["human"], "split": "train", "flagged": "exclude", "aggregation": "raw",
                              "conflicts": "keep"}
    assert f'/api/v1/exports/{export.id}/files/pairs.parquet' in page.text and "ready" in page.text
    assert "(empty: the filters select nothing)" in page.text  # nothing was ranked yet
    # Filters for people, not a Python repr; the sha256 cell holds the hash only, the snapshot sits with the date.
    assert "<dt>Sources</dt><dd>human</dd>" in page.text and "<dt>Flagged items</dt><dd>exclude</dd>" in page.text
    assert "source=[" not in page.text and "[&#39;human&#39;]" not in page.text
    sha_cell = re.search(r'<td class="sha">(.*?)</td>', page.text, re.S).group(1)
    assert export.sha256[:12] in sha_cell and "snapshot" not in sha_cell and "sqlite" not in sha_cell
    assert re.search(r'class="muted snapshot"[^>]*>read in (one SQLite read transaction|Postgres snapshot \S+)<',
                     page.text)


def test_cli_export_writes_the_same_bytes_as_the_job(db, app, make_user, make_project, token_for, api, tmp_path,
                                                     monkeypatch, database_url) -> None:
    from typer.testing import CliRunner

    from app.cli import cli

    _, engineer, project, people = _seed(db, make_user, make_project)
    _rank_everything(db, api, token_for, project, people)
    client = api(token_for(db, engineer))
    db.commit()
    via_job = _export(client, app, project.id, kind="pairs", format="parquet", filters={"split": "train"})
    settings = app.state.settings
    monkeypatch.setenv("PREFLAB_DATABASE_URL", database_url)
    monkeypatch.setenv("PREFLAB_SECRET_KEY", settings.resolved_secret())
    monkeypatch.setenv("PREFLAB_DATA_DIR", str(settings.data_dir))
    result = CliRunner().invoke(cli, ["export", str(project.id), "--kind", "pairs", "--format", "parquet",
                                      "--out", str(tmp_path / "cli"), "--filter", "split=train"])
    assert result.exit_code == 0, result.output
    assert via_job["sha256"] in result.output
    assert hashlib.sha256((tmp_path / "cli" / "pairs.parquet").read_bytes()).hexdigest() == \
        via_job["files"]["pairs.parquet"]
    bad = CliRunner().invoke(cli, ["export", str(project.id), "--format", "parquet", "--out", str(tmp_path / "x"),
                                   "--filter", "colour=red"])
    assert bad.exit_code == 1 and "filters.colour" in bad.output and not (tmp_path / "x").exists()


# ------------------------------------------------------------------------------------------------
# TRL


def test_trl_reward_trainer_runs_on_the_exported_directory(db, engine, make_user, make_project, tmp_path) -> None:
    pytest.importorskip("trl")
    import datasets
    import torch
    from transformers import GPT2Config, GPT2ForSequenceClassification
    from trl import RewardConfig, RewardTrainer

    from tests.training.tiny import char_tokenizer

    if engine.dialect.name != "sqlite":
        pytest.skip(reason="one backend is enough for the trainer")
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3)
    for i in range(8):
        prompt = Prompt(project_id=project.id, text=f"{i}+{i}=", text_hash=f"q{i}", split="heldout" if i == 7 else "train")
        db.add(prompt)
        db.flush()
        cs = [Completion(prompt_id=prompt.id, text=t) for t in (str(2 * i), str(2 * i + 1), "x")]
        db.add_all(cs)
        db.flush()
        _rank(db, project, prompt, lead, [[c.id] for c in cs])
    db.commit()
    export_writer.write_export(engine, export_writer.ExportSpec(project.id, "pairs", "hf"), tmp_path / "e",
                               secret="s" * 40)
    dataset = datasets.load_from_disk(str(tmp_path / "e" / "pairs"))  # no conversion, extra columns and all
    tokenizer = char_tokenizer()
    torch.manual_seed(0)
    model = GPT2ForSequenceClassification(GPT2Config(vocab_size=len(tokenizer), n_positions=32, n_embd=32,
                                                     n_layer=1, n_head=2, num_labels=1,
                                                     pad_token_id=tokenizer.pad_token_id))
    before = [p.detach().clone() for p in model.parameters()]
    args = RewardConfig(output_dir=str(tmp_path / "trl"), max_steps=3, per_device_train_batch_size=4,
                        learning_rate=1e-3, report_to="none", save_strategy="no", logging_steps=1,
                        use_cpu=True, max_length=32, disable_dropout=True)
    trainer = RewardTrainer(model=model, args=args, train_dataset=dataset.filter(lambda r: r["split"] == "train"),
                            processing_class=tokenizer)
    trainer.train()
    assert trainer.state.global_step == 3
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


def test_pseudonyms_are_stable_per_project_and_keyed() -> None:
    a = export_writer.annotator_pseudonym("k" * 40, 1, 7)
    assert a == export_writer.annotator_pseudonym("k" * 40, 1, 7) and a.startswith("a-") and len(a) == 18
    assert a != export_writer.annotator_pseudonym("k" * 40, 2, 7)  # another project: unlinkable
    assert a != export_writer.annotator_pseudonym("z" * 40, 1, 7)  # another secret: unguessable without it


def test_a_stopped_export_leaves_no_files(db, engine, make_user, make_project, tmp_path) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, lead=lead, k=3)
    prompt = Prompt(project_id=project.id, text="q", text_hash="q")
    db.add(prompt)
    db.flush()
    cs = [Completion(prompt_id=prompt.id, text=t) for t in "abc"]
    db.add_all(cs)
    db.flush()
    _rank(db, project, prompt, lead, [[c.id] for c in cs])
    db.commit()

    def stop(done: int, total: int) -> None:
        raise RuntimeError("cancelled")

    with pytest.raises(RuntimeError):
        export_writer.write_export(engine, export_writer.ExportSpec(project.id, "pairs", "parquet"),
                                   tmp_path / "x" / "1", secret="s" * 40, batch_size=1, progress=stop)
    assert list((tmp_path / "x").iterdir()) == []


def test_sqlite_export_does_not_block_annotators(db, engine, make_user, make_project, tmp_path) -> None:
    """The snapshot is a deferred read on SQLite: a writer commits while the export is mid-way."""
    if engine.dialect.name != "sqlite":
        pytest.skip(reason="SQLite locking")
    from app.platform.db import make_session_factory

    lead = make_user(db, "lead")
    ann = make_user(db, "annotator")
    project = make_project(db, lead=lead, k=3)
    prompt = Prompt(project_id=project.id, text="q", text_hash="q")
    db.add(prompt)
    db.flush()
    cs = [Completion(prompt_id=prompt.id, text=t) for t in "abc"]
    db.add_all(cs)
    db.flush()
    _rank(db, project, prompt, lead, [[c.id] for c in cs])
    db.commit()
    other = make_session_factory(engine)
    wrote = threading.Event()

    def meanwhile(done: int, total: int) -> None:
        if not wrote.is_set():
            with other() as session:
                _rank(session, project, session.get(Prompt, prompt.id), session.merge(ann),
                      [[c.id] for c in reversed(cs)])
                session.commit()
            wrote.set()

    result = export_writer.write_export(engine, export_writer.ExportSpec(project.id, "pairs", "jsonl"),
                                        tmp_path / "s", secret="s" * 40, batch_size=1, progress=meanwhile)
    assert wrote.is_set() and result.row_count == 3


@pytest.mark.parametrize("kind", ["pairs", "rankings", "prompts", "sft"])
@pytest.mark.parametrize("conversational", [False, True])
def test_embedded_features_match_what_datasets_derives(kind: str, conversational: bool) -> None:
    from datasets import Features

    for aggregation in ("raw", "aggregated") if kind == "pairs" else ("raw",):
        schema = export_writer.schema_for(kind, aggregation, conversational)
        assert export_writer.hf_features(schema) == Features.from_arrow_schema(schema).to_dict()


def test_jsonl_lines_are_exactly_json_dumps(tmp_path) -> None:
    import pyarrow as pa

    schema = pa.schema([("i", pa.int64()), ("f", pa.float64()), ("s", pa.string()), ("m", export_writer.MESSAGES),
                        ("l", pa.list_(pa.int64()))])
    msgs = [{"role": "user", "content": 'quote " backslash \\ tab \t é ✓ \u2028'}]
    columns = {"i": [1, None, -3], "f": [0.1, 1 / 3, None], "s": ["x\n\"y\"", None, "x\n\"y\""], "m": [msgs, msgs, None],
               "l": [[1, 2], [], None]}
    sink = JsonlSink(tmp_path, "t", schema)
    sink.write(pa.RecordBatch.from_pydict(columns, schema=schema))
    sink.close()
    rows = [dict(zip(columns, values, strict=True)) for values in zip(*columns.values(), strict=True)]
    expected = "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows)
    assert (tmp_path / "t.jsonl").read_text(encoding="utf-8") == expected
