"""The project's PyTorch engine on one NVIDIA GPU (an H200), in one run, against issue 4's
targets: batch 1 at least 50% of the roofline and 5x plain `generate()`, and aggregate
decode at 64 concurrent requests at least 15x batch 1.

Sections, each recorded even if a later one fails (`result.json` is rewritten after each):
1. roofline: weight bytes streamed per decode step (of the weights the server sweep
   serves: int4 where `--server-args` quantizes) over device-to-device copy bandwidth
   measured in this run;
2. transformers' plain `generate()` at batch 1 on the same model (greedy, SDPA, its own
   dynamic cache);
3. the engine's model step (`engines.pytorch.stepbench`, no HTTP) at batch 1, 8 and 64
   in modes, one change at a time: row-by-row attention eager (the engine before the
   CUDA path), batched attention eager, batched attention in CUDA graphs, that with fused
   RMSNorms, and the Gemma 4 decode program in CUDA graphs (uncompiled, with cuBLAS or
   the Triton GEMV), with a torch.profiler summary of one decode step (kernels, device
   vs wall time, top kernels and host ops);
4. decode through the HTTP server: `python -m engines.pytorch` under the supervisor,
   measured with the project's own sweep (`agent.loadgen.sweep.run_sweep`) at 1, 8 and 64
   concurrent requests of 128 prompt and 512 output tokens, with the server's own decode
   step time and batch size per cell from its /metrics; before the sweep, the server's
   greedy text (`agent.loadgen.probe`, each prompt twice, 64 tokens): does it repeat
   within the run, and (`--greedy-reference`, an earlier run's result.json) across runs;
5. optional (`--compile-mode`): the decode program with each kind of layer
   torch.compile'd and the Triton GEMV (the server's CUDA default), inside the CUDA
   graphs, at `--compile-batches` (default 1), in a subprocess with a time limit; and
   optional server variants (`--server-variant NAME=FLAGS`), each one more sweep.

    python -m benchmarks.pytorch_engine_h200 OUT_DIR [--compile-mode default]

A dry run on CPU (`--model random:tiny --device cpu`, graph modes run eagerly) checks
the script end to end before GPU time is spent on it.

Prints a table last; writes OUT_DIR/result.json, the sweep's records and the server log.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import re
import shlex
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import torch

from agent.jobfolder import JobFolder
from agent.loadgen.client import OpenAIClient
from agent.loadgen.probe import run_probe
from agent.loadgen.sweep import run_sweep
from agent.supervisor import EngineServer, free_port
from benchmarks.pytorch_engine_table import table
from contract.results import CellResult
from contract.suite import ProbeSettings, RequestSettings, Shape, SweepSettings
from engines.pytorch.config import build_parser
from engines.pytorch.model import LoadedModel, load_model
from engines.pytorch.runner import ModelRunner
from engines.pytorch.stepbench import (
    copy_bandwidth,
    decode_times,
    generate_baseline,
    profile_decode,
    streamed_weight_bytes,
)

log = logging.getLogger(__name__)

REPO_ROOT = Path(__file__).resolve().parents[1]
BATCHES = (1, 8, 64)
PROMPT_LEN = 128
# Each server's greedy text, before its sweep: does it repeat within the run (each of the
# probe's prompts twice), and its digest, to set against another run's (issue 18's target:
# greedy text repeating across runs).
GREEDY_PROBE = ProbeSettings(output_tokens=64, repeats=2, at_once=2)


class Recorder:
    """The run's results, saved after every section; a failing section is recorded too."""

    def __init__(self, out: Path, argv: Sequence[str]) -> None:
        self.out = out
        self.t0 = time.monotonic()
        self.data: dict[str, Any] = {
            "command": "python -m benchmarks.pytorch_engine_h200 " + " ".join(argv),
            "started_unix_s": time.time(),
            "sections": {},
            "errors": {},
        }

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def save(self) -> None:
        (self.out / "result.json").write_text(json.dumps(self.data, indent=2, default=str))

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        t0 = time.monotonic()
        log.info("section %s: start (%.0fs into the run)", name, self.elapsed())
        try:
            value = fn()
        except Exception as e:
            log.exception("section %s failed", name)
            self.data["errors"][name] = f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}"
            value = None
        else:
            self.data["sections"][name] = value
        self.data.setdefault("section_s", {})[name] = time.monotonic() - t0
        self.save()
        return value


