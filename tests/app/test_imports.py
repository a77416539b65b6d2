"""Importing into a real project on SQLite and Postgres: what gets written, duplicates, and all-or-nothing."""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from sqlalchemy import func, select, text
from sqlalchemy.orm import Session

from app.imports.service import ImportRejected, import_file, prompt_text_hash
from app.models import AuditEvent, Base, Completion, Pair, Project, Prompt, Ranking

DATA = Path(__file__).parent / "data" / "imports"


def jsonl(*rows: Any) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def parquet(table: dict[str, list]) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(table), sink)
    return sink.getvalue()


def table_counts(db: Session) -> dict[str, int]:
    return {t.name: db.scalar(select(func.count()).select_from(t)) or 0 for t in Base.metadata.sorted_tables}


def rejection(call: Callable[[], Any]) -> list[tuple[int, str, str]]:
    with pytest.raises(ImportRejected) as info:
        call()
    return [(e.line, e.field, e.message) for e in info.value.errors]




# --- prompt rows ------------------------------------------------------------------------------


def test_jsonl_prompts_with_completions_are_written_with_their_fields(db: Session, project: Project, lead: Any):
    data = jsonl(
        {"prompt": " What is 2+2? ", "completions": ["4", "5", "22"], "reference": "4", "split": "heldout",
         "metadata": {"source": "unit"}},
        {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]},
    )
    result = import_file(db, project, "prompts.jsonl", data, actor=lead)
    db.commit()
    assert (result.prompts, result.completions, result.pairs, result.skipped_duplicates) == (2, 3, 0, [])

    plain, chat = db.scalars(select(Prompt).order_by(Prompt.id)).all()
    assert (plain.project_id, plain.text, plain.split, plain.reference, plain.meta) == (
        project.id, "What is 2+2?", "heldout", "4", {"source": "unit"})
    assert plain.text_hash == prompt_text_hash(text="What is 2+2?")
    assert [(c.text, c.source) for c in plain.completions] == [("4", "imported"), ("5", "imported"), ("22", "imported")]
    assert chat.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert (chat.text, chat.split, chat.completions) == ("system: Be brief.\nuser: Hi", "train", [])
    # A plain prompt has SQL NULL messages, not the JSON value null.
    assert db.scalar(select(func.count()).select_from(Prompt).where(Prompt.messages.is_(None))) == 1

    (event,) = db.scalars(select(AuditEvent).where(AuditEvent.action == "import")).all()
    assert (event.actor_id, event.project_id) == (lead.id, project.id)
    assert event.data["sha256"] == hashlib.sha256(data).hexdigest()
    assert (event.data["filename"], event.data["prompts"], event.data["completions"]) == ("prompts.jsonl", 2, 3)


def test_csv_prompts(db: Session, project: Project, lead: Any):
    data = b'prompt,completion_1,completion_2,split\nFirst?,a,b,train\n"Second,\nwith a newline?",c,,heldout\n'
    result = import_file(db, project, "p.csv", data, actor=lead)
    assert (result.prompts, result.completions, result.pairs) == (2, 3, 0)
    texts = db.execute(select(Prompt.text, Prompt.split).order_by(Prompt.id)).all()
    assert texts == [("First?", "train"), ("Second,\nwith a newline?", "heldout")]


def test_parquet_prompts(db: Session, project: Project, lead: Any):
    data = parquet({"prompt": ["P1", "P2"], "completions": [["a", "b", "c", "d"], ["e"]]})
    result = import_file(db, project, "p.parquet", data, actor=None)
    assert (result.prompts, result.completions) == (2, 5)
    assert db.scalar(select(AuditEvent.actor_id).where(AuditEvent.action == "import")) is None


def test_many_rows_keep_each_prompt_with_its_own_completions(db: Session, project: Project, lead: Any):
    # More rows than one IN (...) chunk and one insert batch: ids must still line up with their rows.
    rows = [{"prompt": f"question {i}", "completions": [f"answer {i}a", f"answer {i}b"]} for i in range(2500)]
    rows[7]["messages"] = [{"role": "user", "content": rows[7].pop("prompt")}]
    result = import_file(db, project, "many.jsonl", jsonl(*rows), actor=lead)
    assert (result.prompts, result.completions) == (2500, 5000)
    mismatched = db.scalar(
        select(func.count()).select_from(Completion).join(Prompt).where(
            Completion.text.not_like(func.replace(Prompt.text, "question", "answer") + "%")
            & Completion.text.not_like(func.replace(Prompt.text, "user: question", "answer") + "%")
        )
    )
    assert mismatched == 0


