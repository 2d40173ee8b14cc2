"""Paired comparison of eval runs: a candidate against a named baseline, question by question.

Owns the statistics of answer quality:

- flips: questions wrong in the baseline and right in the candidate, and the reverse;
- exact McNemar test: under "no difference" each flip goes either way with probability 1/2,
  so the two-sided p-value is 2 * P(X <= min(flips)) for X ~ Binomial(flips, 1/2), capped at 1;
- a 95% interval for the difference of the two scores: Newcombe's hybrid score interval for
  paired proportions (Newcombe 1998, method 10: Wilson score intervals for each score,
  squared and added with the pairs' estimated correlation, which Newcombe shrinks by n/2
  when positive). It stays inside [-1, 1] and behaves at scores near 0 and 1, where the
  Wald interval does not;
- "level" when the interval contains zero, else "better" or "worse";
- the time each run took to finish, and their ratio;
- a run-to-run range from two runs of the same arm: the noise floor to read a difference by.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

import orjson

from contract.evals import (
    ANSWERS_FILE,
    AnswerRecord,
    Comparison,
    DataError,
    EvalName,
    EvalSummary,
    NoiseFloor,
    RunSide,
    Verdict,
)
from contract.results import SUMMARY_FILE

__all__ = [
    "CI_METHOD",
    "EvalRun",
    "PairedCounts",
    "compare_runs",
    "describe",
    "load_run",
    "mcnemar_exact",
    "newcombe_paired_ci",
    "noise_floor",
    "paired_counts",
    "verdict",
    "wilson_interval",
]

CI_METHOD = "Newcombe hybrid score interval for paired proportions (1998, method 10)"
Z_95 = 1.959963984540054  # the 97.5th percentile of the standard normal


@dataclass(frozen=True, slots=True)
class EvalRun:
    """One eval run as read back from its job folder."""

    label: str
    eval: EvalName
    marks: dict[str, dict[str, bool]]  # question_id -> mark -> correct
    headline: str
    wall_s: float | None
    complete: bool


def load_run(job_dir: Path, label: str | None = None) -> EvalRun:
    """Read answers.jsonl (and summary.json where present) of one eval job."""
    answers_path = job_dir / ANSWERS_FILE
    if not answers_path.is_file():
        raise DataError(f"{job_dir} has no {ANSWERS_FILE}")
    marks: dict[str, dict[str, bool]] = {}
    names: set[EvalName] = set()
    for number, line in enumerate(answers_path.read_bytes().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = AnswerRecord.model_validate(orjson.loads(line))
        except ValueError as exc:
            raise DataError(f"{answers_path}:{number}: not an answer record ({exc})") from exc
        marks[record.question_id] = dict(record.marks)
        names.add(record.eval)
    summary: EvalSummary | None = None
    summary_path = job_dir / SUMMARY_FILE
    if summary_path.is_file():
        summary = EvalSummary.model_validate(orjson.loads(summary_path.read_bytes()))
    if summary is not None:
        eval_name, headline = summary.eval, summary.headline
    elif len(names) == 1:
        eval_name = names.pop()
        headline = "flexible-extract" if eval_name == "gsm8k" else "ast"
    else:
        raise DataError(f"{job_dir}: cannot tell which eval its answers belong to")
    return EvalRun(
        label=label or job_dir.name,
        eval=eval_name,
        marks=marks,
        headline=headline,
        wall_s=summary.wall_s if summary else None,
        complete=summary.complete if summary else False,
    )


@dataclass(frozen=True, slots=True)
class PairedCounts:
    """The paired 2x2 table: candidate (first) against baseline (second)."""

    both: int
    candidate_only: int  # flipped to correct
    baseline_only: int  # flipped to wrong
    neither: int

    @property
    def n(self) -> int:
        return self.both + self.candidate_only + self.baseline_only + self.neither


def mcnemar_exact(candidate_only: int, baseline_only: int) -> float:
    """Exact two-sided McNemar p-value from the two flip counts (1.0 when nothing flipped)."""
    flips = candidate_only + baseline_only
    if flips == 0:
        return 1.0
    smaller = min(candidate_only, baseline_only)
    tail = Fraction(sum(math.comb(flips, i) for i in range(smaller + 1)), 2**flips)
    return float(min(Fraction(1), 2 * tail))


def wilson_interval(successes: int, n: int, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for one proportion."""
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At 0 and n the bound is exactly 0 or 1; rounding would leave 1e-16 of a gap.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high


