"""Telemetry on a real NVIDIA GPU: does the sampler read what it should, and what does it cost?

Runs the project's `TelemetrySampler` (agent/telemetry) for the whole check, with three jobs:
`idle` (a few seconds), `matmul` (bf16 matmuls on cuda:0, plus a known extra allocation)
and `cooldown`. Then prints:

1. the GPUs found, and the readings NVML does not support on them;
2. what one call of each NVML reading costs on GPU 0 (median and max microseconds), and
   the resulting wall time of one sampling pass;
3. what was read during `matmul`: per column, how many rows had it, min / mean / max;
4. per job: peak memory, mean power, utilisation, energy in joules from the counter delta
   (what the summary reports), from the integral of the power samples (the cross-check),
   and from two direct counter reads around the job; J per matmul as a stand-in for J/token;
5. the cadence of the 100 ms reads (gap p50 / p99 / max) and overruns;
6. the sampler's own cost: CPU seconds of its thread per minute of sampling.

It needs only torch (with CUDA) and nvidia-ml-py; psutil is optional (host rows). It puts
the repository root on sys.path itself, so run it from anywhere in a copy of the tree:

    python benchmarks/telemetry_gpu_check.py                # about 40 s
    python benchmarks/telemetry_gpu_check.py --no-gpu --seconds 60   # host-only cost (here)

Files (telemetry.csv and telemetry_gpu_check.json) go to --out, else $OUT, else a temp dir.
Exit status: 0 all read; 1 NVML reads failed (errors counted, a GPU lost, or a core column
- utilisation, memory, power, energy counter - missing on GPU 0 under load); 2 cannot run
(no NVML, no GPU, no CUDA torch).
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# After the path fix on purpose: the script runs without the project being installed.
from agent.telemetry import (  # noqa: E402
    GpuSample,
    HostSample,
    TelemetrySampler,
    read_telemetry_csv,
)
from agent.telemetry.gpu import GPU_READINGS  # noqa: E402
from contract.telemetry import GPU_COLUMNS, SamplerStats, TelemetrySummary  # noqa: E402

log = logging.getLogger("telemetry_gpu_check")

EXIT_OK, EXIT_NVML_FAILED, EXIT_CANNOT_RUN = 0, 1, 2
CORE_COLUMNS = ("gpu_util_pct", "mem_used_mib", "power_w", "energy_mj")
JOBS = ("idle", "matmul", "cooldown")


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    def cell(v: Any) -> str:
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:,.3f}" if abs(v) < 100 else f"{v:,.1f}"
        return str(v)

    text = [[cell(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in text)) for i, h in enumerate(header)]
    print(f"\n{title}")
    print("  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in text:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)))


# contract.metrics.percentile's rule, not imported: it pulls in pydantic, which the GPU
# host this script runs on may lack (see the module docstring).
def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


def _cost_rows(stats: SamplerStats) -> list[tuple[str, Any]]:
    per_min = stats.cpu_s_per_min
    return [
        ("wall s", stats.wall_s),
        ("sampler thread CPU s", stats.cpu_s),
        ("CPU s per minute of sampling", per_min),
        ("% of one core", per_min / 60 * 100 if per_min is not None else None),
        ("GPU passes / host passes", f"{stats.gpu_passes} / {stats.host_passes}"),
        ("rows written", stats.rows_written),
        ("overruns (pass > 1 interval late)", stats.overruns),
        ("NVML errors / internal / CSV", (
            f"{stats.nvml_errors} / {stats.internal_errors} / {stats.csv_errors}")),
    ]  # fmt: skip


def host_only(args: argparse.Namespace, out: Path) -> int:
    """Idle host-only sampling (what a machine without a GPU pays); prints the cost."""
    sampler = TelemetrySampler(out / "telemetry.csv", nvml=None)
    with sampler:
        sampler.track_process(os.getpid())
        sampler.set_job("idle")
        time.sleep(args.seconds)
        sampler.set_job(None)
    stats = sampler.stats()
    _table("Sampler cost, host only (psutil every 1 s)", ("what", "value"), _cost_rows(stats))
    (out / "telemetry_gpu_check.json").write_text(
        json.dumps({"mode": "host-only", "stats": stats.to_dict()}, indent=2)
    )
    return EXIT_OK


def nvml_call_costs(nvml: Any, repeats: int) -> list[dict[str, Any]]:
    """Median/max wall time of each reading's NVML call on GPU 0 (its own nvmlInit)."""
    nvml.nvmlInit()
    try:
        handle = nvml.nvmlDeviceGetHandleByIndex(0)
        rows: list[dict[str, Any]] = []
        for reading in GPU_READINGS:
            for label, reader in reading.candidates:
                row: dict[str, Any] = {"reading": reading.name, "function": label}
                times_us: list[float] = []
                result = "ok"
                for _ in range(repeats if not reading.slow else max(3, repeats // 10)):
                    t0 = time.perf_counter_ns()
                    try:
                        reader(nvml, handle)
                    except nvml.NVMLError as exc:
                        result = f"NVMLError: {exc}"
                        break
                    except AttributeError:
                        result = "not in this nvidia-ml-py"
                        break
                    times_us.append((time.perf_counter_ns() - t0) / 1000)
                rows.append(
                    {
                        **row,
                        "result": result,
                        "median_us": statistics.median(times_us) if times_us else None,
                        "max_us": max(times_us) if times_us else None,
                    }
                )
                if result == "ok":
                    break
        return rows
    finally:
        nvml.nvmlShutdown()


def energy_counters(nvml: Any) -> list[int | None]:
    """Direct reads of every GPU's energy counter (mJ), independent of the sampler."""
    out: list[int | None] = []
    for i in range(nvml.nvmlDeviceGetCount()):
        try:
            out.append(int(nvml.nvmlDeviceGetTotalEnergyConsumption(
                nvml.nvmlDeviceGetHandleByIndex(i))))  # fmt: skip
        except nvml.NVMLError:
            out.append(None)
    return out


def matmul_load(torch: Any, seconds: float, size: int, alloc_gib: float) -> dict[str, Any]:
    """bf16 matmuls on cuda:0 for `seconds`, with an extra allocation held meanwhile."""
    dev = torch.device("cuda:0")
    a = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=dev, dtype=torch.bfloat16)
    # A known block of memory, so the peak-memory reading has something to show.
    ballast = torch.empty(int(alloc_gib * 1024**3), dtype=torch.uint8, device=dev)
    ballast.fill_(1)
    torch.cuda.synchronize()
    count = 0
    t0 = time.perf_counter()
    deadline = t0 + seconds
    while time.perf_counter() < deadline:  # bounded by the deadline
        for _ in range(50):
            c = a @ b
        count += 50
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    del a, b, c, ballast
    torch.cuda.empty_cache()
    return {
        "matmuls": count,
        "seconds": elapsed,
        "tflops": 2 * size**3 * count / elapsed / 1e12,
        "size": size,
        "alloc_gib": alloc_gib,
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="matmul (or idle) seconds")
    parser.add_argument("--idle", type=float, default=4.0, help="idle seconds before the load")
    parser.add_argument("--cooldown", type=float, default=5.0, help="seconds after the load")
    parser.add_argument("--interval", type=float, default=0.1, help="GPU sampling interval s")
    parser.add_argument("--pcie-interval", type=float, default=1.0, help="PCIe read interval s")
    parser.add_argument("--size", type=int, default=8192, help="matmul size (square, bf16)")
    parser.add_argument("--alloc-gib", type=float, default=4.0, help="extra GiB held in load")
    parser.add_argument("--out", type=Path, default=None, help="folder for the CSV and JSON")
    parser.add_argument("--no-gpu", action="store_true", help="host-only cost, no NVML/torch")
    args = parser.parse_args(argv)
    if not 1 <= args.seconds <= 300:
        parser.error("--seconds must be between 1 and 300")

    # Line-buffered so the tables and the log lines (stderr) stay in order when merged.
    sys.stdout.reconfigure(line_buffering=True)  # type: ignore[union-attr]
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    out = args.out or Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="telemetry-check-"))
    out.mkdir(parents=True, exist_ok=True)
    if args.no_gpu:
        return host_only(args, out)

    try:
        import pynvml
        import torch
    except ImportError as exc:
        print(f"cannot run: {exc} (needs torch and nvidia-ml-py)")
        return EXIT_CANNOT_RUN
    if not torch.cuda.is_available():
        print("cannot run: torch sees no CUDA device")
        return EXIT_CANNOT_RUN
    try:
        costs = nvml_call_costs(pynvml, repeats=50)
    except pynvml.NVMLError as exc:
        print(f"cannot run: NVML: {exc}")
        return EXIT_CANNOT_RUN

    csv_path = out / "telemetry.csv"
    sampler = TelemetrySampler(
        csv_path, gpu_interval_s=args.interval, pcie_interval_s=args.pcie_interval
    )
    direct: dict[str, float | None] = {}
    with sampler:
        devices = sampler.devices
        if not devices:
            print("cannot run: the sampler found no GPU through NVML")
            return EXIT_CANNOT_RUN
        sampler.track_process(os.getpid())
        sampler.set_job("idle")
        time.sleep(args.idle)
        torch.zeros(1, device="cuda:0")  # CUDA context before the load's clock starts
        e0 = energy_counters(pynvml)
        sampler.set_job("matmul")
        load = matmul_load(torch, args.seconds, args.size, args.alloc_gib)
        sampler.set_job("cooldown")
        e1 = energy_counters(pynvml)
        if all(v is not None for v in e0 + e1):
            direct["matmul"] = sum(b - a for a, b in zip(e0, e1, strict=True)) / 1000  # type: ignore[operator]
        time.sleep(args.cooldown)
        sampler.set_job(None)
        summaries = {job: sampler.summary(job, output_tokens=load["matmuls"]) for job in JOBS}
    stats = sampler.stats()
    samples = list(read_telemetry_csv(csv_path))
    return report(args, out, devices, costs, load, direct, summaries, stats, samples)


