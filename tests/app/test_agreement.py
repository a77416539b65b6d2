"""Agreement and quality metrics against hand-computed values, the project report on both databases, gold tasks,
the JSON API's roles and the lead's dashboard page.

The fixture used throughout: three annotators A, B, C rank three prompts of K=3 completions
(P1 = items 1 2 3, P2 = 4 5 6, P3 = 7 8 9):

         P1               P2                      P3
    A    1 > 2 > 3        4 > 5 > 6               7 > 8 > 9
    B    1 > 3 > 2        (4 = 5) > 6   (a tie)   skipped
    C    2 > 1 > 3        4 > 5         (partial) 7 > 8 > 9
"""

from __future__ import annotations

import math

import pytest
from sqlalchemy import select

from app.models import Completion, Prompt, Ranking
from app.platform.errors import Forbidden, Invalid, NotFound
from app.projects import projects, rubrics
from app.quality import agreement, gold
from app.quality.agreement import (
    gold_score,
    kendall_tau_b,
    krippendorff_alpha_ordinal,
    mid_ranks,
    pairwise_agreement,
    position_bias,
    ranking_alpha,
)

A_RANKS = {1: [[1], [2], [3]], 2: [[4], [5], [6]], 3: [[7], [8], [9]]}
B_RANKS = {1: [[1], [3], [2]], 2: [[4, 5], [6]], 3: []}  # P3 skipped
C_RANKS = {1: [[2], [1], [3]], 2: [[4], [5]], 3: [[7], [8], [9]]}

# Display orders (what each annotator saw first matters for position bias).
A_SHOWN = {1: [1, 2, 3], 2: [6, 5, 4], 3: [7, 9, 8]}
B_SHOWN = {1: [3, 1, 2], 2: [5, 4, 6], 3: [9, 8, 7]}
C_SHOWN = {1: [2, 3, 1], 2: [4, 6, 5], 3: [8, 7, 9]}

A_SECONDS = {1: 10.0, 2: 20.0, 3: 30.0}
B_SECONDS = {1: 40.0, 2: 60.0, 3: 5.0}  # the 5 s is the skip and stays out of the median
C_SECONDS = {1: 12.0, 2: 15.0, 3: 30.0}

GOLD = {1: [[1], [2, 3]], 3: [[7], [8], [9]]}

# Pairwise agreement and τ_b per comparison (item pairs ranked by both; a tie is its own relation):
#   P1 A–B: (1,2) ✓ (1,3) ✓ (2,3) ✗          → 2/3;  τ = (2 − 1)/3 = 1/3
#   P1 A–C: (1,2) ✗ (1,3) ✓ (2,3) ✓          → 2/3;  τ = 1/3
#   P1 B–C: (1,2) ✗ (1,3) ✓ (2,3) ✗          → 1/3;  τ = (1 − 2)/3 = −1/3
#   P2 A–B: (4,5) A ≻, B tie ✗; (4,6) ✓ (5,6) ✓ → 2/3;  τ_b = 2/√((3 − 0)(3 − 1)) = 2/√6
#   P2 A–C: shared {4, 5}: (4,5) ✓           → 1;    τ = 1
#   P2 B–C: shared {4, 5}: B ties, C orders  → 0;    τ undefined (B ties every shared pair)
#   P3 A–C: identical                        → 1;    τ = 1
MEAN_AGREEMENT = (2 / 3 + 2 / 3 + 1 / 3 + 2 / 3 + 1 + 0 + 1) / 7  # = 13/21
MEAN_TAU = (1 / 3 + 1 / 3 - 1 / 3 + 2 / math.sqrt(6) + 1 + 1) / 6

