"""Read a results folder into typed records, tolerating what a real campaign leaves behind.

A results folder is one shard (`manifest.json`, `telemetry.csv`, `servers/`, `jobs/<job>/`)
or a folder above shards (a `bench fetch` destination, a `bench run --out` root): every
`manifest.json` found below it marks a shard. One report covers one campaign.

Nothing is dropped: an arm the spec lists with no job folder is "not run", a job without a
readable summary keeps its `job.json` (with the reason it failed), and a file that does
not parse becomes a problem line in the report rather than an exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from contract.errors import BenchError
from contract.evals import EvalSummary
from contract.jobs import (
    JOB_FILE,
    MANIFEST_FILE,
    ArmFacts,
    EngineServed,
    JobRecord,
    Manifest,
)
from contract.layout import JOBS_DIR
from contract.results import REQUESTS_FILE, SUMMARY_FILE, ProbeSummary, SweepSummary
from contract.suite import SUITE_ITEMS, SuiteItem
from contract.telemetry import SERVER_METRICS_FILE, TELEMETRY_FILE, TelemetrySummary

__all__ = [
    "ITEMS",
    "ArmResults",
    "CampaignResults",
    "ResultsError",
    "ShardResults",
    "find_shards",
    "load_campaign_results",
    "requests_path",
]

_M = TypeVar("_M", bound=BaseModel)
Item = SuiteItem
ITEMS: tuple[Item, ...] = SUITE_ITEMS
_MAX_DEPTH = 4  # root/<campaign>/<shard>/manifest.json is depth 3; one spare level


class ResultsError(BenchError, ValueError):
    """The folder is not a results folder (or holds more than one campaign): one line."""


@dataclass(frozen=True)
class ArmResults:
    """One arm of one shard: its job records and whatever summaries they left."""

    shard: str
    arm: str
    label: str  # the arm's name, or "arm@shard" where two shards ran the same arm
    engine: EngineServed | None
    facts: ArmFacts | None = None  # from the manifest; None in manifests older than it
    instance_type: str = ""  # the shard's, e.g. g6.4xlarge, or "local"
    site: str = ""  # the results folder's label where a report reads several folders
    jobs: dict[str, JobRecord] = field(default_factory=dict)  # item -> record
    job_dirs: dict[str, Path] = field(default_factory=dict)  # item -> folder
    probe: ProbeSummary | None = None
    sweep: SweepSummary | None = None
    evals: dict[str, EvalSummary] = field(default_factory=dict)  # item -> summary

    @property
    def ran(self) -> bool:
        """Some job of this arm left a folder."""
        return bool(self.job_dirs)

    @property
    def drafter(self) -> bool:
        return self.engine is not None and self.engine.drafter is not None

    @property
    def where(self) -> str:
        """What the arm ran on, as the per-GPU tables name it: the folder label or the
        instance type."""
        return self.site or self.instance_type

    def status(self, item: str) -> str:
        """'ok', 'failed' or 'not run' for one suite item."""
        record = self.jobs.get(item)
        if record is None:
            return "not run"
        return record.status

    def reason(self, item: str) -> str | None:
        record = self.jobs.get(item)
        return record.reason if record else None

    def telemetry(self, item: str) -> TelemetrySummary | None:
        record = self.jobs.get(item)
        if record is None or record.telemetry is None:
            return None
        return record.telemetry


@dataclass(frozen=True)
class ShardResults:
    path: Path
    manifest: Manifest
    arms: list[ArmResults]
    site: str = ""  # the results folder's label where a report reads several folders

    @property
    def name(self) -> str:
        return f"{self.manifest.shard}@{self.site}" if self.site else self.manifest.shard

    @property
    def instance_type(self) -> str:
        return self.manifest.campaign.shard(self.manifest.shard).instance_type

    @property
    def telemetry_path(self) -> Path | None:
        path = self.path / TELEMETRY_FILE
        return path if path.is_file() else None

    @property
    def server_metrics_path(self) -> Path | None:
        path = self.path / SERVER_METRICS_FILE
        return path if path.is_file() else None

    @property
    def market(self) -> str | None:
        """'spot' or 'on-demand' from the manifest's instance identity; None off AWS.

        The agent copies IMDS's identity into `instance` (agent.aws.imds.InstanceIdentity:
        `lifecycle` is IMDS's instance-life-cycle); `market` is accepted too.
        """
        instance = self.manifest.instance or {}
        value = instance.get("market") or instance.get("lifecycle")
        if value is None:
            return None
        return "spot" if value == "spot" else "on-demand"

    @property
    def region(self) -> str | None:
        instance = self.manifest.instance or {}
        if instance.get("region"):
            return instance["region"]
        zone = instance.get("availability_zone")
        return zone[:-1] if zone else None

    @property
    def availability_zone(self) -> str | None:
        return (self.manifest.instance or {}).get("availability_zone")


@dataclass(frozen=True)
class CampaignResults:
    root: Path
    shards: list[ShardResults]
    problems: list[str] = field(default_factory=list)
    folders: list[tuple[str, Path]] = field(default_factory=list)  # (label, path), several

    @property
    def campaign(self) -> str:
        return " + ".join(dict.fromkeys(s.manifest.campaign.name for s in self.shards))

    def arms(self) -> list[ArmResults]:
        return [arm for shard in self.shards for arm in shard.arms]

    def arm(self, label: str) -> ArmResults | None:
        return next((a for a in self.arms() if a.label == label), None)


def find_shards(root: Path) -> list[Path]:
    """Every folder at or below `root` (a few levels) that holds a manifest.json."""
    if (root / MANIFEST_FILE).is_file():
        return [root]
    found: list[Path] = []

    def walk(folder: Path, depth: int) -> None:
        if depth > _MAX_DEPTH:
            return
        for child in sorted(p for p in folder.iterdir() if p.is_dir()):
            if child.name == JOBS_DIR.rstrip("/"):
                continue  # job folders never hold a shard
            if (child / MANIFEST_FILE).is_file():
                found.append(child)
            else:
                walk(child, depth + 1)

    walk(root, 1)
    return found


def _read_model(path: Path, model: type[_M], problems: list[str]) -> _M | None:
    try:
        return model.model_validate_json(path.read_bytes())
    except (OSError, ValidationError, ValueError) as exc:
        problems.append(f"{path}: unreadable {model.__name__} ({_first_line(exc)})")
        return None


def _first_line(exc: BaseException) -> str:
    return (str(exc).splitlines() or [type(exc).__name__])[0][:200]


def _job_folders(shard_dir: Path) -> Iterator[Path]:
    jobs = shard_dir / JOBS_DIR
    if jobs.is_dir():
        yield from sorted(p for p in jobs.iterdir() if p.is_dir())


def _load_shard(path: Path, problems: list[str]) -> ShardResults | None:
    manifest = _read_model(path / MANIFEST_FILE, Manifest, problems)
    if manifest is None:
        return None
    listed = [s for s in manifest.campaign.shards if s.name == manifest.shard]
    if not listed:
        problems.append(f"{path}: shard {manifest.shard!r} is not in its own campaign spec")
        return None
    spec_arms = list(listed[0].arms)
    engines = {e.arm: e for e in manifest.engines}
    facts = {a.arm: a for a in manifest.arms}
    per_arm: dict[str, dict[str, tuple[Path, JobRecord | None]]] = {a: {} for a in spec_arms}
    for folder in _job_folders(path):
        record: JobRecord | None = None
        if (folder / JOB_FILE).is_file():
            record = _read_model(folder / JOB_FILE, JobRecord, problems)
        arm, item = _split_job(folder.name, record)
        if arm is None or item is None:
            problems.append(f"{folder}: not a job of this shard's arms and suite items")
            continue
        slot = per_arm.setdefault(arm, {})
        slot[item] = (folder, record)
    arms: list[ArmResults] = []
    for arm, found in per_arm.items():
        jobs: dict[str, JobRecord] = {}
        dirs: dict[str, Path] = {}
        probe: ProbeSummary | None = None
        sweep: SweepSummary | None = None
        evals: dict[str, EvalSummary] = {}
        engine = engines.get(arm)
        for item, (folder, record) in found.items():
            dirs[item] = folder
            if record is not None:
                jobs[item] = record
                engine = engine or record.engine
            summary = folder / SUMMARY_FILE
            if not summary.is_file():
                continue
            if item == "probe":
                probe = _read_model(summary, ProbeSummary, problems)
            elif item == "sweep":
                sweep = _read_model(summary, SweepSummary, problems)
            else:
                read = _read_model(summary, EvalSummary, problems)
                if read is not None:
                    evals[item] = read
        arms.append(
            ArmResults(
                shard=manifest.shard,
                arm=arm,
                label=arm,
                engine=engine,
                facts=facts.get(arm),
                instance_type=listed[0].instance_type,
                jobs=jobs,
                job_dirs=dirs,
                probe=probe,
                sweep=sweep,
                evals=evals,
            )
        )
    return ShardResults(path=path, manifest=manifest, arms=arms)


def _split_job(name: str, record: JobRecord | None) -> tuple[str | None, str | None]:
    """A job folder's (arm, item): from its job.json, else from the folder name."""
    if record is not None:
        return record.arm, record.item
    for item in ITEMS:
        suffix = f"-{item}"
        if name.endswith(suffix) and name[: -len(suffix)]:
            return name[: -len(suffix)], item
    return None, None