def test_awkward_text_round_trips_exactly(db: Session, project: Project, lead: Any):
    # Postgres loads through COPY, whose text format gives tabs, newlines, backslashes and \\N meaning.
    awkward = 'tab\there\nnewline \\N back\\slash "quotes" \r\n é 中文 🙂 \\.'
    data = jsonl({"prompt": awkward, "completions": [awkward, awkward + "!"], "reference": awkward,
                  "metadata": {"note": awkward, "nested": {"list": [1, 2.5, None, True]}}})
    import_file(db, project, "p.jsonl", data, actor=lead)
    db.commit()
    db.expire_all()
    prompt = db.scalar(select(Prompt))
    assert prompt is not None
    assert (prompt.text, prompt.reference) == (awkward.strip(), awkward)
    assert prompt.meta == {"note": awkward, "nested": {"list": [1, 2.5, None, True]}}
    assert [c.text for c in prompt.completions] == [awkward, awkward + "!"]
    assert prompt.completions[0].generator_params == {} and prompt.completions[0].seed is None


def test_more_completions_than_k_is_refused(db: Session, project: Project, lead: Any):
    data = jsonl({"prompt": "ok", "completions": ["a"]}, {"prompt": "too many", "completions": list("abcde")})
    assert rejection(lambda: import_file(db, project, "p.jsonl", data, actor=lead)) == [
        (2, "completions", "5 completions, but this project ranks 4 per prompt; remove some or raise completions_per_prompt"),
    ]


# --- duplicates -------------------------------------------------------------------------------


def test_duplicate_prompts_are_reported_with_both_lines_and_the_existing_id(db: Session, project: Project, lead: Any):
    import_file(db, project, "first.jsonl", jsonl({"prompt": "old", "completions": ["a"]}), actor=lead)
    db.commit()
    existing_id = db.scalar(select(Prompt.id))
    before = table_counts(db)
    data = jsonl({"prompt": "new"}, {"prompt": "  old  "}, {"prompt": "new", "completions": ["b"]})
    assert rejection(lambda: import_file(db, project, "second.jsonl", data, actor=lead)) == [
        (2, "prompt", f"prompt already in the project (prompt id {existing_id}); import with on_duplicate=skip to leave duplicates out"),
        (3, "prompt", "same prompt as line 1; import with on_duplicate=skip to leave duplicates out"),
    ]
    db.commit()
    assert table_counts(db) == before


def test_duplicate_prompts_can_be_skipped(db: Session, project: Project, lead: Any):
    import_file(db, project, "first.jsonl", jsonl({"prompt": "old", "completions": ["a"]}), actor=lead)
    data = jsonl({"prompt": "new"}, {"prompt": "old", "completions": ["x"]}, {"prompt": "new"}, {"prompt": "newer"})
    result = import_file(db, project, "second.jsonl", data, actor=lead, on_duplicate="skip")
    assert (result.prompts, result.completions, result.skipped_duplicates) == (2, 0, [2, 3])
    assert sorted(db.scalars(select(Prompt.text))) == ["new", "newer", "old"]
    assert db.scalars(select(Completion.text)).all() == ["a"]


def test_the_same_prompt_in_another_project_is_not_a_duplicate(db: Session, project: Project, lead: Any,
                                                              make_project: Callable[..., Any]):
    other = make_project(db, k=2, lead=lead)
    import_file(db, project, "a.jsonl", jsonl({"prompt": "shared"}), actor=lead)
    assert import_file(db, other, "a.jsonl", jsonl({"prompt": "shared"}), actor=lead).prompts == 1


# --- pair rows --------------------------------------------------------------------------------


def test_hh_rlhf_sample_becomes_imported_rankings_and_pairs(db: Session, project: Project, lead: Any):
    data = (DATA / "hh_sample.jsonl").read_bytes()
    result = import_file(db, project, "hh_sample.jsonl", data, actor=lead)
    db.commit()
    assert (result.prompts, result.completions, result.pairs, result.kind) == (20, 40, 20, "pairs")

    first = json.loads(data.splitlines()[0])
    prompt = db.scalar(select(Prompt).order_by(Prompt.id).limit(1))
    assert prompt is not None and first["chosen"].startswith("\n\n" + prompt.text)
    assert prompt.text.endswith("\n\nAssistant:") and prompt.split == "train"

    ranking = db.scalar(select(Ranking).where(Ranking.prompt_id == prompt.id))
    assert ranking is not None
    assert (ranking.source, ranking.annotator_id, ranking.judge_run_id) == ("imported", None, None)
    assert (ranking.round, ranking.rubric_id) == (project.current_round, project.current_rubric_id)
    (pair,) = ranking.pairs
    assert ranking.tiers == [[pair.chosen_id], [pair.rejected_id]]
    assert (pair.prompt_id, pair.source, pair.margin, pair.p, pair.weight) == (prompt.id, "imported", 1, 1.0, 1.0)
    chosen, rejected = db.get(Completion, pair.chosen_id), db.get(Completion, pair.rejected_id)
    assert chosen is not None and rejected is not None
    assert first["chosen"].endswith(chosen.text) and first["rejected"].endswith(rejected.text)
    assert (chosen.prompt_id, chosen.source) == (prompt.id, "imported")
    assert db.scalar(select(func.count()).select_from(Ranking)) == 20


