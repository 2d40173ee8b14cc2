"""The report's typed rows: what each table shows, before any formatting, and the two pieces
of arithmetic every table shares (the run-to-run spread test and dollars per million tokens).

Run-to-run spread, and when a ratio is "not a difference":
- probe: the geometric mean over the six prompts of each repeat on its own (n = repeats),
  min to max; the table's e2e figure stays the summary's (per-prompt medians, then the
  geometric mean);
- sweep cell: its repeats' aggregate tok/s, min to max (n = repeats);
- relative spread = (max - min) / the figure. A ratio r of two figures differs only if
  |r - 1| exceeds the larger relative spread of the two; otherwise the report marks it
  as not a difference (≈). With no spread known (one repeat), it is not marked either way.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from contract.evals import Comparison
from report.load import CampaignResults
from report.prices import HourlyPrice, SpotPaid

__all__ = [
    "AccuracyRow",
    "BestCell",
    "BestRow",
    "CostPoint",
    "CrossRow",
    "DrafterRow",
    "EnergyCell",
    "EvalTimeRow",
    "JobEnergy",
    "Pick",
    "ProbeRow",
    "Report",
    "ShardCost",
    "SiteBest",
    "Slo",
    "SloRow",
    "Spread",
    "SweepCell",
    "SweepGrid",
    "UseCase",
    "WaitRow",
    "beyond_spread",
    "usd_per_million",
]


@dataclass(frozen=True, slots=True)
class Spread:
    """Run-to-run spread of one figure: the lowest and highest of n repeats."""

    low: float
    high: float
    n: int

    def relative(self, centre: float | None) -> float | None:
        if centre is None or centre <= 0 or self.n < 2:
            return None
        return (self.high - self.low) / centre


def beyond_spread(ratio: float | None, *relative_spreads: float | None) -> bool | None:
    """True if the ratio differs from 1 by more than every given relative spread; None when
    it cannot be told (no ratio, or no spread known for either side)."""
    known = [s for s in relative_spreads if s is not None]
    if ratio is None or not known:
        return None
    return abs(ratio - 1.0) > max(known)


def usd_per_million(usd_per_hour: float, tok_s: float | None) -> float | None:
    """$ per million output tokens = price per hour / (3600 x tok/s) x 1e6."""
    if tok_s is None or tok_s <= 0:
        return None
    return usd_per_hour / (3600.0 * tok_s) * 1e6


# --- rows -------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProbeRow:
    label: str
    engine: str | None
    status: str  # ok, failed, not run
    reason: str | None = None
    e2e_tok_s: float | None = None
    e2e_spread: Spread | None = None
    x_baseline: float | None = None
    differs: bool | None = None  # x_baseline beyond the run-to-run spread
    decode_tok_s: float | None = None
    ttft_ms: float | None = None
    at_once: int | None = None
    at_once_tok_s: float | None = None
    x_one: float | None = None
    memory_mib: float | None = None
    memory_kind: str | None = None  # "gpu" (peak GPU memory), "rss" (engine RSS, no GPU)
    ready_s: float | None = None
    repeat_identical: int | None = None
    prompts: int | None = None
    texts_sha256: str | None = None  # the probe's digest of its greedy texts
    requests_ok: int = 0
    requests_failed: int = 0

    @property
    def relative_spread(self) -> float | None:
        return self.e2e_spread.relative(self.e2e_tok_s) if self.e2e_spread else None


@dataclass(frozen=True)
class DrafterRow:
    engine: str
    plain: str | None  # the no-drafter arm
    plain_tok_s: float | None
    plain_status: str | None  # its probe's status where it has no figure
    best: str | None  # the fastest drafter arm
    best_tok_s: float | None
    tokens: str | None  # "4 tokens", "1 token", "its own"
    gain: float | None
    differs: bool | None
    acceptance_rate: float | None = None  # the best drafter arm's, where recorded
    mean_accepted_length: float | None = None
    acceptance_recorded: bool = False


@dataclass(frozen=True)
class SweepCell:
    label: str
    shape: str
    concurrency: int
    status: str  # ok, partial, infeasible, failed, not run, job failed
    reason: str | None = None
    tok_s: float | None = None
    spread: Spread | None = None
    # Each percentile below: the median over repeats of each window's own percentile.
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p99_ms: float | None = None
    itl_p99_ms: float | None = None
    latency_p99_ms: float | None = None
    # Per-user decode speed = 1000 / TPOT: p50 from TPOT p50; p90 is the speed 90% of users
    # get at least (from TPOT p90, the slow tail).
    user_decode_p50_tok_s: float | None = None
    user_decode_p90_tok_s: float | None = None
    goodput_request_per_s: float | None = None  # as measured, under the run's own SLO
    requests_failed: int = 0  # over the measured windows (a partial cell's lost requests)
    meets_slo: bool | None = None  # None: no SLO given, or no figure to judge

    @property
    def relative_spread(self) -> float | None:
        return self.spread.relative(self.tok_s) if self.spread else None

    @property
    def ranked(self) -> bool:
        """Only a complete cell is compared with others: a partial one lost requests."""
        return self.status == "ok" and self.tok_s is not None


@dataclass(frozen=True)
class Slo:
    """Latency objectives a cell must meet, each judged on the cell's p99 (the median over
    repeats of each window's p99): TTFT, TPOT and end-to-end latency, in ms."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None

    @property
    def given(self) -> bool:
        return any(v is not None for v in (self.ttft_ms, self.tpot_ms, self.e2el_ms))

    def describe(self) -> str:
        named = (("TTFT", self.ttft_ms), ("TPOT", self.tpot_ms), ("E2EL", self.e2el_ms))
        parts = [f"{name} p99 <= {value:g} ms" for name, value in named if value is not None]
        return ", ".join(parts) if parts else "no SLO"

    def judge(self, cell: SweepCell) -> bool | None:
        """False when a given objective is missed; True when every one holds; None when none
        is given, or a figure needed to tell is missing."""
        if not self.given or cell.tok_s is None:
            return None
        pairs = (
            (self.ttft_ms, cell.ttft_p99_ms),
            (self.tpot_ms, cell.tpot_p99_ms),
            (self.e2el_ms, cell.latency_p99_ms),
        )
        given = [(limit, value) for limit, value in pairs if limit is not None]
        if any(value is not None and value > limit for limit, value in given):
            return False
        return None if any(value is None for _, value in given) else True