def load_campaign_results(root: Path) -> CampaignResults:
    """Every shard below `root`, checked to be one campaign.

    Raises:
        ResultsError: no manifest.json below `root`, or shards of several campaigns.
    """
    if not root.is_dir():
        raise ResultsError(f"{root}: not a folder")
    paths = find_shards(root)
    if not paths:
        raise ResultsError(
            f"{root}: no {MANIFEST_FILE} found (expected a shard folder, or a folder above "
            "shards such as a `bench fetch` or `bench run --out` destination)"
        )
    problems: list[str] = []
    shards = [s for p in paths if (s := _load_shard(p, problems)) is not None]
    if not shards:
        raise ResultsError(f"{root}: no readable manifest: {'; '.join(problems)}")
    campaigns = sorted({s.manifest.campaign.name for s in shards})
    if len(campaigns) > 1:
        raise ResultsError(
            f"{root} holds {len(campaigns)} campaigns ({', '.join(campaigns)}): "
            "point at one campaign's folder"
        )
    # Keep the spec's shard order, so tables read in the order the campaign was written.
    order = [s.name for s in shards[0].manifest.campaign.shards]
    shards.sort(key=lambda s: order.index(s.name) if s.name in order else len(order))
    _label_arms(shards)
    return CampaignResults(root=root, shards=shards, problems=problems)


def _label_arms(shards: list[ShardResults]) -> None:
    """An arm run on two shards (two GPU types) is told apart as 'arm@shard'."""
    seen: dict[str, int] = {}
    for shard in shards:
        for arm in shard.arms:
            seen[arm.arm] = seen.get(arm.arm, 0) + 1
    for shard in shards:
        shard.arms[:] = [
            replace(a, label=f"{a.arm}@{a.shard}") if seen[a.arm] > 1 else a for a in shard.arms
        ]


def requests_path(arm: ArmResults, item: str) -> Path | None:
    folder = arm.job_dirs.get(item)
    if folder is None:
        return None
    path = folder / REQUESTS_FILE
    return path if path.is_file() else None
