"""Import presets: other tools' layouts mapped onto preflab's own import records; no database here.

Each preset turns one record of the file (a JSONL line, a CSV or Parquet row, a task of a JSON array) into the
record preflab's own layout would have held, so validation, line numbers and error messages stay one thing. The
field mapping of every preset is in docs/engineers/imports.md and in the docstrings below.

- `preflab`: preflab's own fields (prompt rows, or pair rows with chosen/rejected as text or as message lists).
- `ultrafeedback`: UltraFeedback-binarized (`prompt`, `prompt_id`, `chosen`/`rejected` as chats that open with
  the prompt, `messages` = a copy of `chosen`, `score_chosen`/`score_rejected`).
- `trl`: TRL preference data, standard (text) or conversational (message lists), explicit or implicit prompt.
- `hh-rlhf`: Anthropic HH-RLHF (`chosen`/`rejected` transcripts, the prompt being their shared opening).
- `label-studio`: a Label Studio JSON export of a pairwise or ranker project; annotations become rankings.
- `argilla`: a `datasets` export of an Argilla 2.x dataset with a ranking question or rating questions;
  submitted responses become rankings.
- `trl-stepwise`: TRL's stepwise supervision (`prompt`, `completions` = the steps, `labels` = one bool per step).
- `prm800k`: PRM800K's JSONL (`question.problem`, `label.steps[].completions[]` rated −1/0/+1, `labeler`).

Label Studio and Argilla rows come out as *annotated* records: {"prompt", "completions", "metadata",
"rankings": [{"annotator", "tiers" (completion indexes, best tier first), "meta"}]}.

TRL-stepwise and PRM800K rows come out as *stepped* records, one completion with its step labels:
{"prompt" | "messages", "steps", "step_fields" (where each step is in the file), "step_labels" (+1/0/−1),
"annotator" ("tool:id", or None: the dataset itself), "meta" (provenance), "metadata", "reference"}.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from app.platform.formats import IMPORT_PRESETS

PRESETS = IMPORT_PRESETS
ANNOTATED = ("label-studio", "argilla")
"""Presets whose rows carry annotators' rankings rather than finished pairs."""
STEPPED = ("trl-stepwise", "prm800k")
"""Presets whose rows carry one completion's steps and their labels (process supervision)."""
PROMPT_KEYS = ("prompt", "instruction", "question", "text")
"""Where Label Studio task data and Argilla records keep the prompt, first match wins."""
LS_PAIR_KEYS = (("answer1", "answer2"), ("text1", "text2"), ("response1", "response2"), ("response_a", "response_b"))
"""Label Studio pairwise data keys (left, right) tried when the result's to_name does not name two data keys."""
ARGILLA_SYSTEM_COLUMNS = ("id", "status", "_server_id", "inserted_at", "updated_at")

Record = dict[str, Any]


class PresetError(Exception):
    """A record does not fit its preset; `field` names where (dotted, as in the file)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


def check_name(name: str) -> str:
    """The preset name, or ValueError listing the known ones."""
    if name not in PRESETS:
        raise ValueError(f"unknown preset {name!r}; use one of {', '.join(PRESETS)}")
    return name


# --- detection ----------------------------------------------------------------------------------


def detect(record: Record) -> str | None:
    """The preset a record's layout says, or None when it fits several or none (then the file needs a preset)."""
    if "data" in record and isinstance(record.get("data"), dict) and ("annotations" in record or "id" in record):
        return "label-studio"
    if isinstance(record.get("question"), dict) and isinstance(record.get("label"), dict):
        return "prm800k"
    labels = record.get("labels")
    if isinstance(labels, list) and labels and all(isinstance(v, bool) for v in labels) \
            and isinstance(record.get("completions"), list):
        return "trl-stepwise"
    if any(isinstance(k, str) and k.endswith(".responses") for k in record):
        return "argilla"
    if "chosen" not in record and "rejected" not in record:
        return "preflab"
    chosen, rejected = record.get("chosen"), record.get("rejected")
    if "prompt_id" in record or ("score_chosen" in record and isinstance(record.get("messages"), list)):
        return "ultrafeedback"
    if isinstance(chosen, list) or isinstance(rejected, list) or isinstance(record.get("prompt"), list):
        return "trl"
    if "prompt" not in record and "messages" not in record and isinstance(chosen, str) and "\n\nAssistant:" in chosen:
        return "hh-rlhf"
    return "preflab"


