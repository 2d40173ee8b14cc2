"""What sets the JAX engine's batch-1 decode on a GPU, measured in process (no HTTP): the
engine's own compiled programs for `random:gemma-4-e2b` for one request at KV 1024 (in
its smallest batch bucket, one real row and padding), over the server's cache (64 slots
of `--max-len` positions), timed four ways:

- `synced_ms`: one step a call, the host reading each step's token before queueing the
  next (what the scheduler does with `--decode-steps 1`);
- `chained_ms`: one step a call, each fed the previous step's token on the device, the
  host waiting only at the end (the device's pace, unless the host's launching is slower);
- `dispatch_ms`: a program that takes the same arguments (every weight and the cache) and
  does nothing with them: the host's cost of handing them to a call;
- `steps_ms_per_token`: `--steps` greedy steps in one call (`greedy_steps`, what the
  scheduler does with `--decode-steps N`), the host reading the tokens after each call;
  with several counts (`--steps 8,16`), each count's figure under
  `steps_ms_per_token_by_count` and the fastest as `steps_ms_per_token`;
- `ahead_ms_per_token`: the same calls with each queued before the one before it is
  read, fed that one's last tokens on the device (the scheduler's run-ahead), by count.

Then a profile (`jax.profiler`, CUPTI) of a few chained steps and of one multi-step call:
GPU kernels per step, the time the GPU is busy per step against the wall time, the
kernels and host events that take the most, and the driver's launch calls per step
(`cuLaunchKernel` one kernel at a time against `cuGraphLaunch`, XLA's command buffers).

    python -m benchmarks.jax_step_h200 OUT_JSON [--model M] [--steps N[,N...]] [--profile DIR]

XLA_FLAGS (read by the process) selects the compiler's variant; `jax_decode_h200.sh`
runs this once per variant. `--knobs` compares variants of the engine's own module
constants in one process instead (one load): each `NAME:module.CONST=value[,...]` (module
`decode_attention` of `engines.jax`) gets its multi-step program compiled,
timed and profiled under `knobs`. MODEL `random:tiny-gemma4` dry-runs on a CPU.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import os
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from engines.jax import decode_attention
from engines.jax.runner import JaxRunner, load

STEPS = 100
TRACED_STEPS = 8


def _timed(call: Any, sync: Any, n: int) -> float:
    """Milliseconds a call over `n` calls, `sync` after the last."""
    t = time.perf_counter()
    for _ in range(n):
        last = call()
    sync(last)
    return 1e3 * (time.perf_counter() - t) / n


def _tally(
    events: list[dict[str, Any]], per: int, top: int
) -> tuple[list[tuple[str, float, float]], dict[str, int]]:
    """The `top` event names by time (us per step, events per step), and every name's count."""
    totals: dict[str, float] = collections.defaultdict(float)
    counts: dict[str, int] = collections.defaultdict(int)
    for e in events:
        totals[e["name"][:80]] += float(e.get("dur", 0))
        counts[e["name"][:80]] += 1
    ranked = sorted(totals.items(), key=lambda kv: -kv[1])[:top]
    return [(name, round(us / per, 1), counts[name] / per) for name, us in ranked], counts


def summarize_trace(trace_dir: Path, per: int) -> dict[str, Any]:
    """Kernel and host-event totals of the perfetto trace under `trace_dir`, per step."""
    path = max(trace_dir.rglob("perfetto_trace.json.gz"), key=lambda p: p.stat().st_mtime)
    with gzip.open(path) as f:
        data = json.loads(f.read())
    events = data["traceEvents"] if isinstance(data, dict) else data
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("name") == "process_name"}
    gpu = [e for e in events if e.get("ph") == "X" and "GPU" in names.get(e.get("pid"), "")]
    host = [e for e in events if e.get("ph") == "X" and "GPU" not in names.get(e.get("pid"), "")]
    out: dict[str, Any] = {
        "trace_file": str(path),
        "gpu_processes": sorted({names[e["pid"]] for e in gpu}),
    }
    if gpu:
        spans = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))) for e in gpu)
        busy, end = 0.0, spans[0][0]
        for start, stop in spans:
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        out["gpu_events_per_step"] = len(gpu) / per
        out["gpu_busy_ms_per_step"] = busy / per / 1e3
        out["gpu_span_ms_per_step"] = (end - spans[0][0]) / per / 1e3
        out["top_gpu_us_per_step"] = _tally(gpu, per, 12)[0]
    out["top_host_us_per_step"], host_counts = _tally(host, per, 15)
    out["launch_calls_per_step"] = {
        name: n / per
        for name, n in host_counts.items()
        if any(k in name for k in ("LaunchKernel", "GraphLaunch", "cuGraph", "cudaGraph"))
    }
    return out


