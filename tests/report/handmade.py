"""A hand-written results folder that a real campaign could leave behind, with every awkward
case the report must show rather than drop, and the raw inputs kept for the tests' own
arithmetic.

Campaign `handmade-g6`, two shards:
- `g6`: g6.4xlarge on-demand in us-east-1d, arms llama, llama-d2, vllm, vllm-d4, sglang and
  mistralrs. vLLM's 64-request cell of 512/128 is infeasible; SGLang's probe job failed,
  its 64-request cell of 128/512 failed, its GSM8K job failed and its BFCL never ran;
  mistralrs is listed but left no folder (a missing arm).
- `t4spot`: g4dn.xlarge spot in us-east-1a, arm llama (so the two llama arms are told apart
  as llama@g6 and llama@t4spot); its GSM8K job failed on a spot interruption, and its
  64-request cell of 128/512 is partial (one request lost per window).
The sweep carries an SLO (TTFT 3 s, TPOT 60 ms) that some cells meet and others miss.

The files are written through the contract's own models, so they are exactly what the agent
writes; the numbers are chosen, and `Handmade` keeps the choices so the tests can compute
every expected figure with plain arithmetic, independently of the report's code.
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass, field
from pathlib import Path

from contract.evals import AnswerRecord, BFCLSettings, EvalSummary, GSM8KSettings, MarkCount
from contract.jobs import EngineServed, HostInfo, JobRecord, Manifest
from contract.results import (
    CellResult,
    Distribution,
    ProbePrompt,
    ProbeSummary,
    RequestRecord,
    SweepSummary,
    WindowStats,
)
from contract.spec import CampaignSpec, parse_campaign
from contract.telemetry import TELEMETRY_COLUMNS
from contract.telemetry_samples import GpuSample, HostSample
from contract.telemetry_summary import summarize

__all__ = ["GPU_STEP_NS", "Handmade", "write_handmade"]

SPEC = """
name = "handmade-g6"
description = "Hand-written results: failed and infeasible cells, a missing arm, a spot shard"
[model]
name = "gemma-4-e2b"
sources = { default = "org/gemma-4-e2b-w4a16" }
[drafter]
name = "gemma-4-e2b-drafter"
sources = { default = "org/gemma-4-e2b-drafter" }
[[shards]]
name = "g6"
instance_type = "g6.4xlarge"
arms = ["llama", "llama-d2", "vllm", "vllm-d4", "sglang", "mistralrs"]
[[shards]]
name = "t4spot"
instance_type = "g4dn.xlarge"
arms = ["llama"]
[suite.probe]
output_tokens = 256
repeats = 3
at_once = 4
[suite.sweep]
shapes = ["512/128", "128/512"]
levels = [1, 8, 64]
repeats = 3
slo_ttft_ms = 3000
slo_tpot_ms = 60
[suite.gsm8k]
limit = 10
[suite.bfcl]
limit = 10
"""

T0_UNIX = 1_794_000_000.0  # 2026-11-06 UTC, as the seeds' sweeps
P0_NS = 10**12  # perf_counter of the shard's start
GPU_STEP_NS = 250_000_000  # one GPU row every 250 ms (the sampler's 100 ms is not needed)
SWEEP_POWER_W = 72.0
IDLE_POWER_W = 20.0
PROBE_POWER_W = 40.0
EVAL_POWER_W = 55.0
EDGE_S = 0.037  # windows start off the sample grid, so the bracket is never ambiguous

PROMPT_FACTORS = (1.0, 0.96, 1.03, 0.99, 1.02, 0.98)
# Per arm: one-request e2e base and each repeat's factor (vLLM is the noisy one).
PROBE = {
    ("g6", "llama"): (135.0, (1.0, 0.99, 1.01)),
    ("g6", "llama-d2"): (207.0, (1.0, 0.99, 1.01)),
    ("g6", "vllm"): (140.0, (1.0, 0.95, 1.05)),
    ("g6", "vllm-d4"): (275.0, (1.0, 0.99, 1.01)),
    ("t4spot", "llama"): (105.0, (1.0, 0.99, 1.01)),
}
# The probe's digest of its greedy texts: a drafter keeps its arm's text; the T4 differs.
PROBE_TEXTS = {
    ("g6", "llama"): "1" * 64,
    ("g6", "llama-d2"): "1" * 64,
    ("g6", "vllm"): "2" * 64,
    ("g6", "vllm-d4"): "2" * 64,
    ("t4spot", "llama"): "3" * 64,
}
MEMORY_MIB = {"llama": 2930.0, "llama-d2": 3004.0, "vllm": 18228.0, "vllm-d4": 18918.0}
MEMORY_MIB |= {"sglang": 18345.0}
READY_S = {"llama": 6.1, "llama-d2": 4.1, "vllm": 167.3, "vllm-d4": 132.5, "sglang": 307.2}
INSTALL_S = {"llama": 492.0, "llama-d2": 0.0, "vllm": 142.0, "vllm-d4": 0.0, "sglang": 39.0}
AT_ONCE_X = 3.2
REPEAT_FACTORS = (1.0, 0.97, 1.02)
# Aggregate tok/s medians per (arm, shape, level).
SWEEP: dict[str, dict[str, tuple[float | None, ...]]] = {
    "llama": {"in512-out128": (125.4, 428.1, 630.8), "in128-out512": (133.8, 597.5, 1056.3)},
    "llama-d2": {"in512-out128": (224.0, 600.0, 600.0), "in128-out512": (271.0, 791.0, 1170.0)},
    "vllm": {"in512-out128": (132.8, 738.3, None), "in128-out512": (138.8, 991.0, 3715.7)},
    "vllm-d4": {"in512-out128": (345.0, 610.0, 1500.0), "in128-out512": (453.0, 2399.0, 3500.0)},
    "sglang": {"in512-out128": (129.6, 708.3, 1373.0), "in128-out512": (134.6, 967.4, None)},
}
T4_SWEEP = {"in512-out128": (91.8, 204.2, 281.9), "in128-out512": (86.9, 240.2, 381.3)}
INFEASIBLE = ("vllm", "in512-out128", 64, "context length 16384 < 64 x 640 tokens")
FAILED_CELL = ("sglang", "in128-out512", 64, "ReadError: server closed the connection")
# A cell that measured but lost one request in each window: never ranked, its count shown.
PARTIAL = ("llama@t4spot", "in128-out512", 64)
# Each window's TPOT percentiles as multiples of its mean per-request TPOT (level x 1000 /
# aggregate tok/s), and ITL's p99 likewise: so p50, p90 and p99 differ and can be told apart.
TPOT_P90_X = 1.1
TPOT_P99_X = 1.25
ITL_P99_X = 1.5
# GSM8K and BFCL marks per arm (10 questions each) and the time to finish.
GSM8K = {
    "llama": ((1, 1, 1, 0, 1, 1, 0, 1, 1, 1), 300.0),
    "llama-d2": ((1, 1, 1, 1, 1, 1, 0, 1, 1, 1), 150.0),
    "vllm": ((0, 1, 1, 0, 1, 1, 0, 1, 1, 1), 290.0),
    "vllm-d4": ((1, 1, 1, 1, 1, 1, 0, 0, 1, 1), 100.0),
}
BFCL = {
    "llama": ((1,) * 10, 40.0),
    "llama-d2": ((1,) * 10, 30.0),
    "vllm": ((1, 1, 1, 0, 0, 0, 0, 0, 0, 0), 41.0),
    "vllm-d4": ((1,) * 9 + (0,), 20.0),
}


@dataclass
class Window:
    shape: str
    level: int
    repeat: int
    start_ns: int
    end_ns: int
    output_tokens: int


@dataclass
class Handmade:
    root: Path
    spec: CampaignSpec
    shard_dirs: dict[str, Path]
    shard_start_unix: dict[str, float]
    shard_end_unix: dict[str, float]
    probe_e2e: dict[str, list[list[float]]] = field(default_factory=dict)  # label -> [p][r]
    windows: dict[str, list[Window]] = field(default_factory=dict)  # label -> windows
    gpu_times_ns: dict[str, list[int]] = field(default_factory=dict)  # shard -> sample times

    def per_repeat_geomeans(self, label: str) -> list[float]:
        values = self.probe_e2e[label]
        repeats = len(values[0])
        return [
            math.prod(values[p][r] for p in range(len(values))) ** (1 / len(values))
            for r in range(repeats)
        ]


def _dist(value: float, n: int = 1) -> Distribution:
    return Distribution(n=n, mean=value, min=value, max=value, p50=value, p90=value, p99=value)


def _spread_dist(value: float, n: int, p90_x: float, p99_x: float) -> Distribution:
    return Distribution(
        n=n, mean=value, min=value, max=value * p99_x, p50=value, p90=value * p90_x,
        p99=value * p99_x,
    )


class _Clock:
    """Seconds since the shard started -> the perf ns and unix times of the records."""

    def __init__(self, start_unix: float) -> None:
        self.start_unix = start_unix
        self.now_s = 0.0

    def ns(self, t_s: float) -> int:
        return P0_NS + round(t_s * 1e9)

    def unix(self, t_s: float) -> float:
        return self.start_unix + t_s


class _Shard:
    def __init__(self, root: Path, spec: CampaignSpec, name: str, start_unix: float) -> None:
        self.dir = root / spec.name / name
        self.spec = spec
        self.name = name
        self.clock = _Clock(start_unix)
        self.jobs: list[tuple[str, float, float, float]] = []  # job, start s, end s, power
        self.memory: list[tuple[float, float, float]] = []  # start s, end s, MiB
        self.engines: list[EngineServed] = []
        self.records: list[JobRecord] = []

    def engine(self, arm: str, engine: str, install_s: float) -> EngineServed:
        drafter = "org/gemma-4-e2b-drafter" if "-d" in arm else None
        served = EngineServed(
            arm=arm,
            engine=engine,
            version={"llamacpp": "7182ef71e", "vllm": "0.33.0", "sglang": "0.5.23"}[engine],
            build_id=f"{engine}-build",
            variant="sm_89" if self.name == "g6" else "sm_75",
            argv=[engine, "--port", "8000"],
            settings={"draft_tokens": int(arm.rsplit("-d", 1)[1])} if drafter else {},
            model="org/gemma-4-e2b-w4a16",
            drafter=drafter,
            install_s=install_s,
        )
        self.engines.append(served)
        self.clock.now_s += install_s
        return served

    def job_dir(self, job: str) -> Path:
        path = self.dir / "jobs" / job
        path.mkdir(parents=True, exist_ok=True)
        return path

    def begin(self, seconds: float, power_w: float, job: str) -> tuple[float, float]:
        start = self.clock.now_s
        end = start + seconds
        self.jobs.append((job, start, end, power_w))
        self.clock.now_s = end + 2.0
        return start, end

    def record(
        self,
        arm: str,
        item: str,
        start: float,
        end: float,
        served: EngineServed,
        *,
        status: str = "ok",
        reason: str | None = None,
        output_tokens: int | None = None,
    ) -> JobRecord:
        ready = READY_S.get(arm, 5.0)
        record = JobRecord(
            job_id=f"{arm}-{item}",
            arm=arm,
            item=item,  # type: ignore[arg-type]
            status=status,  # type: ignore[arg-type]
            reason=reason,
            started_unix_s=self.clock.unix(start),
            finished_unix_s=self.clock.unix(end),
            engine=served,
            health_s=ready / 2,
            first_completion_s=ready / 2,
            ready_s=ready,
            output_tokens=output_tokens,
            server_log_tail="Traceback ... (last lines)" if status == "failed" else None,
        )
        self.records.append(record)
        return record

    # -- telemetry ---------------------------------------------------------------------

    def _job_at(self, t_s: float) -> tuple[str | None, float]:
        for job, start, end, power in self.jobs:
            if start <= t_s <= end:
                return job, power
        return None, IDLE_POWER_W

    def _memory_at(self, t_s: float) -> float:
        for start, end, mib in self.memory:
            if start <= t_s <= end:
                return mib
        return 0.0

    def telemetry(self) -> tuple[list[GpuSample | HostSample], list[int]]:
        samples: list[GpuSample | HostSample] = []
        times: list[int] = []
        energy_mj = 5_000_000_000
        end_ns = round(self.clock.now_s * 1e9)
        step = 0
        while step * GPU_STEP_NS <= end_ns:
            t_ns = step * GPU_STEP_NS
            t_s = t_ns / 1e9
            job, power = self._job_at(t_s)
            samples.append(
                GpuSample(
                    time_unix_s=self.clock.unix(t_s),
                    time_perf_ns=P0_NS + t_ns,
                    job_id=job,
                    gpu_index=0,
                    gpu_util_pct=90.0 if job else 0.0,
                    mem_used_mib=self._memory_at(t_s),
                    power_w=power,
                    energy_mj=energy_mj,
                    temp_c=55.0,
                )
            )
            times.append(P0_NS + t_ns)
            if step % 4 == 0:
                samples.append(
                    HostSample(
                        time_unix_s=self.clock.unix(t_s),
                        time_perf_ns=P0_NS + t_ns,
                        job_id=job,
                        cpu_pct=30.0,
                        ram_used_mib=9000.0,
                        engine_rss_mib=1500.0 if job else None,
                    )
                )
            # The counter over the next step at this step's power: energy is exact per step.
            energy_mj += round(power * GPU_STEP_NS / 1e6)
            step += 1
        return samples, times

    def finish(self, instance: dict[str, str] | None) -> list[int]:
        samples, times = self.telemetry()
        with (self.dir / "telemetry.csv").open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=TELEMETRY_COLUMNS)
            writer.writeheader()
            for sample in samples:
                writer.writerow(sample.to_row())
        for record in self.records:
            summary = summarize(record.job_id, samples, record.output_tokens)
            final = record.model_copy(update={"telemetry": summary})
            (self.job_dir(record.job_id) / "job.json").write_text(final.model_dump_json(indent=2))
            if final.status == "ok":
                (self.job_dir(record.job_id) / "done").touch()
        manifest = Manifest(
            agent_version="0.1.0",
            git_sha="0123456789abcdef0123456789abcdef01234567",
            campaign=self.spec,
            shard=self.name,
            host=HostInfo(
                hostname="ip-10-0-0-1",
                os="Linux-6.17-x86_64",
                python="3.14.0",
                cpu="x86_64",
                cpus=16,
                memory_mib=65536,
            ),
            gpus=[
                {
                    "index": 0,
                    "name": "NVIDIA L4" if self.name == "g6" else "Tesla T4",
                    "uuid": "GPU-0",
                    "memory_total_mib": 23034.0 if self.name == "g6" else 15360.0,
                    "unsupported": [],
                }
            ],
            nvidia_driver="595.112.07",
            cuda="13.1",
            instance=instance,
            started_unix_s=self.clock.unix(0.0),
            finished_unix_s=self.clock.unix(self.clock.now_s),
            engines=self.engines,
            jobs=[
                f"{a}-{i}" for a in self.spec.shard(self.name).arms for i in self.spec.suite.items()
            ],
            jobs_ok=sorted(r.job_id for r in self.records if r.status == "ok"),
            jobs_failed=[r.job_id for r in self.records if r.status == "failed"],
        )
        (self.dir / "manifest.json").write_text(manifest.model_dump_json(indent=2))
        return times


def _write_jsonl(path: Path, records: list) -> None:
    with path.open("a") as handle:
        for record in records:
            handle.write(record.model_dump_json() + "\n")


def _probe(shard: _Shard, arm: str, served: EngineServed, out: Handmade, label: str) -> None:
    base, jitter = PROBE[(shard.name, arm)]
    values = [[base * f * j for j in jitter] for f in PROMPT_FACTORS]
    out.probe_e2e[label] = values
    folder = shard.job_dir(f"{arm}-probe")
    total_s = sum(256 / v for row in values for v in row) + 5.0
    start, end = shard.begin(total_s, PROBE_POWER_W, f"{arm}-probe")
    shard.memory.append((start, end + 2.0, MEMORY_MIB[arm]))
    t = start + 0.5
    records = []
    for r in range(3):
        for p, row in enumerate(values):
            latency = 256 / row[r]
            send = shard.clock.ns(t)
            records.append(
                RequestRecord(
                    request_id=f"probe-p{p}-r{r}",
                    label=f"probe/p{p}/r{r}",
                    endpoint="chat",
                    dispatch_ns=send,
                    send_ns=send,
                    first_chunk_ns=send + 30_000_000,
                    first_token_ns=send + 30_000_000,
                    first_content_ns=send + 30_000_000,
                    last_token_ns=send + round(latency * 1e9),
                    end_ns=send + round(latency * 1e9) + 1000,
                    completion_tokens=256,
                    prompt_tokens=40,
                    text="same text",
                )
            )
            t += latency + 0.01
    _write_jsonl(folder / "requests.jsonl", records)
    medians = [sorted(row)[1] for row in values]
    e2e = math.prod(medians) ** (1 / 6)
    summary = ProbeSummary(
        base_url="http://127.0.0.1:8000",
        model="gemma",
        endpoint="chat",
        started_unix_s=shard.clock.unix(start),
        finished_unix_s=shard.clock.unix(end),
        settings=shard.spec.suite.probe,  # type: ignore[arg-type]
        prompts=[
            ProbePrompt(
                index=p,
                e2e_tok_s_median=medians[p],
                decode_tok_s_median=medians[p] * 1.01,
                ttft_ms_median=30.0,
                repeats_ok=3,
                repeat_identical=True,
            )
            for p in range(6)
        ],
        e2e_tok_s=e2e,
        decode_tok_s=e2e * 1.01,
        ttft_ms=30.0,
        at_once_aggregate_tok_s=e2e * AT_ONCE_X,
        at_once_x_one=AT_ONCE_X,
        repeat_identical=6,
        texts_sha256=PROBE_TEXTS[(shard.name, arm)],
        requests_failed=0,
    )
    (folder / "summary.json").write_text(summary.model_dump_json(indent=2))
    shard.record(arm, "probe", start, end, served)


def _sweep(
    shard: _Shard,
    arm: str,
    served: EngineServed,
    out: Handmade,
    label: str,
    table: dict[str, tuple[float | None, ...]],
) -> None:
    folder = shard.job_dir(f"{arm}-sweep")
    spec = shard.spec.suite.sweep
    assert spec is not None
    # Plan the job's length first: every window and its warm-up, 1 s apart.
    plan = []
    for shape in spec.shapes:
        for level, median in zip(spec.levels, table[shape.name], strict=True):
            plan.append((shape, level, median))
    # The same steps as the loop below: a warm-up burst, 1 s, the window, 0.2 s.
    seconds = 1.0 + EDGE_S
    for shape, level, median in plan:
        if median is None:
            seconds += 2.0
            continue
        for factor in REPEAT_FACTORS:
            duration = level * shape.output_tokens / (median * factor)
            seconds += 2 * duration + 1.2
    start, end = shard.begin(seconds, SWEEP_POWER_W, f"{arm}-sweep")
    shard.memory.append((start, end + 2.0, MEMORY_MIB.get(arm, 2900.0)))
    t = start + 0.5 + EDGE_S
    cells: list[CellResult] = []
    records: list[RequestRecord] = []
    out.windows[label] = []
    total_tokens = 0
    for shape, level, median in plan:
        base = {"shape": shape.name, "input_tokens": shape.input_tokens}
        base |= {"output_tokens": shape.output_tokens, "concurrency": level, "mode": "burst"}
        special = next(
            (s for s in (INFEASIBLE, FAILED_CELL) if s[:3] == (arm, shape.name, level)), None
        )
        if median is None and special is not None:
            status = "infeasible" if special is INFEASIBLE else "failed"
            cells.append(CellResult(**base, status=status, reason=special[3]))
            t += 2.0
            continue
        assert median is not None
        windows = []
        partial = (label, shape.name, level) == PARTIAL
        for repeat, factor in enumerate(REPEAT_FACTORS):
            tok_s = median * factor
            tokens = level * shape.output_tokens
            duration_s = tokens / tok_s
            t += duration_s + 1.0  # the warm-up burst before each window, not measured
            send = shard.clock.ns(t)
            finish = send + round(duration_s * 1e9)
            for i in range(level):
                records.append(
                    RequestRecord(
                        request_id=f"{shape.name}/c{level}/r{repeat}/{i}",
                        label=f"{shape.name}/c{level}/r{repeat}",
                        endpoint="chat",
                        dispatch_ns=send,
                        send_ns=send,
                        first_token_ns=send + 20_000_000,
                        last_token_ns=finish if i == 0 else finish - 1000 * i,
                        end_ns=finish + 1000,
                        completion_tokens=shape.output_tokens,
                        prompt_tokens=shape.input_tokens,
                        error="ReadError: connection reset" if partial and i == level - 1 else None,
                    )
                )
            duration_exact = (finish - send) / 1e9
            out.windows[label].append(Window(shape.name, level, repeat, send, finish, tokens))
            windows.append(
                WindowStats(
                    repeat=repeat,
                    mode="burst",
                    concurrency=level,
                    requests_ok=level - 1 if partial else level,
                    requests_failed=1 if partial else 0,
                    duration_s=duration_exact,
                    output_tokens=tokens,
                    input_tokens=level * shape.input_tokens,
                    aggregate_output_tok_s=tokens / duration_exact,
                    request_per_s=level / duration_exact,
                    goodput_request_per_s=None,
                    in_flight_mean=float(level),
                    usage_mismatches=0,
                    prefix_cache_hit_tokens=0,
                    ttft_ms=Distribution(
                        n=level,
                        mean=20.0 * level,
                        min=20.0,
                        max=40.0 * level,
                        p50=20.0 * level,
                        p90=30.0 * level,
                        p99=40.0 * level,
                    ),
                    tpot_ms=_spread_dist(1000 / tok_s * level, level, TPOT_P90_X, TPOT_P99_X),
                    itl_ms=_spread_dist(1000 / tok_s * level, level, 1.0, ITL_P99_X),
                    latency_ms=_dist(duration_exact * 1000, level),
                    e2e_tok_s=_dist(tok_s / level, level),
                    input_tokens_per_request=_dist(float(shape.input_tokens), level),
                )
            )
            total_tokens += tokens
            t += duration_s + 0.2
        values = sorted(w.aggregate_output_tok_s or 0.0 for w in windows)
        cells.append(
            CellResult(
                **base,
                status="partial" if partial else "ok",
                reason="3 requests failed" if partial else None,
                repeats=windows,
                aggregate_output_tok_s_median=values[1],
                aggregate_output_tok_s_min=values[0],
                aggregate_output_tok_s_max=values[-1],
                ttft_ms_p50_median=20.0 * level,
                tpot_ms_p50_median=1000 / median * level,
            )
        )
    _write_jsonl(folder / "requests.jsonl", records)
    counts = {
        "measured": sum(c.status in ("ok", "partial") for c in cells),
        "failed": sum(c.status == "failed" for c in cells),
        "infeasible": sum(c.status == "infeasible" for c in cells),
    }
    summary = SweepSummary(
        base_url="http://127.0.0.1:8000",
        model="gemma",
        endpoint="chat",
        started_unix_s=shard.clock.unix(start),
        finished_unix_s=shard.clock.unix(end),
        wall_anchor_unix_s=shard.clock.unix(0.0),
        wall_anchor_ns=P0_NS,
        settings=spec,
        calibration=None,
        cells=cells,
        counts=counts,
    )
    (folder / "summary.json").write_text(summary.model_dump_json(indent=2))
    shard.record(arm, "sweep", start, end, served, output_tokens=total_tokens)


def _eval(
    shard: _Shard, arm: str, item: str, served: EngineServed, marks: tuple[int, ...], wall: float
) -> None:
    folder = shard.job_dir(f"{arm}-{item}")
    start, end = shard.begin(wall + 1.0, EVAL_POWER_W, f"{arm}-{item}")
    shard.memory.append((start, end + 2.0, MEMORY_MIB.get(arm, 2900.0)))
    name = "gsm8k" if item == "gsm8k" else "bfcl_simple"
    mark = "flexible-extract" if item == "gsm8k" else "ast"
    answers = [
        AnswerRecord(
            eval=name,  # type: ignore[arg-type]
            index=i,
            question_id=f"{'gsm8k' if item == 'gsm8k' else 'simple_python'}-{i}",
            reply="...",
            correct=bool(ok),
            reason="matches" if ok else "wrong number",
            marks={mark: bool(ok)},
            completion_tokens=100,
            latency_s=wall / len(marks),
            truncated=False,
        )
        for i, ok in enumerate(marks)
    ]
    _write_jsonl(folder / "answers.jsonl", answers)
    correct = sum(marks)
    settings = (
        GSM8KSettings(limit=len(marks)) if item == "gsm8k" else BFCLSettings(limit=len(marks))
    )
    summary = EvalSummary(
        eval=name,  # type: ignore[arg-type]
        base_url="http://127.0.0.1:8000",
        model="gemma",
        settings=settings,
        prompt="zero-shot" if item == "gsm8k" else "tools",
        data="fixture",
        checker="fixture",
        headline=mark,
        questions=len(marks),
        answered=len(marks),
        correct=correct,
        score=correct / len(marks),
        marks={mark: MarkCount(correct=correct, n=len(marks), score=correct / len(marks))},
        truncated=0,
        failed=0,
        completion_tokens=100 * len(marks),
        started_unix_s=shard.clock.unix(start),
        finished_unix_s=shard.clock.unix(start + wall),
        wall_s=wall,
        complete=True,
    )
    (folder / "summary.json").write_text(summary.model_dump_json(indent=2))
    shard.record(arm, item, start, end, served, output_tokens=100 * len(marks))


def _failed(shard: _Shard, arm: str, item: str, served: EngineServed, reason: str) -> None:
    shard.job_dir(f"{arm}-{item}")
    start, end = shard.begin(3.0, IDLE_POWER_W, f"{arm}-{item}")
    shard.record(arm, item, start, end, served, status="failed", reason=reason)


def write_handmade(root: Path) -> Handmade:
    spec = parse_campaign(SPEC, source="handmade")
    g6 = _Shard(root, spec, "g6", T0_UNIX)
    t4 = _Shard(root, spec, "t4spot", T0_UNIX + 60.0)
    out = Handmade(
        root=root / spec.name,
        spec=spec,
        shard_dirs={"g6": g6.dir, "t4spot": t4.dir},
        shard_start_unix={},
        shard_end_unix={},
    )
    engines = {"llama": "llamacpp", "llama-d2": "llamacpp", "vllm": "vllm", "vllm-d4": "vllm"}
    for arm in ("llama", "llama-d2", "vllm", "vllm-d4"):
        served = g6.engine(arm, engines[arm], INSTALL_S[arm])
        label = "llama@g6" if arm == "llama" else arm
        _probe(g6, arm, served, out, label)
        _sweep(g6, arm, served, out, label, SWEEP[arm])
        _eval(g6, arm, "gsm8k", served, *GSM8K[arm])
        _eval(g6, arm, "bfcl", served, *BFCL[arm])
    served = g6.engine("sglang", "sglang", INSTALL_S["sglang"])
    _failed(g6, "sglang", "probe", served, "RuntimeError: no probe request succeeded: HTTP 500")
    _sweep(g6, "sglang", served, out, "sglang", SWEEP["sglang"])
    _failed(g6, "sglang", "gsm8k", served, "server exited during the job (code -9)")
    # bfcl of sglang and every mistralrs job: no folder at all.
    out.gpu_times_ns["g6"] = g6.finish(
        {
            "instance_id": "i-040ed957b67c2d514",
            "instance_type": "g6.4xlarge",
            "availability_zone": "us-east-1d",
            "region": "us-east-1",
            "lifecycle": "normal",
        }
    )
    served = t4.engine("llama", "llamacpp", 300.0)
    _probe(t4, "llama", served, out, "llama@t4spot")
    _sweep(t4, "llama", served, out, "llama@t4spot", T4_SWEEP)
    _failed(t4, "llama", "gsm8k", served, "spot interruption: instance-action terminate")
    out.gpu_times_ns["t4spot"] = t4.finish(
        {
            "instance_id": "i-02e79988a6cbeecbf",
            "instance_type": "g4dn.xlarge",
            "availability_zone": "us-east-1a",
            "region": "us-east-1",
            "lifecycle": "spot",
        }
    )
    for name, shard in (("g6", g6), ("t4spot", t4)):
        out.shard_start_unix[name] = shard.clock.unix(0.0)
        out.shard_end_unix[name] = shard.clock.unix(shard.clock.now_s)
    return out