# --- pair presets ------------------------------------------------------------------------------


def map_pair_record(preset: str, record: Record) -> Record:
    """A pair preset's record as preflab's own; raises PresetError when it does not fit."""
    if preset == "ultrafeedback":
        return _ultrafeedback(record)
    if preset == "trl":
        return _trl(record)
    if preset == "hh-rlhf":
        if "chosen" not in record or "rejected" not in record:
            raise PresetError("chosen", "missing; an HH-RLHF row has chosen and rejected transcripts")
        return record
    return record


def _ultrafeedback(record: Record) -> Record:
    """`messages` is a copy of `chosen` and is dropped; `prompt` is dropped when the chats open with it (the
    shared opening turns are the prompt); `prompt_id` is kept as metadata; scores become a soft label."""
    if "chosen" not in record or "rejected" not in record:
        raise PresetError("chosen", "missing; an UltraFeedback row has chosen and rejected chats")
    out = {k: v for k, v in record.items() if k != "messages"}
    chosen = out.get("chosen")
    if isinstance(chosen, list) and isinstance(out.get("prompt"), str) and chosen and isinstance(chosen[0], dict) \
            and chosen[0].get("role") == "user":
        del out["prompt"]
    return out


def _trl(record: Record) -> Record:
    """TRL's four preference layouts are preflab's own: prompt + chosen/rejected as text or messages, or
    chosen/rejected alone (implicit prompt). Anything else is an extra column."""
    if "chosen" not in record or "rejected" not in record:
        raise PresetError("chosen", "missing; a TRL preference row has chosen and rejected")
    chosen, rejected = record["chosen"], record["rejected"]
    if "prompt" in record or not (isinstance(chosen, str) and isinstance(rejected, str)) \
            or "\n\nAssistant:" in chosen:
        return record
    prompt, chosen, rejected = trl_text_prompt(chosen, rejected)
    return {**record, "prompt": prompt, "chosen": chosen, "rejected": rejected} if prompt.strip() else record


def trl_text_prompt(chosen: str, rejected: str) -> tuple[str, str, str]:
    """TRL's implicit prompt of a standard (text) pair: the shared opening characters, a space before the first
    difference going with the responses (as trl.data_utils.extract_prompt cuts it)."""
    idx = 0
    while idx < min(len(chosen), len(rejected)) and chosen[idx] == rejected[idx]:
        idx += 1
    if 0 < idx < min(len(chosen), len(rejected)) and chosen[idx - 1] == " ":
        idx -= 1
    return chosen[:idx], chosen[idx:], rejected[idx:]


# --- Label Studio -------------------------------------------------------------------------------


def _ls_annotator(annotation: Record) -> str:
    who = annotation.get("completed_by")
    if isinstance(who, dict):
        who = who.get("id", who.get("email"))
    if who is None or isinstance(who, bool) or not isinstance(who, int | str):
        raise PresetError("annotations.completed_by", "missing; each annotation needs the annotator's id")
    return f"label-studio:{who}"


def _ls_prompt(data: Record) -> Any:
    if isinstance(data.get("messages"), list):
        return {"messages": data["messages"]}
    for key in PROMPT_KEYS:
        if key in data:
            return {"prompt": data[key]}
    raise PresetError("data.prompt", f"missing; the task data needs one of {', '.join(PROMPT_KEYS)}")


def _ls_results(annotation: Record, where: str) -> list[Record]:
    result = annotation.get("result")
    if not isinstance(result, list):
        raise PresetError(f"{where}.result", "must be an array of results")
    return [r for r in result if isinstance(r, dict) and r.get("type") in ("pairwise", "ranker")]


