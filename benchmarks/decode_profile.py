"""Where a served decode step's time goes: the PyTorch engine's server, with its shipped
defaults plus each variant's flags, profiles a window of its decode steps
(`--profile-dir`) at `--requests` concurrent requests (one by default), and this reads
the trace back per CUDA-graph launch (one model step): kernels a step, the step's span on
the device and how much of it no kernel covers, and its busy time split along the chain
of kernels, by kind (products, attention, compiled elementwise, ...) and by kernel and
launch grid (which tells one product's shape from another), beside the unprofiled step
time from the server's own /metrics over a second round of requests.

Why a script and not the profiler's own table: under dependent launch a kernel starts
while the one before it runs and waits for it, so its duration counts that wait, and the
table's sums exceed the step. Split along the chain, each kernel gets the part of its
interval past every kernel that started before it: what it costs the step (issue 18).

    python -m benchmarks.decode_profile OUT --variant bf16= --variant int4="--quantize w4a16"
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from agent.supervisor import EngineServer, free_port
from benchmarks.pytorch_engine_h200 import _mean_ms, scrape
from engines.pytorch.profiling import TRACE_FILE

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "random:gemma-4-e2b"  # --model: another for a dry run on CPU
PROMPT = "The quick brown fox jumps over the lazy dog. " * 12  # about 128 tokens

# Kinds of kernel, first match wins: the decode program's products, its attention, what
# torch.compile generated (norms, rotary, residuals fused), torch's own ops, copies.
KINDS = (
    ("products", re.compile(r"gemv|matmul_int4|dequantize_int4|nvjet|gemm")),
    ("attention", re.compile(r"attention")),
    ("compiled (fused)", re.compile(r"^triton_")),
    ("sampling", re.compile(r"sort|topk|argmax|multinomial|softmax|exponential", re.I)),
    ("copies", re.compile(r"memcpy|memset|copy", re.I)),
    ("torch ops", re.compile(r"at::native|cub::|void ")),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if pattern.search(name):
            return kind
    return "other"


@dataclass
class StepProfile:
    """One graph launch's kernels (a decode step's model step), as the device ran them."""

    kernels: int
    span_us: float  # first kernel's start to last kernel's end
    busy_us: float  # the union of the kernels' intervals
    kernel_us: float  # the kernels' durations summed (overlaps counted twice)
    by_kind_us: dict[str, float] = field(default_factory=dict)
    by_kind_count: dict[str, int] = field(default_factory=dict)
    # The busy time split among the kernels in start order: each gets the part of its
    # interval past every kernel that started before it (a dependent launch's early
    # start and wait count for the kernel it waited on): its cost on the chain.
    chain_by_kind_us: dict[str, float] = field(default_factory=dict)
    chain_by_kernel_us: dict[str, float] = field(default_factory=dict)  # by name and grid

    @property
    def uncovered_us(self) -> float:
        return self.span_us - self.busy_us


def _launch_name(kernel: dict[str, Any]) -> str:
    # The profiler records each launch's grid: it tells one product's shape from another.
    grid = kernel.get("args", {}).get("grid")
    return kernel["name"][:80] + (f" grid {grid}" if grid else "")


def _union_us(intervals: Iterable[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def graph_steps(trace: dict[str, Any]) -> list[StepProfile]:
    """Each cudaGraphLaunch of the trace with the kernels it ran (joined by correlation
    id), in launch order."""
    events = trace.get("traceEvents", [])
    launches = sorted(
        (e["ts"], e["args"]["correlation"])
        for e in events
        if e.get("ph") == "X"
        and e.get("name") == "cudaGraphLaunch"
        and "correlation" in e.get("args", {})
    )
    kernels: dict[int, list[dict[str, Any]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"):
            kernels[e.get("args", {}).get("correlation", -1)].append(e)
    steps = []
    for _, correlation in launches:
        ran = kernels.get(correlation, [])
        if not ran:
            continue
        intervals = [(float(k["ts"]), float(k["ts"]) + float(k["dur"])) for k in ran]
        by_kind_us: Counter[str] = Counter()
        by_kind_count: Counter[str] = Counter()
        chain_us: Counter[str] = Counter()
        chain_by_name: Counter[str] = Counter()
        covered = float("-inf")
        for k in sorted(ran, key=lambda k: float(k["ts"])):
            kind = kind_of(k["name"])
            start, stop = float(k["ts"]), float(k["ts"]) + float(k["dur"])
            by_kind_us[kind] += stop - start
            by_kind_count[kind] += 1
            on_chain = max(0.0, stop - max(start, covered))
            chain_us[kind] += on_chain
            chain_by_name[_launch_name(k)] += on_chain
            covered = max(covered, stop)
        steps.append(
            StepProfile(
                kernels=len(ran),
                span_us=max(b for _, b in intervals) - min(a for a, _ in intervals),
                busy_us=_union_us(intervals),
                kernel_us=sum(b - a for a, b in intervals),
                by_kind_us=dict(by_kind_us),
                by_kind_count=dict(by_kind_count),
                chain_by_kind_us=dict(chain_us),
                chain_by_kernel_us=dict(chain_by_name),
            )
        )
    return steps


def top_kernels(trace: dict[str, Any], steps: int, n: int = 12) -> list[dict[str, Any]]:
    """The kernels with the most device time in the window, per step."""
    total: Counter[str] = Counter()
    count: Counter[str] = Counter()
    for e in trace.get("traceEvents", []):
        if e.get("ph") == "X" and e.get("cat") == "kernel":
            total[e["name"][:90]] += float(e["dur"])
            count[e["name"][:90]] += 1
    return [
        {"kernel": name, "per_step": count[name] / steps, "us_per_step": us / steps}
        for name, us in total.most_common(n)
    ]


def _median(values: Sequence[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def _top_chain(steps: list[StepProfile], n: int = 12) -> list[dict[str, Any]]:
    """The kernels that cost the chain most, a step (median over the steps)."""
    names = {name for s in steps for name in s.chain_by_kernel_us}
    chain = {name: _median([s.chain_by_kernel_us.get(name, 0.0) for s in steps]) for name in names}
    top = sorted(chain, key=lambda name: -chain[name])[:n]
    return [{"kernel": name, "chain_us_per_step": chain[name]} for name in top]


def summarize(trace: dict[str, Any]) -> dict[str, Any]:
    steps = graph_steps(trace)
    if not steps:
        return {"steps": 0}
    kinds = sorted({k for s in steps for k in s.by_kind_us})
    return {
        "steps": len(steps),
        "kernels_per_step": _median([s.kernels for s in steps]),
        "span_us": _median([s.span_us for s in steps]),
        "busy_us": _median([s.busy_us for s in steps]),
        "kernel_us": _median([s.kernel_us for s in steps]),
        "uncovered_us": _median([s.uncovered_us for s in steps]),
        "by_kind_us": {k: _median([s.by_kind_us.get(k, 0.0) for s in steps]) for k in kinds},
        "by_kind_count": {k: _median([s.by_kind_count.get(k, 0) for s in steps]) for k in kinds},
        "chain_by_kind_us": {
            k: _median([s.chain_by_kind_us.get(k, 0.0) for s in steps]) for k in kinds
        },
        "top_kernels": top_kernels(trace, len(steps)),
        "top_chain_kernels": _top_chain(steps),
        "first_step": asdict(steps[0]),
    }


def _complete(client: httpx.Client, base_url: str, model: str, tokens: int) -> dict[str, Any]:
    body = {
        "model": model,
        "prompt": PROMPT,
        "max_tokens": tokens,
        "temperature": 0.0,
        "ignore_eos": True,
    }
    reply = client.post(f"{base_url}/v1/completions", json=body, timeout=300)
    reply.raise_for_status()
    return reply.json()


def _complete_all(
    client: httpx.Client, base_url: str, model: str, tokens: int, requests: int
) -> dict[str, Any]:
    """`requests` completions at once (a decode batch of that many); the first's reply."""
    with ThreadPoolExecutor(requests) as pool:
        replies = list(
            pool.map(lambda _: _complete(client, base_url, model, tokens), range(requests))
        )
    return replies[0]