def _free_cuda() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def environment() -> dict[str, Any]:
    import transformers

    gpu: dict[str, Any] = {"gpu": "none (CPU)"}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        gpu = {
            "gpu": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "multiprocessors": props.multi_processor_count,
            "memory_gib": props.total_memory / 2**30,
        }
    return {
        **gpu,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": sys.version.split()[0],
    }


def served_quantization(server_flags: Sequence[str]) -> str:
    """The `--quantize` the server sweep's flags ask for, read by the engine's own parser
    (its default without one)."""
    return str(build_parser().parse_known_args(list(server_flags))[0].quantize)


def roofline(loaded: LoadedModel, model: str, quantize: str) -> dict[str, Any]:
    """The roofline of the weights the server sweep serves: `loaded`'s, or where the server
    quantizes, those of the same model loaded with `quantize` (for this section only)."""
    if quantize == "none":
        weight_bytes = streamed_weight_bytes(loaded.model)
    else:
        served = load_model(model, dtype="auto", device=str(loaded.device), quantize=quantize)
        weight_bytes = streamed_weight_bytes(served.model)
        del served
        _free_cuda()
    bw = copy_bandwidth(loaded.device, nbytes=1 << 30 if loaded.device.type == "cuda" else 1 << 26)
    return {
        "quantize": quantize,
        "weight_bytes_streamed": weight_bytes,
        "copy_bandwidth_gb_s": bw / 1e9,
        "roofline_step_ms": 1e3 * weight_bytes / bw,
        "roofline_tok_s_batch1": bw / weight_bytes,
    }


def step_mode(
    loaded: LoadedModel,
    *,
    batched: bool,
    graphs: bool,
    fused: bool,
    steps: int,
    warmup: int,
    profile_batches: Sequence[int],
    program: bool = False,
    triton_gemv: bool = False,
) -> dict[str, Any]:
    """The runner's decode step at each batch size in one mode, and profiles."""
    runner = ModelRunner(
        loaded,
        num_slots=max(BATCHES),
        batch_invariant=False,
        batched_decode=batched,
        cuda_graphs=graphs,
        fused_norms=fused,
        decode_program=program,
        triton_gemv=triton_gemv,
    )
    try:
        decode = [decode_times(runner, b, PROMPT_LEN, steps, warmup) for b in BATCHES]
        profiles = [profile_decode(runner, b, PROMPT_LEN) for b in profile_batches]
        out: dict[str, Any] = {"decode": decode, "profiles": profiles}
        if runner.graphs is not None:
            out["graphs_captured"] = len(runner.graphs.graphs)
            out["graph_capture_s"] = runner.graphs.capture_s
        if torch.cuda.is_available():
            out["max_memory_allocated_gib"] = torch.cuda.max_memory_allocated() / 2**30
        return out
    finally:
        del runner
        _free_cuda()


_SAMPLE = re.compile(r"^(pytorch_engine_\w+?)(?:\{([^}]*)\})? (\S+)$")


def scrape(base_url: str) -> dict[str, float]:
    """Histogram sums and counts, and counters, from the server's /metrics, keyed
    `name:phase`."""
    text = httpx.get(f"{base_url}/metrics", timeout=10.0, trust_env=False).text
    values: dict[str, float] = {}
    for line in text.splitlines():
        m = _SAMPLE.match(line)
        if not m or not m.group(1).endswith(("_sum", "_count", "_total")):
            continue
        phase = re.search(r'phase="(\w+)"', m.group(2) or "")
        key = f"{m.group(1)}:{phase.group(1)}" if phase else m.group(1)
        values[key] = float(m.group(3))
    return values


def _delta(after: dict[str, float], before: dict[str, float], key: str) -> float:
    return after.get(key, 0.0) - before.get(key, 0.0)