def _ls_pair_keys(data: Record, results: list[Record]) -> tuple[str, str]:
    for r in results:
        names = str(r.get("to_name", "")).split(",")
        if len(names) == 2 and all(n.strip() in data for n in names):
            return names[0].strip(), names[1].strip()
    for left, right in LS_PAIR_KEYS:
        if left in data and right in data:
            return left, right
    known = ", ".join(f"{a}/{b}" for a, b in LS_PAIR_KEYS)
    raise PresetError("data", f"a pairwise task needs its two responses in data ({known})")


def _ls_items(data: Record) -> tuple[list[Any], dict[str, int]]:
    items = data.get("items")
    if not isinstance(items, list) or not items:
        raise PresetError("data.items", "a ranker task needs a non-empty items list")
    texts: list[Any] = []
    index: dict[str, int] = {}
    for i, item in enumerate(items):
        if not isinstance(item, dict) or "id" not in item:
            raise PresetError(f"data.items[{i}]", "must be an object with id and body")
        index[str(item["id"])] = i
        texts.append(item.get("body", item.get("text", item.get("title"))))
    return texts, index


def _ls_ranker_tiers(result: Record, index: dict[str, int], where: str) -> list[list[int]]:
    """`{list name: [ids in order]}` gives one id per tier; buckets `{bucket: [ids], ...}` give one tier per
    bucket, in the order the export lists them ("_", the unsorted rest, is left out)."""
    value = result.get("value", {})
    ranker = value.get("ranker") if isinstance(value, dict) else None
    if not isinstance(ranker, dict) or not ranker:
        raise PresetError(f"{where}.value.ranker", "must be an object of id lists")
    groups = [ids for name, ids in ranker.items() if name != "_"]
    if not all(isinstance(ids, list) for ids in groups):
        raise PresetError(f"{where}.value.ranker", "each entry must be a list of item ids")
    tiers = [[_ls_item(index, i, where) for i in ids] for ids in groups] if len(ranker) > 1 else \
        [[_ls_item(index, i, where)] for i in groups[0]]
    return [t for t in tiers if t]


def _ls_item(index: dict[str, int], item_id: Any, where: str) -> int:
    if str(item_id) not in index:
        raise PresetError(f"{where}.value.ranker", f"item id {item_id!r} is not in data.items")
    return index[str(item_id)]


def _ls_pairwise_tiers(result: Record, where: str) -> list[list[int]]:
    value = result.get("value", {})
    selected = value.get("selected") if isinstance(value, dict) else None
    if selected == "left":
        return [[0], [1]]
    if selected == "right":
        return [[1], [0]]
    raise PresetError(f"{where}.value.selected", f"must be 'left' or 'right', got {selected!r}")


def map_label_studio(task: Record) -> Record:
    """A Label Studio task: the prompt from data (prompt | instruction | question | text, or messages); the
    responses from a pairwise project's two data keys, or a ranker project's data.items bodies; each annotation
    that was not cancelled becomes one ranking by a pseudonymous user per `completed_by`, with the task, the
    annotation and the tool in its metadata. Other data keys are kept as the prompt's metadata."""
    data = task.get("data")
    if not isinstance(data, dict):
        raise PresetError("data", "missing; a Label Studio task has a data object")
    annotations = task.get("annotations", [])
    if not isinstance(annotations, list):
        raise PresetError("annotations", "must be an array")
    live = [(i, a) for i, a in enumerate(annotations) if isinstance(a, dict) and not a.get("was_cancelled")]
    results = {i: _ls_results(a, f"annotations[{i}]") for i, a in live}
    is_ranker = "items" in data or any(r.get("type") == "ranker" for rs in results.values() for r in rs)
    if is_ranker:
        completions, index = _ls_items(data)
        used = {"items"}
    else:
        left, right = _ls_pair_keys(data, [r for rs in results.values() for r in rs])
        completions, index, used = [data[left], data[right]], {}, {left, right}
    out = _ls_prompt(data)
    used.add("messages" if "messages" in out else next(k for k in PROMPT_KEYS if k in data))
    rankings = []
    for i, annotation in live:
        where = f"annotations[{i}].result"
        for r in results[i]:
            tiers = _ls_ranker_tiers(r, index, where) if r["type"] == "ranker" else _ls_pairwise_tiers(r, where)
            rankings.append({"annotator": _ls_annotator(annotation), "tiers": tiers, "meta": {
                "source_tool": "label-studio", "task_id": task.get("id"), "annotation_id": annotation.get("id")}})
    out["completions"] = completions
    out["rankings"] = rankings
    out["metadata"] = {k: v for k, v in data.items() if k not in used}
    out["metadata"]["source_task_id"] = task.get("id")
    return out


