"""In-process timing of the engine's model steps (no HTTP): decode step time at several batch
sizes, prefill time, transformers' plain `generate()` at batch 1 on the same model, and
the roofline (weight bytes streamed per decode step over measured copy bandwidth).

It measures the runner, not the server: `bench sweep` against the HTTP server is the
figure users compare; this one says how much of it the model step is, and profiles it.

    python -m engines.pytorch.stepbench --model random:gemma-4-e2b --batches 1,8,64
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

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


def streamed_weight_bytes(model: nn.Module) -> int:
    """Bytes a decode step reads from weights: every parameter except embedding tables
    that are only gathered from (an input embedding tied to the output head counts)."""
    out_emb = model.get_output_embeddings()
    head = out_emb.weight.data_ptr() if out_emb is not None else None
    gathered = {
        m.weight.data_ptr()
        for m in model.modules()
        if isinstance(m, nn.Embedding) and m.weight.data_ptr() != head
    }
    return sum(
        p.numel() * p.element_size() for p in model.parameters() if p.data_ptr() not in gathered
    )


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
    prefill_s = [_timed(lambda s=s: runner.prefill(s, prompt), runner.device) for s in range(batch)]
    slots = list(range(batch))
    times = []
    for k in range(warmup + steps):
        positions = [prompt_len + k] * batch
        dt = _timed(lambda p=positions: runner.decode(slots, [5] * batch, p), runner.device)
        if k >= warmup:
            times.append(dt)
    step = statistics.median(times)
    return {
        "batch": batch,
        "prompt_len": prompt_len,
        "prefill_ms_median": 1e3 * statistics.median(prefill_s),
        "decode_step_ms_median": 1e3 * step,
        "decode_step_ms_min": 1e3 * min(times),
        "decode_tok_s": batch / step,
    }


def profile_decode(runner: ModelRunner, batch: int, prompt_len: int) -> dict[str, Any]:
    """One decode step under torch.profiler: kernel launches, device and host time, top ops."""
    from torch.profiler import ProfilerActivity, profile

    slots = list(range(batch))
    positions = [prompt_len + 1000] * batch  # past the timed steps' positions
    runner.cache.ensure_capacity(prompt_len + 1001)
    activities = [ProfilerActivity.CPU]
    if runner.device.type == "cuda":
        activities.append(ProfilerActivity.CUDA)
    runner.decode(slots, [5] * batch, positions)
    _sync(runner.device)
    with profile(activities=activities) as prof:
        runner.decode(slots, [5] * batch, positions)
        _sync(runner.device)
    events = prof.key_averages()
    device_events = [e for e in events if str(getattr(e, "device_type", "")).endswith("CUDA")]
    top = sorted(events, key=lambda e: getattr(e, "self_device_time_total", 0), reverse=True)[:12]
    return {
        "batch": batch,
        "device_kernels": sum(e.count for e in device_events),
        "device_time_ms": sum(getattr(e, "self_device_time_total", 0) for e in device_events) / 1e3,
        "host_ops": sum(e.count for e in events if e not in device_events),
        "top_by_device_time": [
            {
                "op": e.key[:80],
                "count": e.count,
                "ms": getattr(e, "self_device_time_total", 0) / 1e3,
            }
            for e in top
        ],
    }


def generate_baseline(loaded: LoadedModel, prompt_len: int, new_tokens: int) -> dict[str, Any]:
    """transformers' own `generate()`, greedy, batch 1, its default cache and attention."""
    model = loaded.model
    previous = model.config._attn_implementation
    model.set_attn_implementation("sdpa")
    try:
        ids = torch.tensor([[(7 * i) % 200 + 1 for i in range(prompt_len)]], device=loaded.device)
        kwargs = {"do_sample": False, "min_new_tokens": new_tokens, "pad_token_id": 0}
        with torch.inference_mode():
            model.generate(ids, max_new_tokens=4, **kwargs)
            seconds = _timed(
                lambda: model.generate(ids, max_new_tokens=new_tokens, **kwargs), loaded.device
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
    p.add_argument("--generate-tokens", type=int, default=0, help="0: skip the generate() baseline")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="profile one decode step at batch 1")
    p.add_argument("--out", help="write the results here as JSON")
    args = p.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    batches = [int(b) for b in args.batches.split(",") if b]
    loaded = load_model(args.model, dtype=args.dtype, device=args.device)
    runner = ModelRunner(
        loaded, num_slots=max(batches), batch_invariant=args.batch_invariant == "on"
    )
    result: dict[str, Any] = {
        "model": args.model,
        "device": torch.cuda.get_device_name(loaded.device)
        if loaded.device.type == "cuda"
        else "cpu",
        "dtype": str(loaded.dtype).removeprefix("torch."),
        "torch": torch.__version__,
        "batch_invariant": args.batch_invariant,
        "weight_bytes_streamed": streamed_weight_bytes(loaded.model),
        "decode": [
            decode_times(runner, b, args.prompt_len, args.steps, args.warmup) for b in batches
        ],
    }
    if loaded.device.type == "cuda":
        bw = copy_bandwidth(loaded.device)
        result["copy_bandwidth_gb_s"] = bw / 1e9
        result["roofline_step_ms"] = 1e3 * result["weight_bytes_streamed"] / bw
        result["roofline_tok_s_batch1"] = bw / result["weight_bytes_streamed"]
    if args.profile:
        result["profile_batch1"] = profile_decode(runner, 1, args.prompt_len)
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