def _mean_ms(
    after: dict[str, float], before: dict[str, float], total: str, count: str
) -> float | None:
    n = _delta(after, before, f"pytorch_engine_{count}")
    return 1e3 * _delta(after, before, f"pytorch_engine_{total}") / n if n else None


def server_sweep(
    out: Path,
    model: str,
    shape: Shape,
    levels: Sequence[int],
    repeats: int,
    extra_args: Sequence[str] = (),
    tag: str = "",
) -> dict[str, Any]:
    port = free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [
        sys.executable,
        "-m",
        "engines.pytorch",
        "--model",
        model,
        "--port",
        str(port),
        "--max-running",
        str(max(BATCHES)),
        *extra_args,
    ]
    result: dict[str, Any] = {"argv": argv[1:], "shape": shape.name, "cells": {}}
    request = RequestSettings()
    settings = SweepSettings(
        shapes=(shape,), levels=tuple(levels), repeats=repeats, request=request, max_cell_s=300
    )
    with EngineServer(
        "pytorch", argv, log_path=out / f"server{tag}.log", port=port, cwd=REPO_ROOT
    ) as srv:
        result["health_s"] = srv.wait_healthy(f"{base_url}/health", 420)
        marks = [scrape(base_url)]

        def on_cell(cell: CellResult) -> None:
            now = scrape(base_url)
            before, marks[0] = marks[0], now
            steps = _delta(now, before, "pytorch_engine_step_seconds_count:decode")
            rows = _delta(now, before, "pytorch_engine_decode_batch_size_sum")
            prefill_steps = _delta(now, before, "pytorch_engine_step_seconds_count:prefill")
            tpot = cell.tpot_ms_p50_median
            result["cells"][str(cell.concurrency)] = {
                "status": cell.status,
                "reason": cell.reason,
                "aggregate_output_tok_s_median": cell.aggregate_output_tok_s_median,
                "aggregate_output_tok_s_min": cell.aggregate_output_tok_s_min,
                "aggregate_output_tok_s_max": cell.aggregate_output_tok_s_max,
                "per_request_decode_tok_s": 1e3 / tpot if tpot else None,
                "tpot_ms_p50_median": tpot,
                "ttft_ms_p50_median": cell.ttft_ms_p50_median,
                "server_decode_steps": steps,
                "server_decode_step_ms_mean": _mean_ms(
                    now, before, "step_seconds_sum:decode", "step_seconds_count:decode"
                ),
                "server_decode_rows_mean": rows / steps if steps else None,
                "server_prefill_s": _delta(now, before, "pytorch_engine_step_seconds_sum:prefill"),
                "server_prefill_chunks": prefill_steps,
                "server_decode_steps_queued_ahead": _delta(
                    now, before, "pytorch_engine_decode_steps_queued_ahead_total"
                ),
                # CUDA events around each step: device time, and the device's idle time
                # between decode steps (where the host set the pace).
                "server_decode_device_ms_mean": _mean_ms(
                    now, before, "decode_device_seconds_total", "decode_device_steps_total"
                ),
                "server_decode_device_idle_ms_mean": _mean_ms(
                    now, before, "decode_device_idle_seconds_total", "decode_device_idle_gaps_total"
                ),
            }

        async def sweep() -> None:
            async with OpenAIClient(base_url, settings=request, max_connections=64) as client:
                # Greedy text first: the project's probe, short (each prompt twice).
                probe = await run_probe(client, GREEDY_PROBE, JobFolder(out / f"probe{tag}"))
                result["greedy"] = {
                    "prompts": len(probe.prompts),
                    "repeat_identical": probe.repeat_identical,
                    "requests_failed": probe.requests_failed,
                    "texts_sha256": probe.texts_sha256,
                }
                marks[0] = scrape(base_url)
                writer = JobFolder(out / f"sweep{tag}")
                await run_sweep(client, settings, writer, on_cell=on_cell)

        asyncio.run(sweep())
    return result


