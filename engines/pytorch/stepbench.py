"""In-process timing of the engine's model steps (no HTTP): decode step time at several batch
sizes, prefill time, transformers' plain `generate()` at batch 1 on the same model, and
the roofline (weight bytes streamed per decode step over measured copy bandwidth).

It measures the runner, not the server: `bench sweep` against the HTTP server is the
figure users compare; this one says how much of it the model step is, and profiles it.
The runner's modes are flags: row-by-row or batched decode attention, CUDA graphs, and
torch.compile of the batched step (`--compile-mode`), so each can be measured alone.
`--profile` profiles a decode step at each batch size, `--profile-prefill N` one packed
prefill of N prompts (how much of it is the host's).

    python -m engines.pytorch.stepbench --model random:gemma-4-e2b --batches 1,8,64 \
        --decode-attention batched --cuda-graphs on --profile
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engines.pytorch import int4, kernels
from engines.pytorch.config import ATTENTION_FORMS, EngineConfig
from engines.pytorch.model import LoadedModel, load_model
from engines.pytorch.runner import ModelRunner

log = logging.getLogger(__name__)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    _sync(device)
    t0 = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - t0


def _weights(module: nn.Module | None) -> list[torch.Tensor]:
    if module is None:
        return []
    if isinstance(module, int4.Int4Linear | int4.Int4Embedding):
        return [module.packed, module.scale]
    return list(module.parameters(recurse=False))


def streamed_weight_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads from weights: every parameter (int4 modules: their
    packed values and scales) except embedding tables that are only gathered from (an
    input embedding tied to the output head counts)."""
    hf: Any = model  # a transformers model; nn.Module's stub types attributes as tensors
    head = {t.data_ptr() for t in _weights(hf.get_output_embeddings())}
    gathered = {
        t.data_ptr()
        for m in model.modules()
        if isinstance(m, nn.Embedding | int4.Int4Embedding)
        for t in _weights(m)
        if t.data_ptr() not in head
    }
    seen: set[int] = set()
    total = 0
    for m in model.modules():
        for t in _weights(m):
            if t.data_ptr() in gathered or t.data_ptr() in seen:
                continue
            seen.add(t.data_ptr())
            total += t.numel() * t.element_size()
    return total


def weight_bytes(model: nn.Module) -> int:
    """Bytes of every weight the model holds (int4 modules: packed values and scales)."""
    seen: set[int] = set()
    total = 0
    for m in model.modules():
        for t in _weights(m):
            if t.data_ptr() not in seen:
                seen.add(t.data_ptr())
                total += t.numel() * t.element_size()
    return total


def copy_bandwidth(device: torch.device, nbytes: int = 1 << 30, repeats: int = 10) -> float:
    """Device-to-device copy, bytes read plus written per second (best of `repeats`)."""
    src = torch.empty(nbytes // 2, dtype=torch.float16, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    best = min(_timed(lambda: dst.copy_(src), device) for _ in range(repeats))
    return 2 * nbytes / best


def decode_times(
    runner: ModelRunner, batch: int, prompt_len: int, steps: int, warmup: int
) -> dict[str, Any]:
    prompt = [(7 * i) % 200 + 1 for i in range(prompt_len)]
    slots = list(range(batch))
    # Prompts packed 16 to a forward, as the scheduler packs them on CUDA: 64 eager
    # one-prompt forwards would take longer than everything else here.
    groups = [slots[i : i + 16] for i in range(0, batch, 16)]
    prefill_s = sum(
        _timed(functools.partial(runner.prefill_many, [(s, prompt, 0) for s in g]), runner.device)
        for g in groups
    )
    times = []
    for k in range(warmup + steps):
        positions = [prompt_len + k] * batch
        dt = _timed(functools.partial(runner.decode, slots, [5] * batch, positions), runner.device)
        if k >= warmup:
            times.append(dt)
    step = statistics.median(times)
    # The same steps again, queued back to back with one wait at the end, as the server's
    # asynchronous decode runs them: each step above waits for the device, so it also
    # counts the host's preparation of the next (at batch 1 on an H200, 2.4 ms a step
    # against the served step's 1.6).
    _sync(runner.device)
    t0 = time.perf_counter()
    for k in range(warmup, warmup + steps):
        runner.decode(slots, [5] * batch, [prompt_len + k] * batch)
    _sync(runner.device)
    queued = (time.perf_counter() - t0) / steps
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "prefill_ms_per_prompt": 1e3 * prefill_s / batch,
        "decode_step_ms_median": 1e3 * step,
        "decode_step_ms_min": 1e3 * min(times),
        "decode_step_ms_queued": 1e3 * queued,
        "decode_tok_s": batch / step,
    }


