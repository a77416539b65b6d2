"""Reading import files without a database: each format, and each bad row named by its line and field."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.imports.formats import MAX_ERRORS, MAX_TEXT_CHARS
from app.imports.service import (
    ImportRejected,
    RowError,
    parse_import,
    prompt_text_hash,
    render_messages,
)

DATA = Path(__file__).parent / "data" / "imports"


def jsonl(*rows: object) -> bytes:
    return "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows).encode()


def parquet(table: dict[str, list], schema: pa.Schema | None = None) -> bytes:
    sink = io.BytesIO()
    pq.write_table(pa.table(table, schema=schema), sink)
    return sink.getvalue()


def rejected(filename: str, data: bytes, **kw: object) -> list[tuple[int, str, str]]:
    with pytest.raises(ImportRejected) as info:
        parse_import(filename, data, **kw)  # type: ignore[arg-type]
    return [(e.line, e.field, e.message) for e in info.value.errors]


def only_error(filename: str, data: bytes, **kw: object) -> tuple[int, str, str]:
    errors = rejected(filename, data, **kw)
    assert len(errors) == 1, errors
    return errors[0]


# --- the canonical prompt form ----------------------------------------------------------------


def test_prompt_hash_ignores_surrounding_whitespace_but_not_inner_text():
    assert prompt_text_hash(text="  What is 2+2?\n") == prompt_text_hash(text="What is 2+2?")
    assert prompt_text_hash(text="What is 2+2?") != prompt_text_hash(text="What is 2+3?")


def test_prompt_hash_of_a_chat_differs_from_its_rendered_text():
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert render_messages(chat) == "system: Be brief.\nuser: Hi"
    assert prompt_text_hash(messages=chat) != prompt_text_hash(text=render_messages(chat))
    assert prompt_text_hash(messages=chat) == prompt_text_hash(messages=[dict(reversed(m.items())) for m in chat])
    with pytest.raises(ValueError):
        prompt_text_hash()


# --- happy paths ------------------------------------------------------------------------------


def test_jsonl_prompt_rows_with_every_optional_field():
    data = jsonl(
        {"prompt": "  Add 2 and 2.  ", "completions": ["4", "5"], "reference": "4", "split": "heldout",
         "metadata": {"source": "gsm8k", "tags": ["math"]}},
        "",
        {"messages": [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"}],
         "completions": []},
    )
    parsed = parse_import("prompts.jsonl", data)
    assert (parsed.format, parsed.kind, parsed.rows) == ("jsonl", "prompts", 2)
    first, second = parsed.prompts
    assert (first.line, first.text, first.completions, first.reference, first.split) == (1, "Add 2 and 2.", ["4", "5"], "4", "heldout")
    assert first.metadata == {"source": "gsm8k", "tags": ["math"]}
    assert first.text_hash == prompt_text_hash(text="Add 2 and 2.")
    # line 2 is blank and skipped; line numbers stay physical
    assert (second.line, second.split, second.completions, second.metadata) == (3, "train", [], {})
    assert second.text == "system: Be kind.\nuser: Hello"
    assert second.messages == [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hello"}]


def test_utf8_bom_and_crlf_line_endings_are_tolerated():
    data = b"\xef\xbb\xbf" + jsonl({"prompt": "caf\u00e9", "completions": ["a"]}).replace(b"\n", b"\r\n")
    parsed = parse_import("p.ndjson", data)
    assert parsed.prompts[0].text == "café"


def test_pairs_with_explicit_prompt_and_soft_labels():
    data = jsonl(
        {"prompt": "Q", "chosen": "good", "rejected": "bad", "p": 0.75, "margin": 2, "weight": 0.5, "split": "heldout"},
        {"prompt": "Q", "chosen": "better", "rejected": "bad"},
    )
    parsed = parse_import("pairs.json", data)
    assert parsed.kind == "pairs"
    first, second = parsed.pairs
    assert (first.text, first.chosen, first.rejected, first.p, first.margin, first.weight, first.split) == (
        "Q", "good", "bad", 0.75, 2, 0.5, "heldout")
    assert (second.p, second.margin, second.weight, second.split) == (1.0, 1, 1.0, None)
    assert first.text_hash == second.text_hash


def test_hh_rlhf_pairs_take_the_prompt_from_the_shared_prefix():
    parsed = parse_import("hh_sample.jsonl", (DATA / "hh_sample.jsonl").read_bytes())
    assert parsed.kind == "pairs" and len(parsed.pairs) == 20
    first = parsed.pairs[0]
    assert first.text.startswith("Human: what are some pranks with a pen i can do?")
    assert first.text.endswith("\n\nHuman: okay some of these do not have anything to do with pens\n\nAssistant:")
    assert first.chosen.startswith("No, sorry!  All of these involve a pen")
    assert first.rejected.startswith("There are lots of funny things you can do with pens")


def test_hh_split_uses_the_last_assistant_turn_inside_the_shared_prefix():
    chosen = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: Why did the chicken"
    rejected = "\n\nHuman: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant: No."
    (pair,) = parse_import("hh.jsonl", jsonl({"chosen": chosen, "rejected": rejected})).pairs
    assert pair.text == "Human: hi\n\nAssistant: hello\n\nHuman: joke?\n\nAssistant:"
    assert (pair.chosen, pair.rejected) == ("Why did the chicken", "No.")


def test_hh_empty_response_is_a_real_label():
    # HH-RLHF harmless-base test line 87: the empty reply was preferred to one that leaks an address.
    data = jsonl({"chosen": "\n\nHuman: address?\n\nAssistant: ", "rejected": "\n\nHuman: address?\n\nAssistant: 12 Elm St"})
    (pair,) = parse_import("hh.jsonl", data).pairs
    assert (pair.text, pair.chosen, pair.rejected) == ("Human: address?\n\nAssistant:", "", "12 Elm St")


def test_csv_prompt_rows_with_a_completions_json_column():
    data = (
        b"prompt,completions,reference,split,metadata\n"
        b'"two\nlines","[""a"", ""b""]",ref,heldout,"{""k"": 1}"\n'
        b"\n"
        b"plain,,,,\n"
    )
    parsed = parse_import("p.csv", data)
    first, second = parsed.prompts
    assert (first.line, first.text, first.completions, first.reference, first.split, first.metadata) == (
        2, "two\nlines", ["a", "b"], "ref", "heldout", {"k": 1})
    # the record on lines 2-3 ends at line 3, line 4 is blank, so the next record starts on line 5
    assert (second.line, second.completions, second.reference, second.split) == (5, [], None, "train")


def test_csv_numbered_completion_columns_in_numeric_order():
    data = b"completion_10,prompt,completion_2,completion_1\nten,Q,two,one\n"
    (row,) = parse_import("p.csv", data).prompts
    assert row.completions == ["one", "two", "ten"]


def test_csv_pairs_with_an_empty_prompt_cell_use_the_hh_layout():
    data = (
        b"prompt,chosen,rejected,p\n"
        b'Q,yes,no,0.9\n'
        b',"\n\nHuman: hi\n\nAssistant: hey","\n\nHuman: hi\n\nAssistant: go away",\n'
    )
    first, second = parse_import("pairs.csv", data).pairs
    assert (first.text, first.chosen, first.rejected, first.p) == ("Q", "yes", "no", 0.9)
    assert (second.line, second.text, second.chosen, second.rejected, second.p) == (
        3, "Human: hi\n\nAssistant:", "hey", "go away", 1.0)


def test_parquet_prompt_rows_with_list_and_struct_columns():
    data = parquet({
        "prompt": ["Q1", None],
        "messages": [None, [{"role": "user", "content": "Q2"}]],
        "completions": [["a", "b"], []],
        "split": ["train", "heldout"],
        "metadata": ['{"k": 1}', None],
    })
    parsed = parse_import("p.parquet", data)
    assert (parsed.format, parsed.kind) == ("parquet", "prompts")
    first, second = parsed.prompts
    assert (first.line, first.text, first.completions, first.metadata) == (1, "Q1", ["a", "b"], {"k": 1})
    assert (second.line, second.messages, second.split) == (2, [{"role": "user", "content": "Q2"}], "heldout")


def test_parquet_pairs_and_map_metadata():
    pairs = parse_import("pairs.pq", parquet({"prompt": ["Q"], "chosen": ["a"], "rejected": ["b"], "margin": [3]}))
    assert (pairs.kind, pairs.pairs[0].margin) == ("pairs", 3)
    schema = pa.schema([("prompt", pa.string()), ("metadata", pa.map_(pa.string(), pa.int64()))])
    rows = parse_import("m.parquet", parquet({"prompt": ["Q"], "metadata": [[("a", 1)]]}, schema))
    assert rows.prompts[0].metadata == {"a": 1}


# --- format detection -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("filename", "data", "message"),
    [
        ("p.csv", b'{"prompt": "x"}\n', "the file is named .csv but its content looks like JSON Lines"),
        ("p.jsonl", b"prompt,completions\nx,\n", "the file is named .jsonl but its content looks like CSV"),
        ("p.jsonl", b"PAR1\x00\x00", "the file is named .jsonl but its content looks like Parquet"),
        ("p.parquet", b'{"prompt": "x"}\n', "the file is named .parquet but its content looks like JSON Lines"),
        ("p.txt", b'{"prompt": "x"}\n', "unsupported file type '.txt'"),
        ("p", b'{"prompt": "x"}\n', "unsupported file type 'p'"),
        ("p.jsonl", b"  \n\n", "the file is empty"),
        ("p.csv", b"PK\x03\x04rest", "ZIP archive"),
        ("p.jsonl", b"\x1f\x8b\x08rest", "gzip-compressed"),
    ],
)
def test_wrong_or_unknown_format_is_refused_for_the_whole_file(filename: str, data: bytes, message: str):
    line, field, text = only_error(filename, data)
    assert (line, field) == (0, "file")
    assert message in text


def test_a_json_array_file_is_explained():
    line, field, message = only_error("p.json", b'[{"prompt": "x"}]')
    assert (line, field) == (1, "json") and "JSON Lines" in message and "jq" in message


def test_invalid_utf8_names_the_line():
    assert only_error("p.jsonl", jsonl({"prompt": "ok"}) + b'{"prompt": "caf\xe9"}\n') == (
        2, "encoding", "not valid UTF-8 (byte 0xe9); save the file as UTF-8")
    line, field, _ = only_error("p.jsonl", b"\xff\xfe{\x00")
    assert (line, field) == (1, "encoding")


def test_corrupt_parquet_is_refused():
    line, field, message = only_error("p.parquet", b"PAR1 this is not really parquet PAR1")
    assert (line, field) == (0, "file") and message.startswith("not a readable Parquet file")


# --- bad rows: JSONL --------------------------------------------------------------------------


def test_bad_json_line_names_the_line_and_column():
    data = jsonl({"prompt": "ok"}, '{"prompt": "x",}', {"prompt": "also ok"})
    assert only_error("p.jsonl", data) == (2, "json", "invalid JSON: Expecting property name enclosed in double quotes (column 16)")


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ({"completions": ["a"]}, "prompt", "missing; give prompt (text) or messages (a chat)"),
        ({"prompt": None}, "prompt", "must be a string, got null"),
        ({"prompt": 7}, "prompt", "must be a string, got number"),
        ({"prompt": "   "}, "prompt", "must not be empty"),
        ({"prompt": "x" * (MAX_TEXT_CHARS + 1)}, "prompt", f"{MAX_TEXT_CHARS + 1} characters; the limit is {MAX_TEXT_CHARS}"),
        ({"prompt": "nul\u0000"}, "prompt", "contains a NUL character"),
        ({"prompt": "q", "completions": "a"}, "completions", "must be an array of strings, got string"),
        ({"prompt": "q", "completions": ["a", "b", 3]}, "completions[2]", "must be a string, got number"),
        ({"prompt": "q", "completions": ["a", ""]}, "completions[1]", "must not be empty"),
        ({"prompt": "q", "completions": ["a", "a"]}, "completions[1]", "same text as completions[0]; each completion must differ"),
        ({"prompt": "q", "completions": ["a", " \n\t"]}, "completions[1]", "must not be empty"),
        # Identical whitespace aside is identical to an annotator (and to the sampling job's screen).
        ({"prompt": "q", "completions": ["the answer is 4", "b", "the  answer\nis 4 "]}, "completions[2]", "same text as completions[0] (whitespace aside); each completion must differ"),
        ({"prompt": "q", "split": "test"}, "split", "must be one of train, heldout, got 'test'"),
        ({"prompt": "q", "metadata": ["a"]}, "metadata", "must be an object, got array"),
        ({"prompt": "q", "reference": 1}, "reference", "must be a string, got number"),
        ({"prompt": "q", "completion": ["a"]}, "completion", "unknown field for a prompt row; expected prompt, messages, completions, reference, split, metadata"),
        ({"prompt": "q", "messages": [{"role": "user", "content": "q"}]}, "messages", "give either prompt or messages, not both"),
        ({"messages": []}, "messages", "must hold at least one message"),
        ({"messages": "hi"}, "messages", "must be an array of {role, content} objects, got string"),
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role", "must be one of system, user, assistant, got 'tool'"),
        ({"messages": [{"role": "user"}]}, "messages[0].content", "missing"),
        ({"messages": [{"role": "user", "content": "x", "name": "bob"}]}, "messages[0].name", "unknown field; a message has role and content"),
        ({"messages": [{"role": "system", "content": "x"}]}, "messages", "needs at least one user message"),
    ],
)
def test_bad_prompt_row_names_line_and_field(row: dict, field: str, message: str):
    data = jsonl({"prompt": "fine", "completions": ["a"]}, row)
    assert only_error("p.jsonl", data, strict=True) == (2, field, message)


@pytest.mark.parametrize(
    ("row", "field", "message"),
    [
        ({"prompt": "q", "chosen": "a"}, "rejected", "missing"),
        ({"prompt": "q", "rejected": "a"}, "chosen", "missing"),
        ({"prompt": "q", "chosen": "a", "rejected": [{"role": "assistant", "content": "b"}]}, "chosen", "must be an array of messages, as rejected is, got string"),
        ({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}], "rejected": [{"role": "user", "content": "r"}, {"role": "assistant", "content": "b"}]}, "prompt", "missing, and chosen and rejected share no opening user turn to take the prompt from (the implicit-prompt layout); add a prompt field"),
        ({"chosen": [{"role": "user", "content": "q"}], "rejected": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "b"}]}, "chosen", "has no turns after the prompt; a response needs at least one"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "score_chosen": "high"}, "score_chosen", "must be a number, got string"),
        ({"prompt": "q", "chosen": "same", "rejected": "same "}, "rejected", "same text as chosen; a pair needs two different responses"),
        ({"prompt": "q", "chosen": "the same\nanswer", "rejected": "the  same answer"}, "rejected", "same text as chosen; a pair needs two different responses"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "p": 1.5}, "p", "must be between 0 and 1, got 1.5"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "p": True}, "p", "must be a number, got boolean"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "p": "0.5"}, "p", "must be a number, got string"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": 0}, "margin", "must be at least 1, got 0"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "margin": 1.5}, "margin", "must be a whole number, got 1.5"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "weight": -1}, "weight", "must be at least 0, got -1"),
        ({"chosen": "Human: a", "rejected": "Human: b"}, "prompt", "missing, and chosen and rejected share no prefix ending in '\\n\\nAssistant:' (the HH-RLHF layout) to take the prompt from; add a prompt field, or choose preset trl to take their shared opening text as the prompt"),
        ({"chosen": "\n\nHuman: a\n\nAssistant:", "rejected": "\n\nHuman: a\n\nAssistant: "}, "rejected", "same text as chosen; a pair needs two different responses"),
        ({"prompt": "q", "chosen": "a", "rejected": "b", "completions": ["c"]}, "completions", "unknown field for a pair row (it belongs to the other kind of row); expected prompt, messages, chosen, rejected, p, margin, weight, split, metadata, score_chosen, score_rejected"),
    ],
)
def test_bad_pair_row_names_line_and_field(row: dict, field: str, message: str):
    data = jsonl({"prompt": "fine", "chosen": "a", "rejected": "b"}, row)
    assert only_error("pairs.jsonl", data, strict=True) == (2, field, message)


def test_nan_and_non_object_lines_are_json_errors():
    data = jsonl({"prompt": "q", "chosen": "a", "rejected": "b"}, '{"prompt": "q", "chosen": "a", "rejected": "b", "p": NaN}', "[1, 2]")
    assert rejected("p.jsonl", data) == [
        (2, "json", "invalid JSON: NaN is not a valid JSON number"),
        (3, "json", "each line must be a JSON object, got array"),
    ]


def test_nesting_limits():
    deep = {"a": 1}
    for _ in range(20):
        deep = {"a": deep}
    assert only_error("p.jsonl", jsonl({"prompt": "q", "metadata": deep})) == (1, "metadata", "nested more than 16 levels deep")
    absurd = '{"prompt": "q", "metadata": ' + "[" * 100_000 + "]" * 100_000 + "}"
    assert only_error("p.jsonl", jsonl(absurd)) == (1, "json", "JSON nested too deeply")


def test_mixed_kinds_name_the_first_row_of_the_other_kind():
    data = jsonl({"prompt": "a"}, {"prompt": "b"}, {"prompt": "c", "chosen": "x", "rejected": "y"}, {"chosen": "x", "rejected": "y"})
    assert only_error("p.jsonl", data) == (
        3, "chosen", "a pair row (it has chosen/rejected) in a file of prompt rows (from line 1); a file holds one kind")
    data = jsonl({"prompt": "c", "chosen": "x", "rejected": "y"}, {"prompt": "a", "completions": []})
    line, field, message = only_error("p.jsonl", data)
    assert (line, field) == (2, "chosen") and message.startswith("a prompt row in a file of pair rows (from line 1)")


def test_too_many_rows_stops_at_the_first_row_over_the_limit():
    data = jsonl({"prompt": "a"}, "", {"prompt": "b"}, {"prompt": "c"}, {"prompt": "d"})
    assert only_error("p.jsonl", data, max_rows=2) == (4, "file", "the file has more than 2 rows, the limit for one import; split it")
    assert parse_import("p.jsonl", data, max_rows=4).rows == 4


def test_every_bad_row_is_reported_up_to_a_cap():
    data = jsonl(*[{"prompt": ""} for _ in range(MAX_ERRORS + 5)])
    with pytest.raises(ImportRejected) as info:
        parse_import("p.jsonl", data)
    assert len(info.value.errors) == MAX_ERRORS and info.value.omitted == 5
    assert info.value.errors[-1] == RowError(MAX_ERRORS, "prompt", "must not be empty")
    detail = info.value.detail()
    assert detail[0] == {"line": 1, "field": "prompt", "message": "must not be empty"}
    assert detail[-1] == {"line": 0, "field": "file", "message": "5 more problem(s) not listed"}


def test_a_file_with_only_a_header_holds_no_rows():
    assert only_error("p.csv", b"prompt,completions\n") == (0, "file", "the file holds no rows")


# --- bad rows: CSV ----------------------------------------------------------------------------


def test_csv_errors_use_physical_line_numbers():
    data = (
        b"prompt,completions,split\n"       # line 1
        b'"a prompt\nover two lines",,\n'    # lines 2-3
        b'b,"[1]",train\n'                   # line 4
        b'c,"[""x""",heldout\n'              # line 5
        b"d,,nope\n"                         # line 6
        b"e,,train,extra\n"                  # line 7
    )
    errors = rejected("p.csv", data)
    assert errors[0] == (4, "completions[0]", "must be a string, got number")
    assert errors[1][:2] == (5, "completions") and errors[1][2].startswith("cell is not valid JSON")
    assert errors[2:] == [
        (6, "split", "must be one of train, heldout, got 'nope'"),
        (7, "csv", "4 cells but the header has 3 columns"),
    ]