# Krippendorff's α (ordinal) over mid-ranks; units = completions, coders = annotators:
#   item:  1      2      3      4        5        6      7    8    9
#   A      1      2      3      1        2        3      1    2    3
#   B      1      3      2      1.5      1.5      3      ·    ·    ·     (tie → mid-rank 1.5; P3 skipped)
#   C      2      1      3      1        2        ·      1    2    3     (6 unranked)
# Coincidences (each ordered pair in a unit of m values adds 1/(m − 1)):
#   o(1,1)=4  o(1,1.5)=1  o(1,2)=1.5  o(1,3)=.5  o(1.5,2)=1  o(2,2)=3  o(2,3)=1.5  o(3,3)=5   (symmetric)
#   n_1 = 7, n_1.5 = 2, n_2 = 7, n_3 = 7, n = 23
# Ordinal δ_ck = Σ_{g=c..k} n_g − (n_c + n_k)/2:
#   δ(1,1.5)=4.5  δ(1,2)=9  δ(1,3)=16  δ(1.5,2)=4.5  δ(1.5,3)=11.5  δ(2,3)=7
# Σ o δ²   = 2·(1·20.25 + 1.5·81 + .5·256 + 1·20.25 + 1.5·49)                 = 727
# Σ n n δ² = 2·(14·20.25 + 49·81 + 49·256 + 14·20.25 + 14·132.25 + 49·49)     = 42665
# α = 1 − (n − 1)·727/42665 = 1 − 22·727/42665 = 1 − 15994/42665 ≈ 0.62513
ALPHA = 1 - 15994 / 42665


def _rankings_by_prompt() -> list[tuple[int, str, list[list[int]]]]:
    out = []
    for coder, ranks in (("A", A_RANKS), ("B", B_RANKS), ("C", C_RANKS)):
        out += [(p, coder, tiers) for p, tiers in ranks.items() if tiers]
    return out


# --- pure metrics ------------------------------------------------------------------------------------------


def test_pairwise_agreement_counts_ties_as_their_own_relation() -> None:
    assert pairwise_agreement(A_RANKS[1], B_RANKS[1]) == pytest.approx(2 / 3)
    assert pairwise_agreement(B_RANKS[1], C_RANKS[1]) == pytest.approx(1 / 3)
    assert pairwise_agreement(A_RANKS[2], B_RANKS[2]) == pytest.approx(2 / 3)  # tie vs order disagrees
    assert pairwise_agreement(B_RANKS[2], C_RANKS[2]) == 0.0
    assert pairwise_agreement([[4, 5], [6]], [[5, 4], [6]]) == 1.0  # both tie 4 and 5: agreement
    assert pairwise_agreement(A_RANKS[2], C_RANKS[2]) == 1.0  # only the shared items 4, 5 count
    assert pairwise_agreement([[1], [2]], [[1], [3]]) is None  # one shared item: nothing to compare


def test_kendall_tau_b_hand_computed() -> None:
    assert kendall_tau_b(A_RANKS[1], B_RANKS[1]) == pytest.approx(1 / 3)
    assert kendall_tau_b(B_RANKS[1], C_RANKS[1]) == pytest.approx(-1 / 3)
    assert kendall_tau_b(A_RANKS[2], B_RANKS[2]) == pytest.approx(2 / math.sqrt(6))
    assert kendall_tau_b(A_RANKS[3], C_RANKS[3]) == 1.0
    assert kendall_tau_b([[1], [2], [3]], [[3], [2], [1]]) == -1.0
    assert kendall_tau_b(B_RANKS[2], C_RANKS[2]) is None  # B ties the only shared pair


def test_mid_ranks_share_the_mean_rank_of_a_tie() -> None:
    assert mid_ranks([[4, 5], [6]]) == {4: 1.5, 5: 1.5, 6: 3}
    assert mid_ranks([[1], [2, 3, 4], [5]]) == {1: 1, 2: 3, 3: 3, 4: 3, 5: 5}
    assert mid_ranks([[4], [5]]) == {4: 1, 5: 2}  # partial: ranks among the ranked items