def compiled_mode(
    out: Path,
    model: str,
    mode: str,
    timeout_s: float,
    batches: str = "1",
    flags: Sequence[str] = (),
    name: str | None = None,
) -> dict[str, Any]:
    """torch.compile of the batched step (with the decode program: of each kind of layer,
    and the Triton GEMV) plus `flags` for `engines.pytorch.stepbench`, in its own process
    so a long compile can be cut; it records a greedy continuation, so variants that
    should compute the same thing can be compared. reduce-overhead brings torch's own CUDA
    graphs, so the engine's are off for it."""
    path = out / f"stepbench-{name or 'compile-' + mode + '-program'}.json"
    cmd = [
        sys.executable,
        "-m",
        "engines.pytorch.stepbench",
        "--model",
        model,
        "--batches",
        batches,
        "--steps",
        "32",
        "--profile",
        "--check-tokens",
        "32",
        "--decode-attention",
        "batched",
        "--cuda-graphs",
        "off" if mode == "reduce-overhead" else "on",
        "--fused-norms",
        "on",
        "--compile-mode",
        mode,
        "--decode-program",
        "on",
        "--triton-gemv",
        "on",
        *flags,
        "--out",
        str(path),
    ]
    t0 = time.monotonic()
    proc = subprocess.run(
        cmd, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout_s, check=False
    )
    res: dict[str, Any] = {"returncode": proc.returncode, "wall_s": time.monotonic() - t0}
    if proc.returncode != 0:
        res["stderr_tail"] = proc.stderr[-3000:]
    if path.exists():
        res["stepbench"] = json.loads(path.read_text())
    return res


def in_process(rec: Recorder, args: argparse.Namespace, skip: set[str]) -> None:
    """The sections that share one loaded model (freed on return, before the server)."""
    loaded = load_model(args.model, dtype="auto", device=args.device)
    on_cuda = loaded.device.type == "cuda"
    quantize = served_quantization(shlex.split(args.server_args))
    rec.run("roofline", lambda: roofline(loaded, args.model, quantize))
    if "generate" not in skip:
        rec.run("generate", lambda: generate_baseline(loaded, PROMPT_LEN, args.generate_tokens))
    # Fused norms change the model for good, so the unfused modes go first; the decode
    # program (merged projections) goes last.
    modes = [
        ("step_rowwise_eager", False, False, False, False, 6, (1,)),
        ("step_batched_eager", True, False, False, False, 8, (1,)),
        ("step_batched_graphs_unfused", True, True, False, False, 16, ()),
        ("step_batched_graphs", True, True, True, False, 32, BATCHES),
        ("step_program_graphs", True, True, True, True, 32, BATCHES),
        ("step_program_graphs_gemv", True, True, True, "gemv", 32, (1,)),
    ]
    for name, batched, graphs, fused, program, steps, profiled in modes:
        if name in skip:
            continue
        rec.run(
            name,
            # On CPU (a dry run of this script) the graph modes run eagerly.
            lambda b=batched, g=graphs and on_cuda, f=fused, pr=program, n=steps, pb=profiled: (
                step_mode(
                    loaded,
                    batched=b,
                    graphs=g,
                    fused=f,
                    program=bool(pr),
                    triton_gemv=pr == "gemv" and on_cuda,
                    steps=n,
                    warmup=2,
                    profile_batches=pb,
                )
            ),
        )