def test_pairs_sharing_a_prompt_share_it_and_reuse_identical_completions(
    db: Session, make_project: Callable[..., Any], lead: Any
):
    # K = 2, but pairs are labels, not a ranking queue: one prompt may gather more distinct responses.
    small = make_project(db, k=2, lead=lead)
    data = jsonl(
        {"prompt": "Q", "chosen": "a", "rejected": "b", "p": 0.8},
        {"prompt": "Q ", "chosen": "a", "rejected": "c", "margin": 2, "weight": 0.5},
        {"prompt": "Q", "chosen": "c", "rejected": "b", "split": "heldout"},
        {"prompt": "R", "chosen": "a", "rejected": "b"},
    )
    result = import_file(db, small, "pairs.jsonl", data, actor=lead)
    assert (result.prompts, result.completions, result.pairs) == (2, 5, 4)
    q = db.scalar(select(Prompt).where(Prompt.text == "Q"))
    assert q is not None and q.split == "heldout"
    assert sorted(c.text for c in q.completions) == ["a", "b", "c"]
    by_text = {c.text: c.id for c in q.completions}
    pairs = db.execute(select(Pair.chosen_id, Pair.rejected_id, Pair.p, Pair.margin, Pair.weight)
                       .where(Pair.prompt_id == q.id).order_by(Pair.id)).all()
    assert pairs == [(by_text["a"], by_text["b"], 0.8, 1, 1.0), (by_text["a"], by_text["c"], 1.0, 2, 0.5),
                     (by_text["c"], by_text["b"], 1.0, 1, 1.0)]

    # A later file attaches to the existing prompt and its existing completions.
    again = import_file(db, small, "more.jsonl", jsonl({"prompt": "Q", "chosen": "d", "rejected": "a"}), actor=lead)
    assert (again.prompts, again.completions, again.pairs) == (0, 1, 1)
    assert db.scalar(select(func.count()).select_from(Completion).where(Completion.prompt_id == q.id)) == 4


def test_pairs_attach_to_a_prompt_imported_with_completions(db: Session, project: Project, lead: Any):
    import_file(db, project, "p.jsonl", jsonl({"prompt": "Q", "completions": ["a", "b"]}), actor=lead)
    result = import_file(db, project, "pairs.csv", b"prompt,chosen,rejected\nQ,b,a\n", actor=lead)
    assert (result.prompts, result.completions, result.pairs) == (0, 0, 1)


def test_reimporting_the_same_pairs_is_a_duplicate(db: Session, project: Project, lead: Any):
    data = (DATA / "hh_sample.jsonl").read_bytes()
    import_file(db, project, "hh.jsonl", data, actor=lead)
    db.commit()
    before = table_counts(db)
    errors = rejection(lambda: import_file(db, project, "hh.jsonl", data, actor=lead))
    assert len(errors) == 20 and errors[0][:2] == (1, "chosen")
    assert errors[0][2].startswith("this pair was already imported (prompt id ")
    db.commit()
    assert table_counts(db) == before

    skipped = import_file(db, project, "hh.jsonl", data, actor=lead, on_duplicate="skip")
    assert (skipped.prompts, skipped.completions, skipped.pairs, skipped.skipped_duplicates) == (0, 0, 0, list(range(1, 21)))


def test_repeated_pair_in_one_file_and_conflicting_splits(db: Session, project: Project, lead: Any):
    import_file(db, project, "p.jsonl", jsonl({"prompt": "Old", "split": "heldout"}), actor=lead)
    data = jsonl(
        {"prompt": "Q", "chosen": "a", "rejected": "b", "split": "train"},
        {"prompt": "Q", "chosen": "a", "rejected": "b"},
        {"prompt": "Q", "chosen": "b", "rejected": "c", "split": "heldout"},
        {"prompt": "Old", "chosen": "a", "rejected": "b", "split": "train"},
    )
    assert rejection(lambda: import_file(db, project, "pairs.jsonl", data, actor=lead)) == [
        (2, "chosen", "same prompt, chosen and rejected as line 1; import with on_duplicate=skip to leave duplicates out"),
        (3, "split", "line 1 put the same prompt in split 'train'"),
        (4, "split", f"the prompt is already in the project (prompt id {db.scalar(select(Prompt.id))}) in split 'heldout', not 'train'"),
    ]


# --- all or nothing ---------------------------------------------------------------------------