def test_krippendorff_alpha_ordinal_matches_the_textbook_example() -> None:
    # Krippendorff (2011), "Computing Krippendorff's Alpha-Reliability", 4 observers × 12 units with missing
    # values; the paper gives α = 0.815 for ordinal data (0.743 nominal, 0.849 interval).
    observers = {
        "A": [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        "B": [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        "C": [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        "D": [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    }
    units: dict[int, dict[str, float]] = {}
    for coder, values in observers.items():
        for unit, value in enumerate(values):
            if value is not None:
                units.setdefault(unit, {})[coder] = value
    assert krippendorff_alpha_ordinal(units) == pytest.approx(0.815, abs=5e-4)


def test_krippendorff_alpha_edge_cases() -> None:
    assert krippendorff_alpha_ordinal({1: {"a": 1, "b": 1}, 2: {"a": 2, "b": 2}}) == 1.0
    assert krippendorff_alpha_ordinal({1: {"a": 1}}) is None  # nothing pairable
    assert krippendorff_alpha_ordinal({1: {"a": 2, "b": 2}}) is None  # no variation: D_e = 0


def test_ranking_alpha_on_the_fixture() -> None:
    assert ranking_alpha(_rankings_by_prompt()) == pytest.approx(ALPHA)
    assert ranking_alpha([(1, "A", [[1], [2], [3]]), (1, "B", [[1], [2], [3]])]) == 1.0


def test_position_bias_against_the_expected_rate() -> None:
    # A: first shown 1 (top ✓), 6 (✗), 7 (✓) → 2/3 against 1/3 each.
    a = position_bias([(A_RANKS[p], A_SHOWN[p]) for p in (1, 2, 3)])
    assert (a.rankings, a.first_on_top) == (3, 2)
    assert a.rate == pytest.approx(2 / 3) and a.expected == pytest.approx(1 / 3)
    # B: P1 first 3 (✗), P2 first 5 is in the tied top tier {4, 5} (✓, expected 2/3); the skip is left out.
    b = position_bias([(B_RANKS[p], B_SHOWN[p]) for p in (1, 2, 3)])
    assert (b.rankings, b.first_on_top) == (2, 1)
    assert b.rate == pytest.approx(1 / 2) and b.expected == pytest.approx((1 / 3 + 2 / 3) / 2)
    assert position_bias([([[1], [2]], [])]).rate is None  # no display order recorded


def test_gold_score_counts_ties_and_unranked_as_misses() -> None:
    # gold 1 ≻ {2, 3} gives pairs (1,2), (1,3).
    assert gold_score(GOLD[1], A_RANKS[1]) == (2, 2)
    assert gold_score(GOLD[1], C_RANKS[1]) == (1, 2)  # C put 2 above 1
    assert gold_score(GOLD[1], [[1, 2], [3]]) == (1, 2)  # a tie on (1,2) is a miss
    assert gold_score(GOLD[1], [[1], [3]], shown=[1, 2, 3]) == (1, 2)  # 2 shown but unranked: a miss
    assert gold_score(GOLD[1], [[1], [3]], shown=[1, 3]) == (1, 1)  # 2 never shown: the pair does not count
    assert agreement.gold_accuracy(GOLD[1], C_RANKS[1]) == pytest.approx(0.5)


# --- the report from the database --------------------------------------------------------------------------


def _setup(db, make_user, make_project, *, overlap: int = 3):  # type: ignore[no-untyped-def]
    """The fixture above in the database; returns (project, lead, {"A": user, ...}, {label: completion id}, {p: Prompt})."""
    lead = make_user(db, "lead")
    project = make_project(db, k=3, overlap=overlap, lead=lead)
    people = {}
    for label in "ABC":
        person = make_user(db, "annotator", name=f"Annotator {label}")
        projects.add_member(db, project, lead, email=person.email, role="annotator")
        people[label] = person
    ids: dict[int, int] = {}
    prompts: dict[int, Prompt] = {}
    for p in (1, 2, 3):
        prompt = Prompt(project_id=project.id, text=f"question {p}", text_hash=f"{p:064d}",
                        completions=[Completion(text=f"answer {3 * (p - 1) + i}") for i in (1, 2, 3)])
        db.add(prompt)
        db.flush()
        prompts[p] = prompt
        for i, completion in enumerate(prompt.completions, start=1):
            ids[3 * (p - 1) + i] = completion.id

    def real(tiers: list[list[int]]) -> list[list[int]]:
        return [[ids[x] for x in tier] for tier in tiers]

    for label, ranks, shown, seconds in (("A", A_RANKS, A_SHOWN, A_SECONDS), ("B", B_RANKS, B_SHOWN, B_SECONDS),
                                         ("C", C_RANKS, C_SHOWN, C_SECONDS)):
        for p in (1, 2, 3):
            db.add(Ranking(project_id=project.id, prompt_id=prompts[p].id, source="human",
                           annotator_id=people[label].id, rubric_id=project.current_rubric_id,
                           tiers=real(ranks[p]), display_order=[ids[x] for x in shown[p]],
                           skipped=not ranks[p], skip_reason="cannot judge" if not ranks[p] else None,
                           seconds_spent=seconds[p]))
    # An imported label disagrees with everyone: it must not count, it is no annotator.
    db.add(Ranking(project_id=project.id, prompt_id=prompts[3].id, source="imported", tiers=real([[9], [8], [7]]),
                   display_order=[]))
    for p, tiers in GOLD.items():
        gold.set_gold(db, project, prompts[p].id, real(tiers), lead)
    db.flush()
    return project, lead, people, ids, prompts


def test_report_matches_the_hand_computed_figures(db, make_user, make_project) -> None:
    project, _, people, _, _ = _setup(db, make_user, make_project)
    report = agreement.project_report(db, project)

    assert report.total_prompts == 3
    assert report.prompts_at_overlap == 2  # P3 has only A and C (B skipped) against an overlap of 3
    assert (report.human_rankings, report.skipped, report.shared_prompts, report.comparisons) == (9, 1, 3, 7)
    assert report.mean_agreement == pytest.approx(MEAN_AGREEMENT)
    assert report.mean_kendall_tau == pytest.approx(MEAN_TAU)
    assert report.krippendorff_alpha == pytest.approx(ALPHA)
    assert report.gold_prompts == 2
    assert report.rubric_versions == [1]

    by = {s.user_id: s for s in report.annotators}
    assert set(by) == {people[x].id for x in "ABC"}
    a, b, c = (by[people[x].id] for x in "ABC")

    # A: agreement over B·P1, B·P2, C·P1, C·P2, C·P3 = (2/3 + 2/3 + 2/3 + 1 + 1)/5 = 0.8
    assert (a.rankings, a.skipped, a.comparisons) == (3, 0, 5)
    assert a.agreement == pytest.approx(0.8)
    assert a.kendall_tau == pytest.approx((1 / 3 + 2 / math.sqrt(6) + 1 / 3 + 1 + 1) / 5)
    assert a.median_seconds == 20.0
    assert (a.tie_share, a.skip_share) == (0.0, 0.0)
    assert a.position_rate == pytest.approx(2 / 3) and a.position_expected == pytest.approx(1 / 3)
    # Gold: P1 (1,2) ✓ (1,3) ✓ and P3's three pairs ✓ → 5/5.
    assert (a.gold_seen, a.gold_agreed, a.gold_pairs, a.gold_accuracy) == (2, 5, 5, 1.0)

    # B: (2/3 + 2/3 + 1/3 + 0)/4 = 5/12; τ over A·P1, A·P2, C·P1 (C·P2 undefined).
    assert (b.rankings, b.skipped, b.comparisons) == (3, 1, 4)
    assert b.agreement == pytest.approx(5 / 12)
    assert b.kendall_tau == pytest.approx((1 / 3 + 2 / math.sqrt(6) - 1 / 3) / 3)
    assert b.median_seconds == 50.0  # median of 40 and 60; the 5 s skip is left out
    assert b.tie_share == pytest.approx(1 / 2)  # one of two non-skipped rankings has a tie
    assert b.skip_share == pytest.approx(1 / 3)
    assert b.position_rate == pytest.approx(1 / 2) and b.position_expected == pytest.approx(1 / 2)
    assert (b.gold_seen, b.gold_agreed, b.gold_pairs) == (1, 2, 2)  # the skipped gold P3 is not "seen"

    # C: (2/3 + 1/3 + 1 + 0 + 1)/5 = 3/5; gold 1/2 on P1 + 3/3 on P3 = 4/5.
    assert c.agreement == pytest.approx(3 / 5)
    assert c.kendall_tau == pytest.approx((1 / 3 - 1 / 3 + 1 + 1) / 4)
    assert c.median_seconds == 15.0
    assert c.position_rate == pytest.approx(2 / 3)
    assert (c.gold_seen, c.gold_agreed, c.gold_pairs) == (2, 4, 5)
    assert c.gold_accuracy == pytest.approx(0.8)


def test_report_filters_by_rubric_version(db, make_user, make_project) -> None:
    project, lead, _, _, _ = _setup(db, make_user, make_project)
    rubrics.create_version(db, project, lead, text="Version two.", criteria=[], base_version=1)
    assert agreement.project_report(db, project, rubric_version=1).krippendorff_alpha == pytest.approx(ALPHA)
    v2 = agreement.project_report(db, project, rubric_version=2)
    assert (v2.rubric_version, v2.rubric_versions, v2.human_rankings, v2.annotators) == (2, [1, 2], 0, [])
    assert v2.mean_agreement is None and v2.krippendorff_alpha is None and v2.total_prompts == 3
    with pytest.raises(Invalid) as err:
        agreement.project_report(db, project, rubric_version=7)
    assert err.value.field == "rubric_version"


def test_empty_project_report(db, make_user, make_project) -> None:
    project = make_project(db)
    report = agreement.project_report(db, project)
    assert (report.total_prompts, report.human_rankings, report.annotators) == (0, 0, [])
    assert report.mean_agreement is None and report.mean_kendall_tau is None and report.krippendorff_alpha is None


# --- gold tasks --------------------------------------------------------------------------------------------


def test_set_gold_validates_and_names_the_field(db, make_user, make_project) -> None:
    project, lead, people, ids, prompts = _setup(db, make_user, make_project)
    p1 = prompts[1].id
    for tiers, field in [
        ([[ids[1], ids[2], ids[3]]], "tiers"),  # one tier: no order
        ([[ids[1]], []], "tiers[1]"),
        ([[ids[1]], [ids[4]]], "tiers[1][0]"),  # a completion of another prompt
        ([[ids[1]], [ids[2], ids[1]]], "tiers[1][1]"),  # a repeat
        ([[ids[1]], ["x"]], "tiers[1][0]"),
        ("1 > 2", "tiers"),
    ]:
        with pytest.raises(Invalid) as err:
            gold.set_gold(db, project, p1, tiers, lead)
        assert err.value.field == field, tiers
    with pytest.raises(NotFound):
        gold.set_gold(db, make_project(db, lead=lead), p1, [[ids[1]], [ids[2]]], lead)  # prompt of another project
    with pytest.raises(Forbidden):
        gold.set_gold(db, project, p1, [[ids[1]], [ids[2]]], people["A"])

    gold.clear_gold(db, project, p1, lead)
    assert prompts[1].gold_tiers is None
    # Cleared to SQL NULL (not JSON null), so the queue's `gold_tiers IS NULL` sees an ordinary prompt again.
    assert db.scalar(select(Prompt.id).where(Prompt.id == p1, Prompt.gold_tiers.is_(None))) == p1
    assert agreement.project_report(db, project).gold_prompts == 1  # the cleared prompt is no longer gold


def test_gold_from_metadata_marks_mixed_prompts_only(db, make_user, make_project) -> None:
    project = make_project(db, k=3)
    cases = {
        "mixed": [False, True, True],
        "all right": [True, True, True],
        "wrong length": [True, False],
        "mixed again": [True, False, "false"],
        "not a list": "yes",
    }
    prompts = {}
    for i, (name, flags) in enumerate(cases.items()):
        prompt = Prompt(project_id=project.id, text=name, text_hash=f"{i:064d}", meta={"is_correct": flags},
                        completions=[Completion(text=f"{name} {j}") for j in range(3)])
        db.add(prompt)
        prompts[name] = prompt
    db.add(Prompt(project_id=project.id, text="no metadata", text_hash="f" * 64))
    db.flush()

    assert gold.gold_from_metadata(db, project, limit=1) == 1
    first = [c.id for c in prompts["mixed"].completions]
    assert prompts["mixed"].gold_tiers == [[first[1], first[2]], [first[0]]]
    assert gold.gold_from_metadata(db, project) == 1  # only "mixed again" is left; "mixed" is already gold
    again = [c.id for c in prompts["mixed again"].completions]
    assert prompts["mixed again"].gold_tiers == [[again[0]], [again[1], again[2]]]
    assert prompts["all right"].gold_tiers is None and prompts["wrong length"].gold_tiers is None
    assert gold.gold_from_metadata(db, project) == 0


def test_gold_from_the_gsm8k_demo_metadata(db, make_user, make_project) -> None:
    import json

    from app.web.rendering import ROOT

    lines = (ROOT / "app" / "demo" / "gsm8k_demo.jsonl").read_text().splitlines()[:20]
    project = make_project(db, k=4)
    expected = 0
    for i, line in enumerate(lines):
        row = json.loads(line)
        flags = row["metadata"]["is_correct"]
        expected += any(flags) and not all(flags)
        db.add(Prompt(project_id=project.id, text=row["prompt"], text_hash=f"{i:064d}", meta=row["metadata"],
                      completions=[Completion(text=t) for t in row["completions"]]))
    db.flush()
    assert expected > 0
    assert gold.gold_from_metadata(db, project) == expected


# --- API and page ------------------------------------------------------------------------------------------


def test_agreement_api_roles_and_numbers(db, make_user, make_project, token_for, api) -> None:
    project, lead, people, _, _ = _setup(db, make_user, make_project)
    engineer = make_user(db, "engineer")
    projects.add_member(db, project, lead, email=engineer.email, role="engineer")
    outsider = make_user(db, "lead")
    admin = make_user(db, "admin")
    tokens = {who: token_for(db, u) for who, u in
              (("lead", lead), ("engineer", engineer), ("annotator", people["A"]), ("outsider", outsider),
               ("admin", admin))}
    db.commit()
    url = f"/api/projects/{project.id}/agreement"

    assert api(tokens["annotator"]).get(url).status_code == 403
    assert api(tokens["outsider"]).get(url).status_code == 404
    assert api(None).get(url).status_code == 401
    for who in ("lead", "engineer", "admin"):
        assert api(tokens[who]).get(url).status_code == 200, who

    body = api(tokens["lead"]).get(url).json()
    assert body["mean_agreement"] == pytest.approx(MEAN_AGREEMENT)
    assert body["krippendorff_alpha"] == pytest.approx(ALPHA)
    assert body["prompts_at_overlap"] == 2 and body["total_prompts"] == 3
    by = {a["user_id"]: a for a in body["annotators"]}
    assert by[people["C"].id]["gold_accuracy"] == pytest.approx(0.8)
    assert by[people["B"].id]["position_expected"] == pytest.approx(0.5)

    assert api(tokens["lead"]).get(url, params={"rubric_version": 1}).json()["rubric_version"] == 1
    bad = api(tokens["lead"]).get(url, params={"rubric_version": 9})
    assert bad.status_code == 422 and bad.json()["detail"][0]["field"] == "rubric_version"

    schema = api(None).get("/openapi.json").json()
    assert "krippendorff_alpha" in schema["components"]["schemas"]["AgreementOut"]["properties"]


def test_gold_api_set_clear_and_validation(db, make_user, make_project, token_for, api) -> None:
    project, lead, people, ids, prompts = _setup(db, make_user, make_project)
    other = make_project(db)
    lead_token, annotator_token = token_for(db, lead), token_for(db, people["A"])
    db.commit()
    client = api(lead_token)
    url = f"/api/projects/{project.id}/prompts/{prompts[2].id}/gold"

    ok = client.put(url, json={"tiers": [[ids[4]], [ids[5], ids[6]]]})
    assert ok.status_code == 200 and ok.json() == {"prompt_id": prompts[2].id,
                                                    "gold_tiers": [[ids[4]], [ids[5], ids[6]]],
                                                    "gold_step_labels": None}
    assert client.get(f"/api/projects/{project.id}/agreement").json()["gold_prompts"] == 3

    for body, field in [({"tiers": [[ids[4]]]}, "tiers"),
                        ({"tiers": [[ids[4]], [ids[1]]]}, "tiers[1][0]"),
                        ({"tiers": [[ids[4]], [ids[4]]]}, "tiers[1][0]"),
                        ({"tiers": "4>5"}, "tiers")]:
        r = client.put(url, json=body)
        assert r.status_code == 422 and r.json()["detail"][0]["field"] == field, body
    unknown = client.put(url, json={"tiers": [[ids[4]], [ids[5]]], "order": [1]})
    assert unknown.status_code == 422 and "order" in {d["field"] for d in unknown.json()["detail"]}

    assert api(annotator_token).put(url, json={"tiers": [[ids[4]], [ids[5]]]}).status_code == 403
    assert api(annotator_token).delete(url).status_code == 403
    assert client.put(f"/api/projects/{project.id}/prompts/999999/gold",
                      json={"tiers": [[1], [2]]}).status_code == 404
    assert client.put(f"/api/projects/{other.id}/prompts/{prompts[2].id}/gold",
                      json={"tiers": [[ids[4]], [ids[5]]]}).status_code == 404  # not a member there

    assert client.delete(url).status_code == 204
    assert client.get(f"/api/projects/{project.id}/agreement").json()["gold_prompts"] == 2


def test_dashboard_page_for_a_lead(db, make_user, make_project, browser) -> None:
    project, lead, people, _, _ = _setup(db, make_user, make_project)
    annotator_email = people["A"].email
    # A name that would break the page if it were not escaped.
    people["B"].name = "<script>alert(1)</script>"
    db.commit()

    page = browser()
    page.login(lead.email)
    r = page.get(f"/projects/{project.id}/agreement")
    assert r.status_code == 200
    html = r.text
    assert f"{MEAN_AGREEMENT * 100:.1f}%" in html  # 61.9%
    assert f"{ALPHA:.3f}" in html  # 0.625
    assert "2 / 3" in html  # prompts at overlap
    assert annotator_email in html
    assert "80.0%" in html  # A's agreement and C's gold accuracy
    assert "41.7%" in html  # B's agreement
    assert 'role="img"' in html and 'aria-label="gold accuracy: 80.0%"' in html
    assert "<script>alert(1)</script>" not in html and "&lt;script&gt;" in html
    assert '<th scope="col"' in html and '<th scope="row"' in html

    filtered = page.get(f"/projects/{project.id}/agreement", params={"rubric_version": "1"})
    assert filtered.status_code == 200 and "rubric version 1" in filtered.text
    assert page.get(f"/projects/{project.id}/agreement", params={"rubric_version": "5"}).status_code == 422

    annotator = browser()
    annotator.login(annotator_email)
    assert annotator.get(f"/projects/{project.id}/agreement").status_code == 403


def test_mark_gold_from_metadata_page_action(db, make_user, make_project, browser) -> None:
    lead = make_user(db, "lead")
    project = make_project(db, k=2, lead=lead)
    db.add(Prompt(project_id=project.id, text="q", text_hash="a" * 64, meta={"is_correct": [True, False]},
                  completions=[Completion(text="right"), Completion(text="wrong")]))
    db.commit()

    page = browser()
    page.login(lead.email)
    page.get(f"/projects/{project.id}/agreement")
    url = f"/projects/{project.id}/agreement/gold-from-metadata"
    assert page.post(url, csrf=False).status_code == 403  # no CSRF token
    r = page.post(url)
    assert r.status_code == 303 and r.headers["location"].endswith("?marked=1")
    done = page.get(r.headers["location"])
    assert "Marked 1 prompt as gold." in done.text
    assert 'id="gold-prompts">1<' in done.text


def test_rankings_submitted_through_the_queue_show_up_in_the_report(db, make_user, make_project, token_for,
                                                                    api) -> None:
    # Two annotators rank two K=2 prompts in opposite orders: X by ascending completion id, Y descending.
    # Prompt 0 is gold from metadata (is_correct [False, True] → gold [[second], [first]]): Y is right, X wrong.
    lead = make_user(db, "lead")
    project = make_project(db, k=2, overlap=2, lead=lead)
    x, y = make_user(db, "annotator"), make_user(db, "annotator")
    for person in (x, y):
        projects.add_member(db, project, lead, email=person.email, role="annotator")
    for i in range(2):
        db.add(Prompt(project_id=project.id, text=f"q{i}", text_hash=f"{i:064d}",
                      meta={"is_correct": [False, True]} if i == 0 else {},
                      completions=[Completion(text=f"a{i}.{j}") for j in range(2)]))
    db.flush()
    assert gold.gold_from_metadata(db, project, actor=lead) == 1
    tokens = {x.id: token_for(db, x), y.id: token_for(db, y)}
    lead_token = token_for(db, lead)
    db.commit()

    for person, reverse in ((x, False), (y, True)):
        client = api(tokens[person.id])
        while (task := client.get(f"/api/projects/{project.id}/tasks/next")).status_code == 200:
            t = task.json()
            ids = sorted((c["id"] for c in t["completions"]), reverse=reverse)
            r = client.post(f"/api/projects/{project.id}/rankings",
                            json={"assignment_id": t["assignment_id"], "tiers": [[i] for i in ids],
                                  "rubric_version": t["rubric"]["version"], "seconds_spent": 7,
                                  "submission_id": f"{person.id}-{t['assignment_id']}"})
            assert r.status_code == 201, r.text

    body = api(lead_token).get(f"/api/projects/{project.id}/agreement").json()
    assert (body["human_rankings"], body["comparisons"], body["prompts_at_overlap"]) == (4, 2, 2)
    assert body["mean_agreement"] == 0.0 and body["mean_kendall_tau"] == -1.0
    by = {a["user_id"]: a for a in body["annotators"]}
    assert (by[x.id]["gold_seen"], by[x.id]["gold_accuracy"]) == (1, 0.0)
    assert (by[y.id]["gold_seen"], by[y.id]["gold_accuracy"]) == (1, 1.0)
    assert by[x.id]["median_seconds"] is not None and by[x.id]["position_expected"] == 0.5