# --- Argilla ------------------------------------------------------------------------------------


def _argilla_prompt_key(record: Record) -> str:
    for key in PROMPT_KEYS:
        if key in record:
            return key
    raise PresetError("prompt", f"missing; the record needs a field named one of {', '.join(PROMPT_KEYS)}")


def _argilla_questions(record: Record) -> dict[str, tuple[list[Any], list[Any], list[Any]]]:
    """question → (values, users, statuses), one entry per response."""
    out = {}
    for key in record:
        if not (isinstance(key, str) and key.endswith(".responses")):
            continue
        name = key.removesuffix(".responses")
        values = record[key] or []
        users = record.get(f"{key}.users") or []
        statuses = record.get(f"{key}.status") or ["submitted"] * len(values)
        if not isinstance(values, list) or not isinstance(users, list) or len(users) != len(values):
            raise PresetError(f"{key}.users", "must list one user per response")
        out[name] = (values, users, statuses)
    if not out:
        raise PresetError("responses", "no <question>.responses column; export the dataset with its responses")
    return out


def _ranking_order(value: Any, where: str) -> list[list[str]]:
    """A ranking response: option values best first ([\"a\", \"b\"]), or [{value, rank}] (ties share a rank)."""
    if not isinstance(value, list) or not value:
        raise PresetError(where, "a ranking response must be a non-empty list")
    if all(isinstance(v, str) for v in value):
        return [[v] for v in value]
    by_rank: dict[int, list[str]] = {}
    for v in value:
        if not isinstance(v, dict) or not isinstance(v.get("value"), str) or not isinstance(v.get("rank"), int):
            raise PresetError(where, "each ranked item needs value and rank")
        by_rank.setdefault(v["rank"], []).append(v["value"])
    return [by_rank[r] for r in sorted(by_rank)]


def _rating_field(question: str, fields: list[str]) -> str | None:
    matches = [f for f in fields if f in question]
    return max(matches, key=len) if matches else None


def _argilla_meta(record: Record) -> dict[str, Any]:
    return {"source_tool": "argilla", "task_id": record.get("id"), "server_id": record.get("_server_id")}


def _argilla_rankings(record: Record, prompt_key: str) -> tuple[list[str], list[dict[str, Any]]]:
    """(response fields, rankings): one ranking question gives each submitted response's order; several rating
    questions (one per response field, the field's name inside the question's) give tiers by rating, high first."""
    questions = _argilla_questions(record)
    fields = [k for k, v in record.items() if isinstance(k, str) and isinstance(v, str) and "." not in k
              and k != prompt_key and k not in ARGILLA_SYSTEM_COLUMNS]
    ranked = {q: v for q, v in questions.items() if any(isinstance(x, list) for x in v[0])}
    if ranked:
        return _argilla_ranked(record, ranked, fields)
    return _argilla_rated(record, questions, fields)


def _argilla_ranked(record: Record, ranked: dict[str, Any], fields: list[str]) -> tuple[list[str], list[Any]]:
    name, (values, users, statuses) = next(iter(ranked.items()))
    orders = [(u, _ranking_order(v, f"{name}.responses")) for v, u, s in zip(values, users, statuses, strict=True)
              if s == "submitted"]
    used = [f for f in fields if any(f in tier for _, order in orders for tier in order)]
    for _, order in orders:
        for tier in order:
            for option in tier:
                if option not in fields:
                    raise PresetError(f"{name}.responses", f"ranks {option!r}, which is not a text field of the record")
    rankings: list[dict[str, Any]] = [
        {"annotator": f"argilla:{user}", "tiers": [[used.index(o) for o in tier] for tier in order],
         "meta": {**_argilla_meta(record), "question": name}} for user, order in orders]
    return used, rankings