def profile_variant(
    out: Path, name: str, flags: Sequence[str], steps: int, model: str = MODEL, requests: int = 1
) -> dict[str, Any]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    profile_dir = out / name
    argv = [
        sys.executable, "-m", "engines.pytorch", "--model", model, "--host", "127.0.0.1",
        "--port", str(port), "--profile-dir", str(profile_dir),
        "--profile-decode-steps", str(steps), *flags,
    ]  # fmt: skip
    result: dict[str, Any] = {"flags": list(flags), "requests": requests}
    with (
        EngineServer("pytorch", argv, log_path=out / f"{name}-server.log", port=port,
                     cwd=REPO_ROOT) as srv,
        httpx.Client() as client,
    ):  # fmt: skip
        result["health_s"] = srv.wait_healthy(f"{base_url}/health", 420)
        # The window opens at decode step 64 of the server's life and lasts `steps`.
        _complete_all(client, base_url, model, 64 + steps + 32, requests)
        trace_path = profile_dir / TRACE_FILE
        deadline = time.monotonic() + 60
        while not trace_path.exists() and time.monotonic() < deadline:
            time.sleep(0.5)
        before = scrape(base_url)
        reply = _complete_all(client, base_url, model, 256, requests)
        after = scrape(base_url)
        result["unprofiled_step_ms"] = _mean_ms(
            after, before, "step_seconds_sum:decode", "step_seconds_count:decode"
        )
        result["unprofiled_device_ms"] = _mean_ms(
            after, before, "decode_device_seconds_total", "decode_device_steps_total"
        )
        result["text_head"] = reply["choices"][0]["text"][:60]
    if trace_path.exists():
        result["profile"] = summarize(json.loads(trace_path.read_text()))
        trace_path.unlink()  # tens of MB; the summary is what comes back
    else:
        result["profile"] = {"steps": 0, "error": "no trace written"}
    return result


