"""The paired comparison's statistics on hand-computed cases, and runs read back from job folders.

Expected intervals were computed separately with 40-digit decimal arithmetic from Newcombe's
formulas (the tables are the examples Fagerland, Lydersen & Laake use for paired 2x2 data,
plus a made-up one with a negative correlation); McNemar p-values by hand from binomial sums.
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from contract.evals import (
    ANSWERS_FILE,
    AnswerRecord,
    DataError,
    EvalSummary,
    GSM8KSettings,
    MarkCount,
)
from contract.paired import (
    CI_METHOD,
    PairedCounts,
    compare_runs,
    describe,
    load_run,
    mcnemar_exact,
    newcombe_paired_ci,
    noise_floor,
    verdict,
    wilson_interval,
)
from contract.results import SUMMARY_FILE


@pytest.mark.parametrize(
    ("up", "down", "p"),
    [
        (0, 0, 1.0),
        (0, 5, 2 / 32),  # 2 * P(X = 0), X ~ Bin(5, 1/2)
        (5, 0, 2 / 32),
        (1, 9, 2 * (1 + 10) / 1024),
        (2, 5, 2 * (1 + 7 + 21) / 128),
        (3, 3, 1.0),  # 2 * 42/64 > 1: capped
        (0, 20, 2 / 2**20),
    ],
)
def test_mcnemar_exact(up: int, down: int, p: float):
    assert mcnemar_exact(up, down) == pytest.approx(p, rel=1e-12)


def test_wilson_interval():
    low, high = wilson_interval(40, 100)
    assert low == pytest.approx(0.3094012864324589, abs=1e-12)
    assert high == pytest.approx(0.4979974132089382, abs=1e-12)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == 1.0


@pytest.mark.parametrize(
    ("table", "low", "high"),
    [
        # (both right, candidate only, baseline only, both wrong)
        ((30, 10, 5, 55), -0.027408110343940275, 0.1263785936908354),  # phi > 0, shrunk by n/2
        ((1, 1, 7, 12), -0.5069202266861409, -0.025559124164859826),  # 0 <= ad-bc <= n/2: phi 0
        ((59, 6, 16, 80), -0.11862119563870993, -0.004625113933050062),
        ((2, 8, 9, 1), -0.41226227406064136, 0.32712669751100465),  # phi < 0
        ((5, 0, 0, 0), -0.43448246478317476, 0.43448246478317476),  # an empty margin: phi 0
        ((0, 3, 0, 0), 0.20592328245977828, 1.0),
    ],
)
def test_newcombe_paired_interval(table: tuple[int, int, int, int], low: float, high: float):
    interval = newcombe_paired_ci(PairedCounts(*table))
    assert interval is not None
    assert interval[0] == pytest.approx(low, abs=1e-12)
    assert interval[1] == pytest.approx(high, abs=1e-12)


def test_interval_is_none_without_pairs_and_verdicts_read_it():
    assert newcombe_paired_ci(PairedCounts(0, 0, 0, 0)) is None
    assert verdict(None) == "level"
    assert verdict((-0.02, 0.12)) == "level"
    assert verdict((0.0, 0.1)) == "level"
    assert verdict((0.01, 0.1)) == "better"
    assert verdict((-0.5, -0.03)) == "worse"


# --- runs from job folders ---


def write_run(
    job: Path, marks: dict[str, bool], *, wall_s: float = 100.0, eval_name: str = "gsm8k"
) -> Path:
    job.mkdir(parents=True)
    lines = []
    for index, (qid, ok) in enumerate(marks.items()):
        record = AnswerRecord(
            eval=eval_name,  # type: ignore[arg-type]
            index=index,
            question_id=qid,
            reply="#### 1" if ok else "",
            correct=ok,
            reason="hand-made",
            marks={"flexible-extract": ok, "strict-match": False},
            truncated=False,
        )
        lines.append(orjson.dumps(record.model_dump(mode="json")))
    (job / ANSWERS_FILE).write_bytes(b"\n".join(lines) + b"\n")
    correct = sum(marks.values())
    summary = EvalSummary(
        eval=eval_name,  # type: ignore[arg-type]
        base_url="http://127.0.0.1:1",
        model="m",
        settings=GSM8KSettings(),
        prompt="zero-shot",
        data="fixture",
        checker="test",
        headline="flexible-extract",
        questions=len(marks),
        answered=len(marks),
        correct=correct,
        score=correct / len(marks),
        marks={"flexible-extract": MarkCount(correct=correct, n=len(marks), score=None)},
        truncated=0,
        failed=0,
        completion_tokens=0,
        started_unix_s=0.0,
        wall_s=wall_s,
        complete=True,
    )
    (job / SUMMARY_FILE).write_bytes(orjson.dumps(summary.model_dump(mode="json")))
    return job


def _marks(correct_ids: set[int], n: int = 20) -> dict[str, bool]:
    return {f"gsm8k-{i}": i in correct_ids for i in range(n)}


def test_compare_runs_pairs_question_by_question(tmp_path: Path):
    base = load_run(write_run(tmp_path / "base", _marks(set(range(10)))), label="vllm")
    # Candidate: loses questions 0, 1; gains 10, 11, 12, 13, 14, 15.
    cand_ok = set(range(2, 10)) | set(range(10, 16))
    cand = load_run(write_run(tmp_path / "cand", _marks(cand_ok), wall_s=41.0), label="vllm-d4")
    result = compare_runs(base, cand)
    assert result.mark == "flexible-extract"
    assert (result.baseline.score, result.candidate.score) == (0.5, 0.7)
    assert result.difference == pytest.approx(0.2)
    assert result.flipped_to_correct == [f"gsm8k-{i}" for i in range(10, 16)]
    assert result.flipped_to_wrong == ["gsm8k-0", "gsm8k-1"]
    assert result.mcnemar_p == pytest.approx(2 * (1 + 8 + 28) / 256)
    assert (result.ci_low, result.ci_high) == newcombe_paired_ci(PairedCounts(8, 6, 2, 4))
    assert result.ci_low == pytest.approx(-0.0804283929571392, abs=1e-12)
    assert result.ci_high == pytest.approx(0.4395641345019551, abs=1e-12)
    assert result.ci_method == CI_METHOD and result.ci_level == 0.95
    assert result.verdict == "level"  # +20 points on 20 questions is not yet a difference
    assert result.time_ratio == pytest.approx(0.41)
    assert result.paired == 20 and result.unpaired == 0
    lines = describe(result)
    assert "0.41x the time" in lines[2] and "flips +6 / -2" in lines[3]


def test_same_answers_are_level_with_p_one(tmp_path: Path):
    marks = _marks({1, 3, 5, 7})
    a = load_run(write_run(tmp_path / "a", marks))
    b = load_run(write_run(tmp_path / "b", marks))
    result = compare_runs(a, b)
    assert result.difference == 0 and result.mcnemar_p == 1.0 and result.verdict == "level"
    assert result.flipped_to_correct == result.flipped_to_wrong == []


def test_a_clear_loss_is_worse(tmp_path: Path):
    base = load_run(write_run(tmp_path / "base", _marks(set(range(60)), n=100)))
    cand = load_run(write_run(tmp_path / "cand", _marks(set(range(30)), n=100)))
    result = compare_runs(base, cand)
    assert result.verdict == "worse" and result.ci_high is not None and result.ci_high < 0
    assert result.mcnemar_p == pytest.approx(2 / 2**30)


def test_unpaired_questions_are_left_out_and_counted(tmp_path: Path):
    base = load_run(write_run(tmp_path / "base", _marks({0, 1}, n=10)))
    partial = {k: v for k, v in _marks({0, 1, 2}, n=10).items() if k != "gsm8k-9"}
    cand = load_run(write_run(tmp_path / "cand", partial))
    result = compare_runs(base, cand)
    assert result.paired == 9 and result.unpaired == 1
    assert result.flipped_to_correct == ["gsm8k-2"]


def test_the_strict_mark_can_be_compared_instead(tmp_path: Path):
    base = load_run(write_run(tmp_path / "base", _marks({0})))
    cand = load_run(write_run(tmp_path / "cand", _marks({1})))
    result = compare_runs(base, cand, mark="strict-match")
    assert result.mark == "strict-match" and result.difference == 0


def test_run_to_run_range_from_two_runs_of_one_arm(tmp_path: Path):
    base = load_run(write_run(tmp_path / "base", _marks(set(range(10)))), label="base")
    again = load_run(write_run(tmp_path / "again", _marks(set(range(1, 11)))), label="again")
    cand = load_run(write_run(tmp_path / "cand", _marks(set(range(12)))), label="cand")
    floor = noise_floor(base, again)
    assert floor.scores == (0.5, 0.5) and floor.difference == 0 and floor.range == 0
    assert floor.flipped == 2 and floor.n == 20
    result = compare_runs(base, cand, repeat=(base, again))
    assert result.noise == floor
    assert "2 questions flipped" in describe(result)[-1]


def test_runs_of_different_evals_do_not_compare(tmp_path: Path):
    a = load_run(write_run(tmp_path / "a", _marks({0})))
    b = load_run(write_run(tmp_path / "b", {"simple_python_0": True}, eval_name="bfcl_simple"))
    with pytest.raises(DataError, match="cannot compare a gsm8k run"):
        compare_runs(a, b)


def test_load_run_needs_answers_and_reads_a_run_without_summary(tmp_path: Path):
    with pytest.raises(DataError, match=r"has no answers\.jsonl"):
        load_run(tmp_path)
    job = write_run(tmp_path / "crashed", _marks({0, 2}, n=4))
    (job / SUMMARY_FILE).unlink()
    run = load_run(job)
    assert run.headline == "flexible-extract" and run.wall_s is None and not run.complete
    assert sum(m["flexible-extract"] for m in run.marks.values()) == 2