def _argilla_rated(record: Record, questions: dict[str, Any], fields: list[str]) -> tuple[list[str], list[Any]]:
    by_user: dict[Any, dict[str, float]] = {}
    used: list[str] = []
    for name, (values, users, statuses) in questions.items():
        field = _rating_field(name, fields)
        if field is None:
            continue
        used.append(field)
        for value, user, status in zip(values, users, statuses, strict=True):
            if status != "submitted":
                continue
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise PresetError(f"{name}.responses", f"a rating must be a number, got {value!r}")
            by_user.setdefault(user, {})[field] = float(value)
    if not used:
        raise PresetError("responses", "no ranking question and no rating question naming a text field "
                          f"({', '.join(fields) or 'none'}) of the record")
    rankings = []
    for user, ratings in by_user.items():
        levels = sorted(set(ratings.values()), reverse=True)
        tiers = [[used.index(f) for f in used if ratings.get(f) == level] for level in levels]
        if len(tiers) > 1:  # all rated alike is no preference
            rankings.append({"annotator": f"argilla:{user}", "tiers": tiers, "meta": _argilla_meta(record)})
    return used, rankings


def map_argilla(record: Record) -> Record:
    """An Argilla 2.x record as `Dataset.records.to_datasets()` / `to_hub` export it: the prompt from a field
    named prompt | instruction | question | text; the responses from the other text fields a ranking question
    orders, or rating questions rate; each *submitted* response (drafts and discarded ones are left out) becomes
    one ranking by a pseudonymous user per Argilla user id, with the record id and the tool in its metadata."""
    prompt_key = _argilla_prompt_key(record)
    fields, rankings = _argilla_rankings(record, prompt_key)
    metadata = {k: v for k, v in record.items() if isinstance(k, str) and k not in fields and k != prompt_key
                and ".responses" not in k and ".suggestion" not in k and k not in ARGILLA_SYSTEM_COLUMNS}
    metadata["source_task_id"] = record.get("id")
    return {"prompt": record[prompt_key], "completions": [record[f] for f in fields], "rankings": rankings,
            "metadata": metadata}


def map_annotated(preset: str, record: Record) -> Record:
    return map_label_studio(record) if preset == "label-studio" else map_argilla(record)


# --- step-labelled data (TRL stepwise supervision, PRM800K) ---------------------------------------


def map_stepped(preset: str, record: Record) -> Record:
    return map_trl_stepwise(record) if preset == "trl-stepwise" else map_prm800k(record)


def map_trl_stepwise(record: Record) -> Record:
    """TRL's stepwise-supervision row: `prompt` (text, or a chat), `completions` (the steps of one solution) and
    `labels` (one bool per step: True +1, False −1). The file names no labeller: the dataset is one (annotator
    None). Other columns are the prompt's metadata."""
    steps, labels = record.get("completions"), record.get("labels")
    if not isinstance(steps, list) or not steps:
        raise PresetError("completions", "must be a non-empty array of steps (strings)")
    if not isinstance(labels, list):
        raise PresetError("labels", "must be an array of true/false, one per step")
    for i, value in enumerate(labels):
        if not isinstance(value, bool):
            raise PresetError(f"labels.{i}", f"must be true or false, got {value!r}")
    if len(labels) != len(steps):
        raise PresetError("labels", f"{len(labels)} labels for {len(steps)} steps")
    prompt = record.get("prompt")
    out: Record = {"messages": prompt} if isinstance(prompt, list) else {"prompt": prompt}
    return out | {"steps": steps, "step_fields": [f"completions.{i}" for i in range(len(steps))],
                  "step_labels": [1 if v else -1 for v in labels], "annotator": None,
                  "meta": {"source_tool": "trl-stepwise"}, "reference": None,
                  "metadata": {k: v for k, v in record.items() if k not in ("prompt", "completions", "labels")}}


PRM_RATINGS = (-1, 0, 1)
PRM_ROW_KEYS = ("question", "label", "labeler")