def table(results: dict[str, dict[str, Any]]) -> str:
    rows = [
        "| variant | step ms (unprofiled) | kernels/step | span us | busy us | uncovered us "
        "| on the chain by kind: us (kernels) |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, res in results.items():
        p = res.get("profile", {})
        if not p.get("steps"):
            rows.append(f"| {name} | {res.get('unprofiled_step_ms')} | no profile | | | | |")
            continue
        chain = p["chain_by_kind_us"]
        kinds = ", ".join(
            f"{k} {chain[k]:.0f} ({p['by_kind_count'][k]:.0f})"
            for k in sorted(chain, key=lambda k: -chain[k])
        )
        step_ms = res.get("unprofiled_step_ms")
        rows.append(
            f"| {name} | {step_ms:.3f} | {p['kernels_per_step']} | {p['span_us']:.0f} "
            f"| {p['busy_us']:.0f} | {p['uncovered_us']:.0f} | {kinds} |"
            if step_ms is not None
            else f"| {name} | - | {p['kernels_per_step']} | {p['span_us']:.0f} | "
            f"{p['busy_us']:.0f} | {p['uncovered_us']:.0f} | {kinds} |"
        )
    return "\n".join(rows)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=FLAGS",
        help="a server variant: its name and its flags beyond the shipped defaults",
    )  # fmt: skip
    parser.add_argument("--steps", type=int, default=16, help="decode steps to profile")
    parser.add_argument("--model", default=MODEL)
    parser.add_argument("--requests", type=int, default=1, help="concurrent requests (batch)")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    results: dict[str, dict[str, Any]] = {}
    for spec in args.variant or ["default="]:
        name, _, flags = spec.partition("=")
        try:
            results[name] = profile_variant(
                args.out, name, shlex.split(flags), args.steps, args.model, args.requests
            )
        except Exception as exc:  # a variant that fails must not lose the others
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        (args.out / "decode-profile.json").write_text(json.dumps(results, indent=1))
    print(table(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