def test_csv_numbered_completion_columns_are_named_in_errors():
    data = b"prompt,completion_1,completion_2\nq,a,a\n"
    assert only_error("p.csv", data) == (2, "completion_2", "same text as completion_1; each completion must differ")


def test_csv_unclosed_quote_reports_where_the_record_starts():
    data = b'prompt,completions\nok,\n"never closed,\nmore\n'
    assert only_error("p.csv", data) == (3, "csv", "malformed CSV: unexpected end of data")


@pytest.mark.parametrize(
    ("header", "field", "message"),
    [
        ("prompt,answer", "answer", "unknown column; expected prompt, messages, completions, reference, split, metadata, completion_1..completion_N"),
        ("prompt,prompt", "prompt", "column appears twice in the header"),
        ("prompt,completions,completion_1", "completions", "use either a completions column or completion_1..N columns, not both"),
        ("prompt,chosen,rejected,completion_1", "completion_1", "prompt-row column in a file of pairs (it has chosen/rejected); a file holds one kind"),
    ],
)
def test_csv_bad_header_is_line_one(header: str, field: str, message: str):
    assert only_error("p.csv", f"{header}\nq,a,b,c\n".encode(), strict=True) == (1, field, message)


def test_csv_pair_numbers_are_parsed_and_checked():
    data = b"prompt,chosen,rejected,p,margin\nq,a,b,high,\nq,a,c,0.5,2.5\n"
    assert rejected("pairs.csv", data) == [
        (2, "p", "must be a number, got 'high'"),
        (3, "margin", "must be a whole number, got 2.5"),
    ]


def test_csv_pair_row_without_chosen_is_missing_it():
    assert only_error("pairs.csv", b"prompt,chosen,rejected\nq,,b\n") == (2, "chosen", "missing")


# --- bad rows: Parquet ------------------------------------------------------------------------


def test_parquet_errors_name_the_row():
    data = parquet({"prompt": ["ok", "", "fine"], "completions": [["a"], ["b"], ["c", "c"]]})
    assert rejected("p.parquet", data) == [
        (2, "prompt", "row 2: must not be empty"),
        (3, "completions[1]", "row 3: same text as completions[0]; each completion must differ"),
    ]


def test_parquet_unknown_column_and_row_limit():
    assert only_error("p.parquet", parquet({"prompt": ["q"], "answer": ["a"]}), strict=True)[:2] == (0, "answer")
    assert only_error("p.parquet", parquet({"prompt": ["a", "b", "c"]}), max_rows=2) == (
        0, "file", "the file has more than 2 rows, the limit for one import; split it")


def test_parquet_wrong_column_type_names_the_field():
    data = parquet({"prompt": ["q"], "split": [3]})
    assert only_error("p.parquet", data) == (1, "split", "row 1: must be one of train, heldout, got 3")
