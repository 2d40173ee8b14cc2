"""The per-layer gate and projection of E2B's batch-1 int4 step as one kernel, against the
two the engine launches (issue 18).

At one request the served step is a chain of about 300 dependent kernels, and a small
product costs about 4.2 us on it against 1.3-2.6 us alone
(`benchmarks/records/2026-12-05-h200-attention-prewait.md`). The last two of each layer
are the smallest: the per-layer gate (256 x 1,536, after the residual step of the MLP,
gelu_tanh(.) times the layer's per-layer input) and the projection back (1,536 x 256,
then the residual step, by its last program). Their pair, `ple_pair_int4`, is one launch:
every program rebuilds the residual row and computes the whole gate itself (its own copy
of the 256 values, from the 0.2 MB of int4 weights that L2 serves to all), then its rows
of the projection, and the last program takes the residual step. That trades a dependent
boundary and a kernel's serial path for each program reading the gate's weights. Both
halves are `triton_int4.gemv_int4_tile`, the engine's own batch-1 program, so the
arithmetic is the engine's.

The benchmark times E2B's pair as a chain in one CUDA graph, each layer with its own
weights and enough layers that they stream from DRAM (as a step's do): the engine's two
launches a layer against the fused launch at a few block shapes, and the largest
difference of the layer outputs. Refused: one program computing the whole gate costs
far more than the boundary it saves, alone and in the served step
(`benchmarks/records/2026-12-06-h100-ple-pair-refused.md`); the benchmark stays as what
was tried.

    python -m benchmarks.ple_pair_h200 [--out ple_pair.json]
    TRITON_INTERPRET=1 python -m benchmarks.ple_pair_h200 --dry-run   # on a CPU
    python -m benchmarks.ple_pair_h200 --build   # each config built for sm_90, on a CPU

Prints a table; needs a CUDA device with Triton (`--dry-run`, `--build`: none).
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import argparse
import json
import math
import os
from pathlib import Path
from typing import Any

import triton
import triton.language as tl

from engines.pytorch.triton_int4 import gemv_int4_tile

HIDDEN, PER_LAYER, LAYERS = 1536, 256, 35  # E2B
# (the gate's chunk of inputs, the projection's outputs a program, warps)
# Four warps hold the whole gate's chunk in 255 registers a thread (`--build`); eight hold it in
# about 180.
CONFIGS = ((128, 32, 8), (128, 64, 8), (256, 32, 8), (256, 64, 8), (256, 128, 8), (256, 64, 16))


@triton.jit
def ple_pair_int4(
    x_ptr, d_ptr, nff_ptr, ple_ptr, wg_ptr, wgs_ptr, wp_ptr, wps_ptr, nple_ptr, s_ptr,
    g_ptr, xn_ptr, p_ptr, xo_ptr, count_ptr, P, H, eps, SCALE: tl.constexpr,
    GROUP: tl.constexpr, PDL: tl.constexpr, GATE_BLOCK_N: tl.constexpr,
    GATE_BLOCK_K: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    pid = tl.program_id(0)
    g_slot = g_ptr + pid * P
    xn_slot = xn_ptr + pid * H
    # The whole gate, as the engine's residual-prologue launch makes it with one program:
    # x_new = x + RMSNorm(d) * nff into this program's own slot, g = gelu(Wg x_new) * ple.
    gemv_int4_tile(
        0, 1, x_ptr, d_ptr, x_ptr, nff_ptr, s_ptr, xn_slot, ple_ptr, count_ptr, wg_ptr,
        wgs_ptr, g_slot, P, H, eps, count_ptr, 0, 3, False, 2, PDL, GROUP, GATE_BLOCK_N,
        GATE_BLOCK_K, True, False, False,
    )  # fmt: skip
    # The slots are this program's: its threads' stores are visible to it after a barrier.
    tl.debug_barrier()
    # Its rows of the projection of g, and the residual step after the last program:
    # (x_new + RMSNorm(p) * nple) [* scalar] into xo.
    gemv_int4_tile(
        pid, tl.num_programs(0), g_slot, xn_slot, x_ptr, nple_ptr, s_ptr, xo_ptr, x_ptr,
        count_ptr, wp_ptr, wps_ptr, p_ptr, H, P, eps, count_ptr, 0, 0, SCALE, 3, False,
        GROUP, BLOCK_N, BLOCK_K, True, False, False,
    )  # fmt: skip


def fused(layer: dict[str, Any], x: Any, config: tuple[int, int, int]) -> Any:
    """The layer's pair through `ple_pair_int4`: the new residual row."""
    import torch

    from engines.pytorch import dependent_launch, kernels

    gate_block_k, block_n, warps = config
    (wg, wgs), (wp, wps) = layer["gate"], layer["proj"]
    per_layer, hidden = wg.shape[0], x.shape[-1]
    programs = -(-hidden // block_n)
    gate_width = triton.next_power_of_2(per_layer)
    pdl = dependent_launch.enabled(x.device)
    scalar = layer["scalar"]
    out = torch.empty_like(x)
    ple_pair_int4[(programs,)](
        x, layer["d"], layer["n_post_ff"], layer["ple"], wg, wgs, wp, wps,
        layer["n_post_ple"], x if scalar is None else scalar,
        torch.empty(programs, per_layer, dtype=x.dtype, device=x.device),
        torch.empty(programs, hidden, dtype=x.dtype, device=x.device),
        torch.empty(1, hidden, dtype=x.dtype, device=x.device), out,
        kernels._residual_counter(x.device), per_layer, hidden, 1e-6,
        SCALE=scalar is not None, GROUP=hidden // wgs.shape[1], PDL=pdl,
        GATE_BLOCK_N=gate_width, GATE_BLOCK_K=gate_block_k, BLOCK_N=block_n,
        BLOCK_K=gate_width, num_warps=warps, launch_pdl=pdl,
    )  # fmt: skip
    return out


def separate(layer: dict[str, Any], x: Any) -> Any:
    """The layer's pair as the decode program launches it (`programs`, batch 1)."""
    from engines.pytorch import kernels

    g, x_new = kernels.residual_linear(
        x, layer["d"], layer["n_post_ff"], None, None, 1e-6, layer["gate"], True,
        gate_times=layer["ple"],
    )  # fmt: skip
    return kernels.linear_residual(
        g, layer["proj"], x_new, layer["n_post_ple"], layer["scalar"], 1e-6, True
    )


def reference(layer: dict[str, Any], x: Any) -> Any:
    """The pair in float32 torch, on the dequantized weights."""
    import torch
    import torch.nn.functional as F

    from engines.pytorch import int4

    def norm(v: Any, w: Any) -> Any:
        return torch.rms_norm(v.float(), (v.shape[-1],), w.float(), 1e-6)

    x_new = x.float() + norm(layer["d"], layer["n_post_ff"])
    gate = x_new @ int4.dequantize(*layer["gate"], torch.float32).T
    g = F.gelu(gate, approximate="tanh") * layer["ple"].float()
    p = g @ int4.dequantize(*layer["proj"], torch.float32).T
    out = x_new + norm(p, layer["n_post_ple"])
    return out if layer["scalar"] is None else out * layer["scalar"].float()


def layers(count: int, hidden: int, per_layer: int, device: str) -> list[dict[str, Any]]:
    import torch

    from engines.pytorch import int4

    gen = torch.Generator(device=device).manual_seed(0)

    def rand(*shape: int, scale: float = 1.0) -> Any:
        return (torch.randn(*shape, generator=gen, device=device) * scale).to(torch.bfloat16)

    return [
        {
            "gate": int4.quantize(rand(per_layer, hidden, scale=hidden**-0.5), 32),
            "proj": int4.quantize(rand(hidden, per_layer, scale=per_layer**-0.5), 32),
            "d": rand(1, hidden),
            "n_post_ff": rand(hidden),
            "ple": rand(1, per_layer),
            "n_post_ple": rand(hidden),
            "scalar": rand(1).abs() + 0.5 if i % 2 else None,
        }
        for i in range(count)
    ]


def dry_run() -> list[dict[str, Any]]:
    """Both forms against the float32 reference in Triton's interpreter, on a small layer
    (every program computes the whole gate, which the interpreter runs slowly)."""
    import torch

    from engines.pytorch import int4_tuning, kernels, triton_int4, triton_interpreter

    triton_interpreter.fix()
    kernels._use_kernel = lambda fused, x, weight: fused and x.shape[0] == 1  # type: ignore[assignment]
    triton_int4.gemv_int4.configs = [int4_tuning.GEMV_INT4_CONFIGS[1]]
    checks = []
    for layer in layers(2, 512, 64, "cpu"):
        x = (torch.randn(1, 512, generator=torch.Generator().manual_seed(1)) * 3).bfloat16()
        want = reference(layer, x)

        def error(got: Any, want: Any = want) -> float:
            return float((got.float() - want).abs().max() / want.abs().max())

        for config in ((256, 64, 4), (512, 128, 4)):
            checks.append({
                "config": list(config), "scalar": layer["scalar"] is not None,
                "fused_error": error(fused(layer, x, config)),
                "separate_error": error(separate(layer, x)),
            })  # fmt: skip
    return checks


def builds() -> list[dict[str, Any]]:
    """Each fused configuration built for sm_90 on this machine (no GPU): its registers a
    thread, and the barriers after its wait, against the engine's two kernels'."""
    from benchmarks.decode_residency import _build, barriers_after_wait
    from benchmarks.int4_issue_bound import registers

    names = ple_pair_int4.arg_names[:18]
    kinds = {"wg_ptr": "*i32", "wp_ptr": "*i32", "count_ptr": "*i32", "P": "i32", "H": "i32",
             "eps": "fp32"}  # fmt: skip
    signature = {name: kinds.get(name, "*bf16") for name in names}
    out = []
    for gate_block_k, block_n, warps in CONFIGS:
        constants = {"SCALE": True, "GROUP": 32, "PDL": True, "GATE_BLOCK_N": PER_LAYER,
                     "GATE_BLOCK_K": gate_block_k, "BLOCK_N": block_n,
                     "BLOCK_K": PER_LAYER}  # fmt: skip
        built = _build(ple_pair_int4, signature, constants, warps, 1)
        out.append({"config": [gate_block_k, block_n, warps], "registers": registers(built),
                    "barriers_after_wait": barriers_after_wait(built)})  # fmt: skip
    return out


def _chain_us(step: Any, count: int, xs: list[Any], replays: int = 20) -> float:
    """Microseconds a layer of a CUDA graph of `count` dependent calls of `step`."""
    from benchmarks.gemv_h200 import _timed_graph

    def chain() -> None:
        x = xs[0]
        for i in range(count):
            x = step(i, x)
        xs[1].copy_(x)

    return 1e6 * _timed_graph(chain, replays) / count


def measure() -> dict[str, Any]:
    import torch

    from benchmarks.gemv_h200 import MIN_STREAM_BYTES

    # Enough layers that their weights stream from DRAM on every replay, as a step's do
    # (E2B's 35 pairs alone, 15 MB, would stay in L2).
    layer_bytes = 2 * HIDDEN * PER_LAYER * (1 / 2 + 2 / 32)
    count = max(LAYERS, math.ceil(MIN_STREAM_BYTES / layer_bytes))
    stack = layers(count, HIDDEN, PER_LAYER, "cuda")
    x0 = torch.randn(1, HIDDEN, device="cuda").bfloat16()
    out = torch.empty_like(x0)
    rows: list[dict[str, Any]] = []
    want = separate(stack[0], x0).float()
    engine_us = _chain_us(lambda i, x: separate(stack[i], x), count, [x0, out])
    rows.append({"form": "engine: two launches a layer", "us_a_layer": engine_us})
    for config in CONFIGS:
        got = fused(stack[0], x0, config).float()
        diff = float((got - want).abs().max() / want.abs().max())
        us = _chain_us(lambda i, x, c=config: fused(stack[i], x, c), count, [x0, out])
        rows.append({"form": "fused", "config": list(config), "us_a_layer": us,
                     "max_difference_over_max": diff})  # fmt: skip
    return {"gpu": torch.cuda.get_device_name(), "layers": count, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.ple_pair_h200", description=__doc__)
    p.add_argument("--out")
    p.add_argument("--dry-run", action="store_true", help="the arithmetic in Triton's interpreter")
    p.add_argument("--build", action="store_true", help="each config built for sm_90 (no GPU)")
    args = p.parse_args(argv)
    if args.build:
        for b in builds():
            print(f"config {b['config']}: {b['registers']} registers a thread, "
                  f"{b['barriers_after_wait']} barriers after the wait")  # fmt: skip
        return 0
    if args.dry_run:
        if os.environ.get("TRITON_INTERPRET") != "1":
            p.error("--dry-run runs in Triton's interpreter: set TRITON_INTERPRET=1")
        checks = dry_run()
        ok = True
        for c in checks:
            # as the engine's interpreter checks hold a form: no further from float32 than
            # twice the other form, with a floor of 3% (the interpreter truncates bf16)
            c["ok"] = c["fused_error"] <= max(2 * c["separate_error"], 3e-2)
            ok = ok and c["ok"]
            print(f"config {c['config']} scalar {c['scalar']}: fused {c['fused_error']:.2e}, "
                  f"engine {c['separate_error']:.2e} of the max, ok {c['ok']}")  # fmt: skip
        if args.out:
            Path(args.out).write_text(json.dumps({"dry_run": checks}, indent=1))
        return 0 if ok else 1
    import torch

    if not torch.cuda.is_available():
        p.error("needs a CUDA device (or --dry-run)")
    result = measure()
    print(f"{result['gpu']}: E2B's per-layer gate and projection, {result['layers']} layers "
          "in one CUDA graph, int4 groups of 32; fused config (gate chunk, projection "
          "outputs a program, warps)")  # fmt: skip
    print("| form | config | us a layer | largest difference / max |")
    print("| --- | --- | --- | --- |")
    for r in result["rows"]:
        diff = r.get("max_difference_over_max")
        print(f"| {r['form']} | {r.get('config', '')} | {r['us_a_layer']:.2f} | "
              f"{'' if diff is None else f'{diff:.1e}'} |")  # fmt: skip
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
