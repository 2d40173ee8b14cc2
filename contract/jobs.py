"""What the campaign runner records per job and per shard: `jobs/<job>/job.json` and
`manifest.json`. Reports read these; the runner writes them as each job ends."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from contract.frozen import FrozenModel
from contract.spec import CampaignSpec
from contract.suite import SuiteItem
from contract.telemetry import GpuDeviceInfo, SamplerStats, TelemetrySummary

__all__ = [
    "AGENT_LOG_FILE",
    "JOB_FILE",
    "MANIFEST_FILE",
    "SERVER_LOG_FILE",
    "ArmFacts",
    "EngineServed",
    "HostInfo",
    "JobRecord",
    "Manifest",
    "RunSpan",
]

JOB_FILE = "job.json"
AGENT_LOG_FILE = "agent.log"
MANIFEST_FILE = "manifest.json"
SERVER_LOG_FILE = "server.log"
SettingValue = str | int | float | bool | None


class _Record(FrozenModel):
    """This module\'s records: frozen, unknown fields refused (contract.frozen)."""


class EngineServed(_Record):
    """Exactly what served an arm: the manifest's build ids and flags."""

    arm: str
    engine: str
    version: str
    build_id: str
    variant: str
    argv: list[str]
    settings: dict[str, SettingValue]
    model: str
    drafter: str | None = None
    install_s: float | None = None
    version_text: str | None = Field(None, description="what the recipe's version probe printed")
    binary_sha256: str | None = Field(None, description="sha256 of the server executable")
    port: int | None = Field(
        None, description="where it listened: the recipe's port when free, else a free one"
    )
    gpu_memory_released: bool | None = Field(
        None, description="GPU memory back within 1 GiB of before the server (NVML), per stop"
    )
    # Install facts (None in manifests written before they were recorded).
    patches: list[str] | None = Field(None, description="patches applied to the engine")
    extra_packages: list[str] | None = Field(
        None, description="packages installed beside the engine's own release"
    )
    built_from_source: bool | None = Field(None, description="anything compiled at install")


class JobRecord(_Record):
    """One job (arm x suite item): how it went, and the server's readiness around it."""

    job_id: str
    arm: str
    item: SuiteItem
    status: Literal["ok", "failed"]
    reason: str | None = None
    started_unix_s: float
    finished_unix_s: float
    engine: EngineServed | None = None
    health_s: float | None = None
    first_completion_s: float | None = None
    ready_s: float | None = None
    output_tokens: int | None = None
    server_log_tail: str | None = Field(None, description="last lines, for failed jobs")
    telemetry: TelemetrySummary | None = Field(None, description="the job's telemetry")


class ArmFacts(_Record):
    """What an arm is, from its engine's recipe, recorded when the campaign runs, so reports
    read it instead of parsing arm names (and need not know the engines)."""

    arm: str
    engine: str = Field(description="the recipe's name, e.g. 'llamacpp'")
    display_name: str = Field(description="the engine as a reader knows it, e.g. 'llama.cpp'")
    drafter: bool = Field(False, description="served with a speculative drafter")
    draft_tokens: int | None = Field(
        None, description="tokens drafted per step; None with a drafter: the engine's own choice"
    )


class HostInfo(_Record):
    hostname: str
    os: str
    python: str
    cpu: str
    cpus: int
    memory_mib: int


class RunSpan(_Record):
    """One run of the shard's runner into the folder: a rerun adds one, never replaces."""

    started_unix_s: float
    finished_unix_s: float | None = None
    jobs_run: list[str] = Field(default_factory=list, description="jobs this run attempted")


class Manifest(_Record):
    """`manifest.json`: enough to say exactly what was measured, where and when."""

    agent_version: str
    git_sha: str | None
    campaign: CampaignSpec
    shard: str
    host: HostInfo
    gpus: list[GpuDeviceInfo] = Field(description="every GPU the sampler found")
    nvidia_driver: str | None = None
    cuda: str | None = None
    instance: dict[str, str] | None = Field(None, description="from IMDSv2 on AWS")
    started_unix_s: float
    finished_unix_s: float | None = None
    engines: list[EngineServed] = Field(default_factory=list)
    arms: list[ArmFacts] = Field(
        default_factory=list, description="every arm of the shard (empty in older manifests)"
    )
    jobs: list[str] = Field(default_factory=list, description="every job of the shard, in order")
    jobs_ok: list[str] = Field(default_factory=list)
    jobs_failed: list[str] = Field(default_factory=list)
    sampler: SamplerStats | None = Field(None, description="what sampling cost, at the end")
    runs: list[RunSpan] = Field(
        default_factory=list,
        description="every run into this folder, in order: started is the first's, finished "
        "the last's, engines every build any of them served",
    )