@dataclass(frozen=True)
class SloRow:
    """One engine (on one GPU) and shape: its highest level meeting the SLO."""

    engine: str
    shape: str
    concurrency: int | None  # None: no level met the SLO
    label: str | None = None
    tok_s: float | None = None
    user_decode_p50_tok_s: float | None = None
    ttft_p99_ms: float | None = None
    on_demand_usd_per_m: float | None = None
    joules_per_token: float | None = None
    levels_tried: int = 0


@dataclass(frozen=True)
class SweepGrid:
    """One shape: every arm at every level, nothing dropped."""

    shape: str
    levels: list[int]
    arms: list[str]
    cells: dict[tuple[str, int], SweepCell]  # (label, level) -> cell
    counts: dict[str, dict[str, int] | None]  # label -> measured/failed/infeasible
    arm_notes: dict[str, str]  # label -> why the whole column is empty


@dataclass(frozen=True)
class BestCell:
    label: str
    tok_s: float
    relative_spread: float | None
    drafter: str  # "4 drafted", "none"


@dataclass(frozen=True)
class BestRow:
    shape: str
    concurrency: int
    per_engine: dict[str, BestCell | None]
    winner: str | None  # engine with the highest figure
    clear: bool | None  # the winner's margin over the runner-up beats the spread


@dataclass(frozen=True)
class AccuracyRow:
    eval: str
    label: str
    status: str  # ok, failed, not run
    reason: str | None = None
    score: float | None = None
    correct: int | None = None
    answered: int | None = None
    questions: int | None = None
    complete: bool | None = None
    truncated: int | None = None
    failed: int | None = None
    wall_s: float | None = None
    comparison: Comparison | None = None  # against the baseline arm's run
    comparison_note: str | None = None


@dataclass(frozen=True)
class EvalTimeRow:
    engine: str
    plain: str | None
    plain_s: float | None
    drafted: str | None
    drafted_s: float | None
    speedup: float | None


@dataclass(frozen=True)
class CostPoint:
    label: str
    shard: str
    shape: str
    concurrency: int
    tok_s: float
    on_demand_usd_per_m: float | None
    spot_usd_per_m: float | None