def compare_greedy(data: dict[str, Any], reference: Path) -> dict[str, bool | None]:
    """Each server section's greedy digest against the same section's in `reference` (None
    where either has none: a failed request, or text that did not repeat within a run)."""
    earlier = json.loads(reference.read_text())["sections"]
    same: dict[str, bool | None] = {}
    for name, section in data["sections"].items():
        greedy = section.get("greedy") if isinstance(section, dict) else None
        if greedy is None:
            continue
        ours = greedy["texts_sha256"]
        theirs = ((earlier.get(name) or {}).get("greedy") or {}).get("texts_sha256")
        greedy["same_as_reference"] = same[name] = ours == theirs if ours and theirs else None
    return same


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    p = argparse.ArgumentParser(prog="python -m benchmarks.pytorch_engine_h200")
    p.add_argument("out", type=Path)
    p.add_argument("--model", default="random:gemma-4-e2b")
    p.add_argument("--device", default="cuda")
    p.add_argument("--output-tokens", type=int, default=512, help="sweep shape: 128 in, N out")
    p.add_argument("--generate-tokens", type=int, default=64)
    p.add_argument("--levels", default="1,8,64")
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--server-args", default="", help="more flags for the server (one string)")
    p.add_argument(
        "--server-variant",
        action="append",
        default=[],
        help="NAME=FLAGS: one more server sweep with these flags, after the others",
    )
    p.add_argument(
        "--step-variant",
        action="append",
        default=[],
        help="NAME=FLAGS: the compiled step (default mode) with these stepbench flags, e.g. "
        "pdl='--pdl on'; run before the server",
    )
    p.add_argument(
        "--greedy-reference",
        type=Path,
        help="an earlier run's result.json: does each server write the same greedy text as "
        "the server of the same name there?",
    )
    p.add_argument("--skip", default="", help="comma-separated sections to skip")
    p.add_argument("--compile-mode", action="append", default=[], help="torch.compile modes")
    p.add_argument("--compile-timeout-s", type=float, default=300.0)
    p.add_argument(
        "--compile-batches",
        default="1",
        help="batch sizes of the compiled step (static shapes: about a minute each on an H200)",
    )
    p.add_argument(
        "--budget-s",
        type=float,
        default=480.0,
        help="seconds for the whole run: a compile or server variant that would not fit is "
        "skipped (recorded), so the table is always written",
    )
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    skip = set(args.skip.split(","))
    rec = Recorder(args.out, argv)
    rec.run("environment", environment)
    in_process(rec, args, skip)
    _free_cuda()
    for variant in args.step_variant:
        name, _, text = variant.partition("=")
        flags = shlex.split(text)
        timeout = max(60.0, min(args.compile_timeout_s, args.budget_s - rec.elapsed()))
        rec.run(
            f"variant-{name}",
            lambda n=name, f=flags, t=timeout: {
                "flags": f,
                **compiled_mode(
                    args.out, args.model, "default", t, args.compile_batches, flags=f, name=n
                ),
            },
        )
    server_s = 0.0  # the longest server sweep so far: what one more needs of the budget
    if "server" not in skip:
        levels = [int(x) for x in args.levels.split(",") if x]
        shape = Shape(input_tokens=PROMPT_LEN, output_tokens=args.output_tokens)
        extra = shlex.split(args.server_args)
        started = rec.elapsed()
        rec.run(
            "server",
            lambda: server_sweep(args.out, args.model, shape, levels, args.repeats, extra),
        )
        server_s = rec.elapsed() - started
    for mode in args.compile_mode:
        left = args.budget_s - rec.elapsed()
        if left < 60:
            rec.data["errors"][f"compile-{mode}"] = f"skipped: {left:.0f}s of the budget left"
            continue
        timeout = min(args.compile_timeout_s, left)
        rec.run(
            f"compile-{mode}",
            lambda m=mode, t=timeout: compiled_mode(
                args.out, args.model, m, t, args.compile_batches
            ),
        )
    for variant in args.server_variant:
        name, _, flags = variant.partition("=")
        left = args.budget_s - rec.elapsed()
        if left < server_s:
            rec.data["errors"][f"server-{name}"] = (
                f"skipped: {left:.0f}s of the budget left, a server sweep took {server_s:.0f}s"
            )
            continue
        extra = [*shlex.split(args.server_args), *shlex.split(flags)]
        levels = [int(x) for x in args.levels.split(",") if x]
        shape = Shape(input_tokens=PROMPT_LEN, output_tokens=args.output_tokens)
        started = rec.elapsed()
        rec.run(
            f"server-{name}",
            lambda e=extra, lv=levels, sh=shape, n=name: server_sweep(
                args.out, args.model, sh, lv, args.repeats, e, tag=f"-{n}"
            ),
        )
        server_s = max(server_s, rec.elapsed() - started)
    if args.greedy_reference:
        rec.run("greedy_reference", lambda: compare_greedy(rec.data, args.greedy_reference))
    rec.data["total_s"] = rec.elapsed()
    rec.data["table"] = table(rec.data)
    rec.save()
    print(rec.data["table"])
    for name, err in rec.data["errors"].items():
        print(f"ERROR in {name}: {err.splitlines()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