def newcombe_paired_ci(counts: PairedCounts, z: float = Z_95) -> tuple[float, float] | None:
    """Interval for (candidate score - baseline score) on paired questions; None if n = 0."""
    n = counts.n
    if n == 0:
        return None
    a, b, c, d = counts.both, counts.candidate_only, counts.baseline_only, counts.neither
    p1, p2 = (a + b) / n, (a + c) / n
    l1, u1 = wilson_interval(a + b, n, z)
    l2, u2 = wilson_interval(a + c, n, z)
    margins = (a + b) * (c + d) * (a + c) * (b + d)
    # Newcombe's estimate of the correlation: 0 when a margin is empty; a positive
    # association is shrunk by n/2 (and to 0 below that), a negative one is used as it is.
    # (As Altman's "Statistics with Confidence" and Fagerland et al. compute it.)
    excess = a * d - b * c
    if not margins or 0 <= excess <= n / 2:
        phi = 0.0
    elif excess > n / 2:
        phi = (excess - n / 2) / math.sqrt(margins)
    else:
        phi = excess / math.sqrt(margins)
    difference = p1 - p2
    delta = math.sqrt(max(0.0, (p1 - l1) ** 2 - 2 * phi * (p1 - l1) * (u2 - p2) + (u2 - p2) ** 2))
    epsilon = math.sqrt(max(0.0, (u1 - p1) ** 2 - 2 * phi * (u1 - p1) * (p2 - l2) + (p2 - l2) ** 2))
    return max(-1.0, difference - delta), min(1.0, difference + epsilon)


def verdict(interval: tuple[float, float] | None) -> Verdict:
    if interval is None or interval[0] <= 0.0 <= interval[1]:
        return "level"
    return "better" if interval[0] > 0.0 else "worse"


def _mark(run: EvalRun, mark: str | None) -> str:
    return mark or run.headline


def paired_counts(
    candidate: EvalRun, baseline: EvalRun, mark: str
) -> tuple[PairedCounts, list[str], list[str], int]:
    """The 2x2 table over questions both runs answered, the flipped ids, and the unpaired."""
    shared = sorted(set(candidate.marks) & set(baseline.marks), key=_question_order)
    unpaired = len(set(candidate.marks) ^ set(baseline.marks))
    both = neither = 0
    to_correct: list[str] = []
    to_wrong: list[str] = []
    for qid in shared:
        ours = candidate.marks[qid].get(mark, False)
        theirs = baseline.marks[qid].get(mark, False)
        if ours and theirs:
            both += 1
        elif ours:
            to_correct.append(qid)
        elif theirs:
            to_wrong.append(qid)
        else:
            neither += 1
    counts = PairedCounts(both, len(to_correct), len(to_wrong), neither)
    return counts, to_correct, to_wrong, unpaired


def _question_order(qid: str) -> tuple[str, int]:
    # 'gsm8k-12' before 'gsm8k-100': the data set's order, not the string order.
    head, _, tail = qid.rpartition("-" if "-" in qid else "_")
    return (head, int(tail)) if tail.isdigit() else (qid, -1)


def _score(correct: int, n: int) -> float | None:
    return correct / n if n else None


def noise_floor(first: EvalRun, second: EvalRun, mark: str | None = None) -> NoiseFloor:
    """Two runs of one arm: their scores, how far apart, and how many questions flipped."""
    _same_eval(first, second)
    chosen = _mark(first, mark)
    counts, up, down, _ = paired_counts(second, first, chosen)
    n = counts.n
    s1 = _score(counts.both + counts.baseline_only, n)
    s2 = _score(counts.both + counts.candidate_only, n)
    difference = s2 - s1 if s1 is not None and s2 is not None else None
    return NoiseFloor(
        labels=(first.label, second.label),
        scores=(s1, s2),
        difference=difference,
        range=abs(difference) if difference is not None else None,
        flipped=len(up) + len(down),
        n=n,
    )