def report(
    args: argparse.Namespace,
    out: Path,
    devices: list[Any],
    costs: list[dict[str, Any]],
    load: dict[str, Any],
    direct: dict[str, float | None],
    summaries: dict[str, TelemetrySummary],
    stats: SamplerStats,
    samples: list[Any],
) -> int:
    failures: list[str] = []
    _table(
        "GPUs",
        ("index", "name", "memory MiB", "unsupported readings"),
        [
            (d.index, d.name, d.memory_total_mib, ", ".join(d.unsupported) or "none")
            for d in devices
        ],
    )
    ok_costs = [c for c in costs if c["result"] == "ok"]
    _table(
        "NVML call cost on GPU 0 (one call)",
        ("reading", "function", "median us", "max us", "result"),
        [(c["reading"], c["function"], c.get("median_us"), c.get("max_us"), c["result"])
         for c in costs],
    )  # fmt: skip
    fast = sum(c["median_us"] for c in ok_costs if c["reading"] != "pcie")
    slow = sum(c["median_us"] for c in ok_costs if c["reading"] == "pcie")
    print(f"one pass per GPU: ~{fast / 1000:.2f} ms, plus ~{slow / 1000:.1f} ms when PCIe is read")

    gpu_rows = [s for s in samples if isinstance(s, GpuSample)]
    host_rows = [s for s in samples if isinstance(s, HostSample)]
    load_rows = [s for s in gpu_rows if s.job_id == "matmul"]
    coverage: dict[str, dict[str, Any]] = {}
    table_rows = []
    for dev in devices:
        rows = [s for s in load_rows if s.gpu_index == dev.index]
        if not rows:
            failures.append(f"GPU {dev.index}: no rows during the load (lost?)")
            continue
        for col in GPU_COLUMNS[1:]:
            vals = [float(v) for s in rows if (v := getattr(s, col)) is not None]
            coverage[f"{dev.index}:{col}"] = {"rows": len(rows), "with_value": len(vals)}
            table_rows.append((
                dev.index, col, f"{len(vals)}/{len(rows)}",
                min(vals) if vals else None,
                statistics.fmean(vals) if vals else None,
                max(vals) if vals else None,
            ))  # fmt: skip
            if dev.index == 0 and col in CORE_COLUMNS and len(vals) < len(rows):
                failures.append(
                    f"GPU 0: {col} missing in {len(rows) - len(vals)} of {len(rows)} rows"
                )
    _table(
        "Read during the matmul load", ("gpu", "column", "rows", "min", "mean", "max"), table_rows
    )

    per_matmul_j = None
    job_rows = []
    for job, s in summaries.items():
        ratio = (
            s.energy_j_power_integral / s.energy_j
            if s.energy_j and s.energy_j_power_integral is not None
            else None
        )
        job_rows.append((
            job, s.duration_s, s.gpu_samples, s.peak_gpu_memory_mib, s.mean_power_w,
            s.mean_gpu_util_pct, s.energy_j, s.energy_j_power_integral, direct.get(job), ratio,
        ))  # fmt: skip
        if job == "matmul":
            per_matmul_j = s.joules_per_output_token
    _table(
        "Per job (sums over GPUs; energy: counter delta vs power integral vs direct reads)",
        ("job", "s", "gpu rows", "peak MiB", "mean W", "util %", "counter J", "integral J",
         "direct J", "integral/counter"),
        job_rows,
    )  # fmt: skip
    idle_mem = summaries["idle"].peak_gpu_memory_mib
    load_mem = summaries["matmul"].peak_gpu_memory_mib
    print(
        f"matmul: {load['matmuls']} x {load['size']}^2 bf16 in {load['seconds']:.1f} s "
        f"= {load['tflops']:.0f} TFLOPS; J per matmul (the J/token path) = {per_matmul_j}; "
        f"peak memory rise over idle = "
        f"{(load_mem - idle_mem) if load_mem and idle_mem else None} MiB "
        f"(ballast {load['alloc_gib'] * 1024:.0f} MiB + operands)"
    )
    if summaries["matmul"].energy_j is None:
        failures.append("no energy from the counter for the matmul job")
    if (summaries["matmul"].mean_gpu_util_pct or 0) < 50:
        print("note: mean GPU utilisation under load < 50 %: the load did not keep GPU 0 busy")

    cadence_rows = []
    for job in JOBS:
        times = [s.time_perf_ns for s in gpu_rows if s.job_id == job and s.gpu_index == 0]
        gaps = [(b - a) / 1e6 for a, b in itertools.pairwise(times)]
        if gaps:
            cadence_rows.append((job, len(times), _pct(gaps, 0.5), _pct(gaps, 0.99), max(gaps)))
    _table(
        f"Cadence of GPU 0 rows (target {args.interval * 1000:.0f} ms; job-boundary reads "
        "add short gaps)",
        ("job", "rows", "gap p50 ms", "gap p99 ms", "gap max ms"),
        cadence_rows,
    )
    _table("Sampler cost (its thread's CPU time)", ("what", "value"), _cost_rows(stats))
    if host_rows:
        peak_rss = max((s.engine_rss_mib or 0.0) for s in host_rows)
        print(f"host rows: {len(host_rows)}; this process's RSS peak {peak_rss:.0f} MiB")
    else:
        print("host rows: none (psutil not installed here)")

    if stats.nvml_errors or stats.internal_errors or stats.csv_errors:
        failures.append(
            f"errors: NVML {stats.nvml_errors}, internal {stats.internal_errors}, "
            f"CSV {stats.csv_errors} (see the log above)"
        )
    (out / "telemetry_gpu_check.json").write_text(
        json.dumps(
            {
                "devices": [d.to_dict() for d in devices],
                "nvml_call_costs": costs,
                "load": load,
                "direct_counter_j": direct,
                "summaries": {job: s.to_dict() for job, s in summaries.items()},
                "stats": stats.to_dict(),
                "coverage": coverage,
                "failures": failures,
            },
            indent=2,
        )
    )
    print(f"\nfiles: {out / 'telemetry.csv'}, {out / 'telemetry_gpu_check.json'}")
    if failures:
        print("FAILED:\n  " + "\n  ".join(failures))
        return EXIT_NVML_FAILED
    print("OK: every NVML read answered")
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