_KNOB_MODULES = {"decode_attention": decode_attention}


def _runner(args: Any, loaded: Any, steps: int) -> JaxRunner:
    """The engine's runner over the server's cache, with the smallest decode batch."""
    return JaxRunner(
        loaded, num_slots=args.slots, prefill_buckets=[128], kv_buckets=[args.kv],
        batch_buckets=[1], decode_steps=steps, decode_attention=args.decode_attention,
    )  # fmt: skip


def _one_request(rows: int, num_slots: int, vocab: int) -> tuple[np.ndarray, ...]:
    """Tokens, positions, slots, bans and min-tokens counts for one request (slot 0,
    position 600) and padding rows, as `JaxRunner.decode` pads them."""
    tokens = np.full(rows, 65, np.int32)
    positions = np.full(rows, -1, np.int32)
    positions[0] = 600
    slots = np.full(rows, num_slots, np.int32)
    slots[0] = 0
    banned = np.full((rows, 8), vocab, np.int32)
    return tokens, positions, slots, banned, np.zeros(rows, np.int32)


def _knob_variant(args: Any, loaded: Any, settings: str) -> dict[str, Any]:
    """The multi-step program's ms a token, kernels and GPU busy time a step with the
    module constants of `settings` (`module.CONST=value,...`) set, then restored."""
    saved = []
    for item in filter(None, settings.split(",")):
        target, _, value = item.partition("=")
        module_name, _, const = target.partition(".")
        module = _KNOB_MODULES[module_name]
        saved.append((module, const, getattr(module, const)))
        setattr(module, const, type(getattr(module, const))(int(value)))
    try:
        count = args.steps[0]
        runner = _runner(args, loaded, count)
        t = time.monotonic()
        rows = runner.batch_buckets[0]
        program = runner.compile_program("steps", rows, args.kv)
        out: dict[str, Any] = {"compile_s": round(time.monotonic() - t, 1)}
        tokens, positions, slots, banned, left = _one_request(
            rows, args.slots, loaded.spec.vocab_size
        )
        state = {"cache": runner.cache}

        def several() -> Any:
            state["cache"], got = program(
                loaded.params,
                state["cache"],
                tokens,
                positions,
                slots,
                runner.bias,
                banned,
                banned,
                left,
            )
            return np.asarray(got)

        _timed(several, lambda x: None, 2)
        calls = max(2, STEPS // count)
        out["ms_per_token"] = round(_timed(several, lambda x: None, calls) / count, 4)
        out["tokens"] = several()[:, 0].tolist()[:4]
        if args.profile is not None:
            folder = args.profile / f"knob-{len(saved)}-{time.monotonic_ns()}"
            with jax.profiler.trace(str(folder), create_perfetto_trace=True):
                several()
            prof = summarize_trace(folder, count)
            out |= {
                k: prof[k]
                for k in ("gpu_events_per_step", "gpu_busy_ms_per_step", "gpu_span_ms_per_step")
                if k in prof
            }
        return out
    finally:
        for module, const, value in saved:
            setattr(module, const, value)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.jax_step_h200")
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="random:gemma-4-e2b")
    p.add_argument(
        "--steps",
        type=lambda v: [int(n) for n in v.split(",")],
        default=[8],
        help="greedy steps per call (comma-separated: each is timed; the first is profiled)",
    )
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--kv", type=int, default=1024)
    p.add_argument("--profile", type=Path, default=None)
    p.add_argument("--decode-attention", default="auto", help="as the engine's flag")
    p.add_argument(
        "--knobs",
        nargs="*",
        default=[],
        help="NAME:module.CONST=value[,...] variants, compared after the main figures",
    )
    args = p.parse_args()
    t0 = time.monotonic()
    result: dict[str, Any] = {"xla_flags": os.environ.get("XLA_FLAGS", ""), "steps": args.steps[0]}
    result["decode_attention"] = args.decode_attention

    def save() -> None:
        args.out.write_text(json.dumps(result, indent=2))

    loaded = load(
        args.model,
        dtype="bfloat16",
        device="auto",
        seed=0,
        max_model_len=args.max_len,
        served_name=None,
    )
    runner = _runner(args, loaded, args.steps[0])
    result["load_s"] = time.monotonic() - t0
    t1 = time.monotonic()
    rows = runner.batch_buckets[0]
    program = runner.compile_program("decode", rows, args.kv)
    many = runner.compile_program("steps", rows, args.kv)
    more = {}
    for count in args.steps[1:]:
        runner.steps = count
        more[count] = runner.compile_program("steps", rows, args.kv)
    result["compile_s"] = time.monotonic() - t1
    result["decode_attention_resolved"] = runner.attention
    params, bias = loaded.params, runner.bias
    result["argument_arrays"] = len(jax.tree_util.tree_leaves((params, runner.cache)))
    result["rows"] = rows
    tokens, positions, slots, banned, left = _one_request(rows, args.slots, loaded.spec.vocab_size)
    state: dict[str, Any] = {"cache": runner.cache, "token": jnp.asarray(tokens)}

    def synced() -> Any:
        state["cache"], _, greedy = program(
            params, state["cache"], tokens, positions, slots, bias, banned
        )
        return np.asarray(greedy)

    def chained() -> Any:
        state["cache"], _, greedy = program(
            params, state["cache"], state["token"], positions, slots, bias, banned
        )
        state["token"] = greedy.astype(jnp.int32)
        return state["token"]

    def steps_call(program_n: Any) -> Any:
        def several() -> Any:
            state["cache"], out = program_n(
                params, state["cache"], tokens, positions, slots, bias, banned, banned, left
            )
            return np.asarray(out)

        return several

    several = steps_call(many)

    def idle_sync(x: Any) -> None:
        jax.block_until_ready(x)

    for call in (synced, chained, several):
        _timed(call, idle_sync, 5)
    result["synced_ms"] = _timed(synced, idle_sync, STEPS)
    result["chained_ms"] = _timed(chained, idle_sync, STEPS)
    first = args.steps[0]
    by_count = {first: _timed(several, idle_sync, max(1, STEPS // first)) / first}
    for count, program_n in more.items():
        several_n = steps_call(program_n)
        _timed(several_n, idle_sync, 2)
        by_count[count] = _timed(several_n, idle_sync, max(1, STEPS // count)) / count
    result["steps_ms_per_token_by_count"] = by_count
    result["steps_ms_per_token"] = min(by_count.values())

    def ahead_ms(program_n: Any, count: int) -> float:
        calls = max(2, STEPS // count)
        t = time.perf_counter()
        state["cache"], out = program_n(
            params, state["cache"], tokens, positions, slots, bias, banned, banned, left
        )
        for _ in range(calls - 1):
            state["cache"], queued = program_n(
                params, state["cache"], out[-1], positions, slots, bias, banned, banned, left
            )
            np.asarray(out)
            out = queued
        np.asarray(out)
        return 1e3 * (time.perf_counter() - t) / (calls * count)

    programs_by_count = {first: many, **more}
    for count, program_n in programs_by_count.items():
        ahead_ms(program_n, count)
    result["ahead_ms_per_token"] = {
        count: ahead_ms(program_n, count) for count, program_n in programs_by_count.items()
    }
    save()

    def nothing(p: object, c: object, x: jax.Array) -> jax.Array:
        return x + 1

    idle = jax.jit(nothing).lower(params, state["cache"], state["token"]).compile()
    result["dispatch_ms"] = _timed(
        lambda: idle(params, state["cache"], state["token"]), idle_sync, STEPS
    )
    hlo = program.as_text() or ""
    result["hlo_fusions"] = hlo.count("kind=k")
    result["hlo_custom_calls"] = hlo.count("custom-call(")
    result["jax"] = jax.__version__
    result["device"] = str(loaded.device)
    save()
    if args.profile is not None:
        for name, call, calls, per_call in (
            ("one_step_a_call", chained, TRACED_STEPS, 1),
            ("steps_in_one_call", several, 1, first),
        ):
            folder = args.profile / name
            with jax.profiler.trace(str(folder), create_perfetto_trace=True):
                for _ in range(calls):
                    last = call()
                jax.block_until_ready(last)
            try:
                result[f"profile_{name}"] = summarize_trace(folder, calls * per_call)
            except (KeyError, ValueError) as e:
                result[f"profile_{name}"] = {"error": f"{type(e).__name__}: {e}"}
            save()
    if args.knobs:
        del runner, state, program, many, more
        result["knobs"] = {}
        for variant in args.knobs:
            name, _, settings = variant.partition(":")
            try:
                result["knobs"][name] = _knob_variant(args, loaded, settings)
            except Exception as e:  # a variant that fails to build is a result
                result["knobs"][name] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            print(name, result["knobs"][name], flush=True)
            save()
    result["total_s"] = time.monotonic() - t0
    save()
    print(json.dumps(result, indent=1)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