def _profiled(fn: Callable[[], object], device: torch.device, top_n: int) -> dict[str, Any]:
    """`fn` (already warm) timed unprofiled (median of 5), then once under torch.profiler:
    device time against the wall time, host time, and the top kernels and host ops."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    wall = statistics.median(_timed(fn, device) for _ in range(5))
    with profile(activities=activities) as prof:
        fn()
        _sync(device)
    events = prof.key_averages()
    device_events = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    host_events = [e for e in events if e not in device_events]
    device_ms = sum(getattr(e, "self_device_time_total", 0) for e in device_events) / 1e3
    top = sorted(
        device_events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True
    )[:top_n]
    top_host = sorted(host_events, key=lambda e: e.self_cpu_time_total, reverse=True)[:top_n]
    return {
        "wall_ms": 1e3 * wall,
        "device_kernels": sum(e.count for e in device_events),
        "device_time_ms": device_ms,
        # Share of the wall time the GPU spends in kernels: near 1 is GPU-bound, far
        # below it the host (Python, launches) is what the work waits for.
        "device_busy_fraction": device_ms / (1e3 * wall) if wall > 0 else None,
        "host_ops": sum(e.count for e in host_events),
        "host_self_cpu_ms": sum(e.self_cpu_time_total for e in host_events) / 1e3,
        "top_kernels": [
            {
                "kernel": e.key[:100],
                "count": e.count,
                "ms": getattr(e, "self_device_time_total", 0) / 1e3,
            }
            for e in top
        ],
        "top_host_ops": [
            {"op": e.key[:80], "count": e.count, "self_cpu_ms": e.self_cpu_time_total / 1e3}
            for e in top_host
        ],
    }


def profile_decode(
    runner: ModelRunner, batch: int, prompt_len: int, top_n: int = 15
) -> dict[str, Any]:
    """One decode step under torch.profiler (`_profiled`)."""
    slots = list(range(batch))
    positions = [prompt_len + 40] * batch  # within the timed steps' KV bucket
    runner.cache.ensure_capacity(prompt_len + 41)
    for _ in range(2):  # warm: a graph for this shape is captured here, not profiled
        runner.decode(slots, [5] * batch, positions)
    profiled = _profiled(lambda: runner.decode(slots, [5] * batch, positions), runner.device, top_n)
    return {"batch": batch, "step_wall_ms": profiled.pop("wall_ms"), **profiled}


def profile_prefill(
    runner: ModelRunner, prompts: int, prompt_len: int, top_n: int = 15
) -> dict[str, Any]:
    """One packed prefill of `prompts` prompts, as the scheduler packs them, under
    torch.profiler (`_profiled`): a prefill's wall time far above its device time is
    the host's (per-prompt attention, launches)."""
    prompt = [(7 * i) % 200 + 1 for i in range(prompt_len)]

    def prefill() -> None:
        runner.prefill_many([(slot, prompt, 0) for slot in range(prompts)])

    for _ in range(2):
        prefill()
    profiled = _profiled(prefill, runner.device, top_n)
    return {"prompts": prompts, "prompt_len": prompt_len, **profiled}


def greedy_trace(runner: ModelRunner, prompt_len: int, count: int) -> dict[str, list[Any]]:
    """Greedy continuation of a fixed prompt in slot 0: variants of the same step (kernels,
    launch modes) must agree on it. With each token, a digest of its logits (to the bit)
    and the gap between the two largest: where two runs' tokens part, the first digest that
    differs says which step's sums differed first (0: the prefill's), and the gap there
    whether a near tie flipped."""
    prompt = [(11 * i) % 200 + 1 for i in range(prompt_len)]
    tokens: list[int] = []
    digests: list[str] = []
    gaps: list[float] = []

    def take(logits: torch.Tensor) -> int:
        row = logits.reshape(-1).float().cpu()  # bf16 to float32 is exact
        top = torch.topk(row, 2).values
        digests.append(hashlib.sha256(row.numpy().tobytes()).hexdigest()[:16])
        gaps.append(float(top[0] - top[1]))
        tokens.append(int(row.argmax()))
        return tokens[-1]

    token = take(runner.prefill(0, prompt))
    for k in range(count - 1):
        token = take(runner.decode([0], [token], [prompt_len + k])[0])
    return {"tokens": tokens, "logits_sha256": digests, "top_gap": gaps}