def _same_eval(a: EvalRun, b: EvalRun) -> None:
    if a.eval != b.eval:
        raise DataError(
            f"cannot compare a {a.eval} run ({a.label}) with a {b.eval} run ({b.label})"
        )


def compare_runs(
    baseline: EvalRun,
    candidate: EvalRun,
    *,
    mark: str | None = None,
    repeat: tuple[EvalRun, EvalRun] | None = None,
) -> Comparison:
    """Candidate against baseline on the questions both answered; `repeat` = two runs of one
    arm for the run-to-run range."""
    _same_eval(baseline, candidate)
    chosen = _mark(baseline, mark)
    counts, to_correct, to_wrong, unpaired = paired_counts(candidate, baseline, chosen)
    n = counts.n
    interval = newcombe_paired_ci(counts)
    base_correct = counts.both + counts.baseline_only
    cand_correct = counts.both + counts.candidate_only
    base_score, cand_score = _score(base_correct, n), _score(cand_correct, n)
    time_ratio = (
        candidate.wall_s / baseline.wall_s
        if candidate.wall_s is not None and baseline.wall_s
        else None
    )
    return Comparison(
        eval=baseline.eval,
        mark=chosen,
        baseline=RunSide(
            label=baseline.label,
            score=base_score,
            correct=base_correct,
            n=n,
            wall_s=baseline.wall_s,
        ),
        candidate=RunSide(
            label=candidate.label,
            score=cand_score,
            correct=cand_correct,
            n=n,
            wall_s=candidate.wall_s,
        ),
        paired=n,
        unpaired=unpaired,
        difference=cand_score - base_score
        if cand_score is not None and base_score is not None
        else None,
        flipped_to_correct=to_correct,
        flipped_to_wrong=to_wrong,
        mcnemar_p=mcnemar_exact(counts.candidate_only, counts.baseline_only),
        ci_low=interval[0] if interval else None,
        ci_high=interval[1] if interval else None,
        ci_method=CI_METHOD,
        verdict=verdict(interval),
        time_ratio=time_ratio,
        noise=noise_floor(*repeat, mark=chosen) if repeat else None,
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def describe(comparison: Comparison) -> list[str]:
    """A few plain lines for logs and reports."""
    c = comparison
    lines = [
        f"{c.eval} ({c.mark}), {c.paired} questions paired"
        + (f", {c.unpaired} unpaired left out" if c.unpaired else ""),
        f"  baseline  {c.baseline.label}: {_pct(c.baseline.score)}"
        + (f" in {c.baseline.wall_s:.0f} s" if c.baseline.wall_s is not None else ""),
        f"  candidate {c.candidate.label}: {_pct(c.candidate.score)}"
        + (f" in {c.candidate.wall_s:.0f} s" if c.candidate.wall_s is not None else "")
        + (f" ({c.time_ratio:.2f}x the time)" if c.time_ratio is not None else ""),
    ]
    if c.difference is not None and c.ci_low is not None and c.ci_high is not None:
        lines.append(
            f"  difference {100 * c.difference:+.1f} points, 95% CI "
            f"[{100 * c.ci_low:+.1f}, {100 * c.ci_high:+.1f}] -> {c.verdict}; "
            f"flips +{len(c.flipped_to_correct)} / -{len(c.flipped_to_wrong)}, "
            f"McNemar exact p = {c.mcnemar_p:.3g}"
        )
    if c.noise is not None and c.noise.range is not None:
        lines.append(
            f"  run-to-run ({c.noise.labels[0]} vs {c.noise.labels[1]}): "
            f"{100 * c.noise.range:.1f} points apart, {c.noise.flipped} questions flipped"
        )
    return lines