@dataclass(frozen=True)
class ShardCost:
    shard: str
    instance_type: str
    region: str | None
    market: str | None
    started_unix_s: float
    finished_unix_s: float | None
    hours: float | None
    install_hours: float
    on_demand: HourlyPrice | None
    spot: SpotPaid | None

    def on_demand_usd(self, with_install: bool = True) -> float | None:
        hours = self._hours(with_install)
        return (
            None if self.on_demand is None or hours is None else self.on_demand.usd_per_hour * hours
        )

    def spot_usd(self, with_install: bool = True) -> float | None:
        if self.spot is None:
            return None
        if with_install:
            return self.spot.usd_total
        hours = self._hours(False)
        return None if hours is None else self.spot.usd_per_hour_mean * hours

    def _hours(self, with_install: bool) -> float | None:
        if self.hours is None:
            return None
        return self.hours if with_install else max(0.0, self.hours - self.install_hours)


@dataclass(frozen=True)
class EnergyCell:
    label: str
    shape: str
    concurrency: int
    joules_per_token: float | None
    energy_j: float | None
    output_tokens: int | None


@dataclass(frozen=True)
class JobEnergy:
    label: str
    item: str
    joules_per_token: float | None
    energy_j: float | None
    output_tokens: int | None
    mean_power_w: float | None
    gpu_samples: int


@dataclass(frozen=True)
class CrossRow:
    arm: str  # the arm's name without its site
    engine: str
    site: str
    reference: str  # the site every ratio is taken to
    one_tok_s: float | None
    one_ratio: float | None
    one_differs: bool | None
    load_shape: str | None
    load_level: int | None
    load_tok_s: float | None
    load_status: str  # the cell's status where it has no ranked figure
    load_ratio: float | None
    load_differs: bool | None
    evals: dict[str, str] = field(default_factory=dict)  # item -> "0.8000 (level)"


@dataclass(frozen=True)
class Pick:
    label: str
    tok_s: float
    usd_per_m: float | None = None
    level: int | None = None
    shape: str | None = None


@dataclass(frozen=True)
class SiteBest:
    """One site's best arm per use case, with its $/M tokens at that site's price."""

    site: str
    shape: str | None
    one_request: Pick | None
    top_load: Pick | None
    under_slo: Pick | None


@dataclass(frozen=True)
class UseCase:
    use: str
    pick: Pick | None
    site: str | None
    why: str


@dataclass(frozen=True)
class WaitRow:
    label: str
    shape: str
    first_waiting_level: int | None  # None: no window saw a request wait
    peak_waiting: float | None
    peak_kv_pct: float | None
    levels_seen: int  # cells with server samples inside their windows


@dataclass(frozen=True)
class RateRow:
    """One rate-mode cell: latency percentiles at one offered request rate."""

    label: str
    shape: str
    max_concurrency: int  # 0: no cap
    rate: float  # requests per second asked for
    status: str
    reason: str | None = None
    offered_rate: float | None = None
    served_rate: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    tpot_p50_ms: float | None = None
    tpot_p99_ms: float | None = None
    e2el_p50_ms: float | None = None
    e2el_p99_ms: float | None = None
    lag_p99_ms: float | None = None
    over_saturated: bool = False
    requests_failed: int = 0


@dataclass
class Report:
    campaign: str
    description: str
    baseline: str
    arms: list[str]
    probe: list[ProbeRow]
    drafters: list[DrafterRow]
    sweeps: list[SweepGrid]
    best: dict[str, list[BestRow]]  # shape -> rows
    engines: list[str]  # engines in the best-per-level tables, in order
    accuracy: dict[str, list[AccuracyRow]]  # eval item -> rows
    eval_times: list[EvalTimeRow]
    shard_costs: list[ShardCost]
    cost_points: list[CostPoint]
    energy_cells: list[EnergyCell]
    job_energy: list[JobEnergy]
    gpu_sampled: bool
    scope: list[str]
    not_measured: list[str]
    price_notes: list[str]
    problems: list[str]
    results: CampaignResults
    shapes: list[str] = field(default_factory=list)
    slo: Slo = field(default_factory=lambda: Slo())
    slo_rows: list[SloRow] = field(default_factory=list)
    cross: list[CrossRow] = field(default_factory=list)
    site_best: list[SiteBest] = field(default_factory=list)
    use_cases: list[UseCase] = field(default_factory=list)
    waits: list[WaitRow] = field(default_factory=list)
    rates: list[RateRow] = field(default_factory=list)  # rate-mode cells, every arm