def first_difference(first: list[str], second: list[str]) -> int | None:
    """The first index at which two traces' digests differ; None where all agree."""
    return next((i for i, (a, b) in enumerate(zip(first, second, strict=True)) if a != b), None)


def generate_baseline(loaded: LoadedModel, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    """transformers' own `generate()`, greedy, batch 1, its default cache and attention."""
    model = loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        ids = torch.tensor([[(7 * i) % 200 + 1 for i in range(prompt_len)]], device=loaded.device)
        kwargs: dict[str, Any] = {
            "do_sample": False,
            "min_new_tokens": new_tokens,
            "pad_token_id": 0,
        }
        # `generate` is GenerationMixin's, which a causal LM has and PreTrainedModel's stub
        # does not list (torch's __getattr__ then types it as a Tensor).
        generate: Callable[..., object] = model.generate  # type: ignore[assignment]
        with torch.inference_mode():
            generate(ids, max_new_tokens=4, **kwargs)
            seconds = _timed(
                lambda: generate(ids, max_new_tokens=new_tokens, **kwargs), loaded.device
            )
    finally:
        model.set_attn_implementation(previous)
    return {"new_tokens": new_tokens, "seconds": seconds, "tok_s": new_tokens / seconds}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(prog="python -m engines.pytorch.stepbench", description=__doc__)
    p.add_argument("--model", default="random:tiny")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--warmup", type=int, default=4)
    p.add_argument("--batch-invariant", choices=("on", "off"), default="off")
    p.add_argument("--decode-attention", choices=("ragged", "batched"), default="ragged")
    p.add_argument("--cuda-graphs", choices=("on", "off"), default="off")
    p.add_argument("--fused-norms", choices=("on", "off"), default="off")
    p.add_argument(
        "--decode-program",
        choices=("on", "off"),
        default="off",
        help="the model's own batched decode step (see engines.pytorch.programs)",
    )
    p.add_argument(
        "--triton-gemv",
        choices=("on", "off"),
        default="off",
        help="batch-1 projections of the decode program through the Triton kernel",
    )
    p.add_argument("--attention-form", choices=ATTENTION_FORMS, default=EngineConfig.attention_form)
    p.add_argument(
        "--gemv-fusion",
        choices=("prologue", "epilogue"),
        default="epilogue",
        help="norms and GELU gates before the products that read them, or norm scales and "
        "gates after the products that make them (engines.pytorch.kernels)",
    )
    p.add_argument("--dependent-launch", choices=("auto", "off"), default="auto")
    p.add_argument(
        "--check-tokens",
        type=int,
        default=0,
        help="greedy-decode this many tokens at batch 1 and record them (compare variants)",
    )
    p.add_argument(
        "--compile-mode",
        default=None,
        help="torch.compile the batched step: default, reduce-overhead, "
        "max-autotune-no-cudagraphs (none: eager)",
    )
    p.add_argument("--generate-tokens", type=int, default=0, help="0: skip the generate() baseline")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument(
        "--profile", action="store_true", help="profile one decode step at the batch sizes"
    )
    p.add_argument(
        "--profile-prefill",
        type=int,
        default=0,
        metavar="PROMPTS",
        help="profile one packed prefill of this many prompts of --prompt-len tokens",
    )
    p.add_argument("--quantize", choices=("none", "w4a16"), default="none")
    p.add_argument("--int4-configs", type=Path, help="the int4 kernels' pinned table")
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    loaded = load_model(
        args.model,
        dtype=args.dtype,
        device=args.device,
        quantize=args.quantize,
        int4_configs=args.int4_configs,
    )
    load_peak_bytes = None
    if loaded.device.type == "cuda":
        # Loading (and `--quantize`'s temporaries) has its own peak, apart from the steps'.
        load_peak_bytes = torch.cuda.max_memory_reserved(loaded.device)
        torch.cuda.reset_peak_memory_stats(loaded.device)
    runner = ModelRunner(
        loaded,
        num_slots=max(*batches, args.profile_prefill),
        batch_invariant=args.batch_invariant == "on",
        batched_decode=args.decode_attention == "batched",
        cuda_graphs=args.cuda_graphs == "on",
        fused_norms=args.fused_norms == "on",
        compile_mode=args.compile_mode,
        decode_program=args.decode_program == "on",
        triton_gemv=args.triton_gemv == "on",
        attention_form=args.attention_form,
        gemv_epilogues=args.gemv_fusion == "epilogue",
        dependent_launch=args.dependent_launch == "auto",
    )
    result: dict[str, Any] = {
        "model": args.model,
        "device": torch.cuda.get_device_name(loaded.device)
        if loaded.device.type == "cuda"
        else "cpu",
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "batch_invariant": args.batch_invariant,
        "decode_attention": args.decode_attention,
        "cuda_graphs": args.cuda_graphs,
        "fused_norms": args.fused_norms,
        "compile_mode": args.compile_mode,
        "decode_program": runner.program is not None,
        "triton_gemv": args.triton_gemv,
        "attention_form": args.attention_form,
        "gemv_fusion": args.gemv_fusion,
        "dependent_launch": args.dependent_launch,
        "quantize": args.quantize,
        "quantization": None if loaded.quantization is None else loaded.quantization.summary(),
        "weight_bytes_streamed": streamed_weight_bytes(loaded.model),
        "weight_bytes_held": weight_bytes(loaded.model),
        "cuda_memory_allocated_bytes": torch.cuda.memory_allocated(loaded.device)
        if loaded.device.type == "cuda"
        else None,
        "decode": [
            decode_times(runner, b, args.prompt_len, args.steps, args.warmup) for b in batches
        ],
    }
    if loaded.device.type == "cuda":
        # The most the caching allocator held while the steps ran: the weights, the KV
        # pools and the decode graphs' pool (their workspaces included).
        result["cuda_memory_reserved_peak_bytes"] = torch.cuda.max_memory_reserved(loaded.device)
        result["cuda_memory_reserved_peak_load_bytes"] = load_peak_bytes
        bw = copy_bandwidth(loaded.device)
        result["copy_bandwidth_gb_s"] = bw / 1e9
        result["roofline_step_ms"] = 1e3 * result["weight_bytes_streamed"] / bw
        result["roofline_tok_s_batch1"] = bw / result["weight_bytes_streamed"]
    if args.profile:
        result["profiles"] = [profile_decode(runner, b, args.prompt_len) for b in batches]
    if args.profile_prefill:
        result["prefill_profile"] = profile_prefill(runner, args.profile_prefill, args.prompt_len)
    result["gemv_configs"] = kernels.tuned_configs()
    if args.check_tokens:
        greedy = greedy_trace(runner, args.prompt_len, args.check_tokens)
        result["greedy_tokens_batch1"] = greedy["tokens"]
        result["greedy_logits_sha256_batch1"] = greedy["logits_sha256"]
        result["greedy_top_gap_batch1"] = greedy["top_gap"]
        # The same trace twice more in this process: logits that differ here come from a
        # race or an order that changes from run to run, not from a choice made once a
        # process. Where the second and third agree and the first differs, the first met
        # state the later ones did not (a graph captured in it, memory not yet written).
        second, third = (
            greedy_trace(runner, args.prompt_len, args.check_tokens)["logits_sha256"]
            for _ in range(2)
        )
        result["greedy_in_process_first_differ"] = first_difference(greedy["logits_sha256"], second)
        result["greedy_in_process_third_first_differ"] = first_difference(second, third)
        if loaded.device.type == "cuda":
            result["counters_left_nonzero"] = kernels.counters_left_nonzero(loaded.device)
    if args.generate_tokens:
        result["generate_batch1"] = generate_baseline(loaded, args.prompt_len, args.generate_tokens)
    text = json.dumps(result, indent=2)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    log.info("stepbench: %s", text)
    return result


if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    main()