def _prm_step(step: Any, where: str, last: bool) -> tuple[Any, int, str]:
    """(text, rating, field) of the path's step: the completion at chosen_completion, else the labeller's own
    (human_completion, +1 when unrated: they wrote it as the right step), else the only completion; at the last
    step with none chosen (labelling stopped at an error) the first completion rated −1."""
    if not isinstance(step, dict):
        raise PresetError(where, "must be an object with completions")
    completions = step.get("completions")
    if not isinstance(completions, list):
        raise PresetError(f"{where}.completions", "must be an array of {text, rating} objects")
    chosen, human = step.get("chosen_completion"), step.get("human_completion")
    if chosen is not None:
        if isinstance(chosen, bool) or not isinstance(chosen, int) or not 0 <= chosen < len(completions):
            raise PresetError(f"{where}.chosen_completion",
                              f"{chosen!r} is not an index into the step's {len(completions)} completions")
        index = chosen
    elif isinstance(human, dict):
        rating = human.get("rating")
        score = 1 if rating is None else _prm_rating(rating, f"{where}.human_completion.rating")
        return human.get("text"), score, f"{where}.human_completion.text"
    elif len(completions) == 1:
        index = 0
    else:
        wrong = [i for i, c in enumerate(completions) if isinstance(c, dict) and c.get("rating") == -1]
        if not (last and wrong):
            raise PresetError(f"{where}.chosen_completion", f"null with {len(completions)} completions and no "
                              "human_completion: the path through this step is unknown")
        index = wrong[0]
    completion = completions[index]
    if not isinstance(completion, dict):
        raise PresetError(f"{where}.completions.{index}", "must be an object with text and rating")
    return completion.get("text"), _prm_rating(completion.get("rating"), f"{where}.completions.{index}.rating"), \
        f"{where}.completions.{index}.text"


def _prm_rating(value: Any, where: str) -> int:
    if isinstance(value, bool) or value not in PRM_RATINGS:
        raise PresetError(where, f"must be -1, 0 or 1, got {value!r}")
    return int(value)


def map_prm800k(record: Record) -> Record:
    """A PRM800K row (phase 1 or 2): the prompt is `question.problem` (its `ground_truth_answer` the reference);
    the path the labeller took through `label.steps` is one completion, each step rated −1/0/+1 by `labeler`
    (a pseudonymous user). The rest of `question` and the row's flags are the prompt's metadata; timestamp,
    generation and finish_reason go with the labels."""
    for key in PRM_ROW_KEYS:
        if key not in record:
            raise PresetError(key, "missing; a PRM800K row has question, label and labeler")
    question, label, labeler = record["question"], record["label"], record["labeler"]
    if not isinstance(question, dict) or "problem" not in question:
        raise PresetError("question.problem", "missing; the question object holds the problem")
    if not isinstance(label, dict) or not isinstance(label.get("steps"), list) or not label["steps"]:
        raise PresetError("label.steps", "must be a non-empty array of steps")
    if isinstance(labeler, bool) or not isinstance(labeler, str | int) or not str(labeler).strip():
        raise PresetError("labeler", f"must be the labeller's id, got {labeler!r}")
    n = len(label["steps"])
    path = [_prm_step(step, f"label.steps.{i}", i == n - 1) for i, step in enumerate(label["steps"])]
    reference = question.get("ground_truth_answer")
    metadata = {k: v for k, v in question.items() if k not in ("problem", "ground_truth_answer")}
    metadata |= {k: v for k, v in record.items() if k not in (*PRM_ROW_KEYS, "timestamp", "generation")}
    return {"prompt": question["problem"], "steps": [text for text, _, _ in path],
            "step_fields": [where for _, _, where in path], "step_labels": [rating for _, rating, _ in path],
            "annotator": f"prm800k:{labeler}", "reference": reference if isinstance(reference, str) else None,
            "meta": {"source_tool": "prm800k", "timestamp": record.get("timestamp"),
                     "generation": record.get("generation"), "finish_reason": label.get("finish_reason")},
            "metadata": metadata}


def first_record(records: Iterator[tuple[int, Record | None]]) -> tuple[list[tuple[int, Record | None]], Record | None]:
    """Read ahead to the first readable record: (what was read, to be yielded again, and that record)."""
    seen: list[tuple[int, Record | None]] = []
    for line, record in records:
        seen.append((line, record))
        if record is not None:
            return seen, record
    return seen, None