BAD_FILES = {
    "bad JSON line": ("p.jsonl", jsonl({"prompt": "a"}, '{"prompt": "b"', {"prompt": "c"}), (2, "json")),
    "missing field": ("p.jsonl", jsonl({"prompt": "a"}, {"completions": ["x"]}), (2, "prompt")),
    "wrong type": ("p.jsonl", jsonl({"prompt": "a", "completions": ["x", 2]}), (1, "completions[1]")),
    "bad split": ("p.csv", b"prompt,split\na,train\nb,test\n", (3, "split")),
    "too many rows": ("p.jsonl", jsonl(*[{"prompt": str(i)} for i in range(6)]), (6, "file")),
    "mixed kinds": ("p.jsonl", jsonl({"prompt": "a"}, {"chosen": "x", "rejected": "y"}), (2, "chosen")),
    "wrong extension": ("p.csv", jsonl({"prompt": "a"}), (0, "file")),
    "more than K": ("p.parquet", parquet({"prompt": ["a"], "completions": [list("abcdefg")]}), (1, "completions")),
    "duplicate prompt": ("p.jsonl", jsonl({"prompt": "a"}, {"prompt": "b"}, {"prompt": "a"}), (3, "prompt")),
    "completions identical whitespace aside": ("p.jsonl", jsonl({"prompt": "a", "completions": ["x y", "x  y\n"]}),
                                               (1, "completions[1]")),
    "completion columns identical whitespace aside": ("p.csv", b'prompt,completion_1,completion_2\nq,"x\ny",x y\n',
                                                      (2, "completion_2")),
    "bad pair": ("pairs.jsonl", jsonl({"chosen": "same", "rejected": "same", "prompt": "q"}), (1, "rejected")),
    "no HH prefix": ("hh.jsonl", jsonl({"chosen": "\n\nHuman: a\n\nAssistant: x", "rejected": "b"}), (1, "prompt")),
}


@pytest.mark.parametrize("case", list(BAD_FILES))
def test_a_bad_file_changes_nothing_even_if_the_caller_commits(db: Session, project: Project, lead: Any, case: str):
    import_file(db, project, "base.jsonl", jsonl({"prompt": "already here", "completions": ["x"]}), actor=lead)
    db.commit()
    before = table_counts(db)
    filename, data, (line, field) = BAD_FILES[case]
    errors = rejection(lambda: import_file(db, project, filename, data, actor=lead, max_rows=5))
    assert errors[0][:2] == (line, field)
    db.commit()  # a careless caller: the service must not have written anything to commit
    assert table_counts(db) == before
    assert db.execute(text("SELECT count(*) FROM audit_events WHERE action = 'import'")).scalar() == 1


def test_unknown_on_duplicate_value_is_a_programming_error(db: Session, project: Project, lead: Any):
    with pytest.raises(ValueError, match="on_duplicate"):
        import_file(db, project, "p.jsonl", jsonl({"prompt": "a"}), actor=lead, on_duplicate="merge")  # type: ignore[arg-type]


# --- the API contract -------------------------------------------------------------------------


def test_api_import_answers_201_with_counts_and_422_with_line_field_message(
    db: Session, app: Any, api: Callable[..., Any], token_for: Callable[..., str], project: Project, lead: Any
):
    client = api(token_for(db, lead))
    db.commit()
    url = f"/api/projects/{project.id}/imports"
    good = jsonl({"prompt": "Q1", "completions": ["a", "b"]}, {"prompt": "Q2"})
    response = client.post(url, files={"file": ("prompts.jsonl", good, "application/x-ndjson")})
    assert response.status_code == 201, response.text
    assert {k: response.json()[k] for k in ("prompts", "completions", "pairs")} == {"prompts": 2, "completions": 2, "pairs": 0}

    before = table_counts(db)
    db.rollback()  # end the read: on SQLite every transaction holds the write lock the request needs
    bad = jsonl({"prompt": "Q3"}, {"prompt": "Q4", "completions": ["x", 2]})
    response = client.post(url, files={"file": ("prompts.jsonl", bad, "application/x-ndjson")})
    assert response.status_code == 422
    assert response.json() == {"detail": [{"line": 2, "field": "completions[1]", "message": "must be a string, got number"}]}
    assert table_counts(db) == before
    db.rollback()

    response = client.post(url, files={"file": ("prompts.jsonl", good, "application/x-ndjson")})
    assert response.status_code == 422
    assert [(d["line"], d["field"]) for d in response.json()["detail"]] == [(1, "prompt"), (2, "prompt")]
    response = client.post(url + "?on_duplicate=skip", files={"file": ("prompts.jsonl", good, "application/x-ndjson")})
    assert response.status_code == 201 and response.json()["skipped_duplicates"] == [1, 2]
