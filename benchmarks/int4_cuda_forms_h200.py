"""The decode program's batch-1 int4 products in each fused form (issue 18): every form
and shape of an E2B step, as `kernels`' entry points launch it, through `gemv_int4`
(Triton) and through `cuda_int4`'s CUDA C product at each split it allows, side by side in
one run. Each is timed as a dependent chain over weight copies past L2 in one CUDA graph
(as `benchmarks.int4_cuda_gemv_h200` times the plain product); the step's sum weights
each form by its count. `cuda_int4.MEASURED_FORMS` (which fused forms it serves, at
which split) comes from here.

    python -m benchmarks.int4_cuda_forms_h200 [--out result.json] [--forms qkv,o]
"""

from __future__ import annotations

import argparse
import json
import math
from typing import Any
from unittest import mock

import torch

from benchmarks.gemv_h200 import MIN_STREAM_BYTES, _timed_graph
from engines.pytorch import cuda_int4, int4, kernels
from engines.pytorch.gemv_forms import (
    GELU_PAIR,
    GELU_TIMES,
    NO_EPILOGUE,
    PLAIN,
    RESIDUAL,
    RESIDUAL_AFTER,
    RMS_NORM_AFTER,
)

# (name, prologue, epilogue, scalar, N outputs, K, count a step) for random:gemma-4-e2b
# under the decode program's epilogue forms (`programs`, `gemv_epilogues`).
FORMS = (
    ("qkv sliding", RMS_NORM_AFTER, NO_EPILOGUE, False, 2560, 1536, 12),
    ("qkv full", RMS_NORM_AFTER, NO_EPILOGUE, False, 5120, 1536, 3),
    ("q sliding", RMS_NORM_AFTER, NO_EPILOGUE, False, 2048, 1536, 16),
    ("q full", RMS_NORM_AFTER, NO_EPILOGUE, False, 4096, 1536, 4),
    ("o sliding", PLAIN, RESIDUAL_AFTER, False, 1536, 2048, 28),
    ("o full", PLAIN, RESIDUAL_AFTER, False, 1536, 4096, 7),
    ("gate_up", RMS_NORM_AFTER, GELU_PAIR, False, 6144, 1536, 15),
    ("gate_up double", RMS_NORM_AFTER, GELU_PAIR, False, 12288, 1536, 20),
    ("down", PLAIN, NO_EPILOGUE, False, 1536, 6144, 15),
    ("down double", PLAIN, NO_EPILOGUE, False, 1536, 12288, 20),
    ("ple gate", RESIDUAL, GELU_TIMES, False, 256, 1536, 35),
    ("ple proj", PLAIN, RESIDUAL_AFTER, True, 1536, 256, 35),
    ("ple model proj", PLAIN, NO_EPILOGUE, False, 8960, 1536, 1),
    ("lm head", RMS_NORM_AFTER, NO_EPILOGUE, False, 262_144, 1536, 1),
)


Outputs = tuple[torch.Tensor | None, torch.Tensor | None]


def _bf16(*shape: int, gen: torch.Generator | None = None, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", generator=gen, dtype=torch.bfloat16) * scale


def form_operands(
    n: int, k: int, scalar: bool, gen: torch.Generator | None = None
) -> dict[str, Any]:
    """What the forms of N outputs of K inputs read besides the input and the weight,
    drawn at random (`run_form`'s names)."""
    return {
        "nw": _bf16(k, gen=gen, scale=0.5) + 1.0,
        "branch": _bf16(1, k, gen=gen),
        "rw_in": _bf16(k, gen=gen),
        "rw_out": _bf16(n, gen=gen),
        "m": _bf16(1, n, gen=gen),
        "res": _bf16(1, n, gen=gen, scale=4.0),
        "scalar": torch.full((1,), 0.7, device="cuda", dtype=torch.bfloat16) if scalar else None,
    }


def run_form(
    prologue: int, epilogue: int, x: torch.Tensor, weight: kernels.Weight, o: dict[str, Any],
    fused: bool,
) -> Outputs:  # fmt: skip
    """The form through the `kernels` entry point the decode program makes it with, at one
    row, over `form_operands`: (its product, its new residual row), either None where the
    form makes none."""
    if prologue == RESIDUAL:
        return kernels.residual_linear(
            x, o["branch"], o["rw_in"], None, None, 1e-6, weight, fused, gate_times=o["m"]
        )
    if epilogue == RESIDUAL_AFTER:
        return None, kernels.linear_residual(
            x, weight, o["res"], o["rw_out"], o["scalar"], 1e-6, fused
        )
    if epilogue == GELU_PAIR:
        return kernels.gated_norm_linear(x, o["nw"], 1e-6, weight, fused, post_scale=True), None
    if prologue == RMS_NORM_AFTER:
        return kernels.norm_linear(x, o["nw"], 1e-6, weight, fused, post_scale=True), None
    return kernels.linear(x, weight, fused), None


def form_times(prologue: int, epilogue: int, scalar: bool, n: int, k: int) -> dict[str, Any]:
    tiles = 2 if epilogue == GELU_PAIR else 1
    packed, scale = int4.quantize(_bf16(n * tiles, k, scale=k**-0.5), cuda_int4.GROUP)
    nbytes = packed.numel() * 4 + scale.numel() * 2
    copies = max(1, math.ceil(MIN_STREAM_BYTES / nbytes))
    weights = [(packed.clone(), scale.clone()) for _ in range(copies)]
    x, operands = _bf16(1, k), form_operands(n, k, scalar)

    def launch(w: kernels.Weight) -> None:
        run_form(prologue, epilogue, x, w, operands, True)

    def chain() -> None:
        for w in weights:
            launch(w)

    out: dict[str, Any] = {"copies": copies, "mbytes": nbytes / 1e6, "splits": {}}
    with mock.patch.object(cuda_int4, "product_for", lambda *a, **kw: None):
        out["triton_us"] = _timed_graph(chain) / copies * 1e6
    out["shipped_split"] = cuda_int4.form_split(prologue, epilogue, n, k)
    served = cuda_int4.product_for
    for split in cuda_int4.splits(k, tiles):
        products: list[cuda_int4.Product | None] = []

        def recorded(
            *a: Any, products: list[cuda_int4.Product | None] = products, **kw: Any
        ) -> cuda_int4.Product | None:
            products.append(served(*a, **kw))
            return products[-1]

        with (
            mock.patch.object(cuda_int4, "form_split", lambda *a, split=split, **kw: split),
            mock.patch.object(cuda_int4, "product_for", recorded),
        ):
            launch(weights[0])
            if None in products:  # the form does not take this split: gemv_int4 ran
                continue
            try:
                out["splits"][split] = _timed_graph(chain) / copies * 1e6
            except Exception as exc:  # recorded: a split that does not build or run
                out["splits"][split] = f"{type(exc).__name__}: {exc}"
    timed = {s: us for s, us in out["splits"].items() if isinstance(us, float)}
    if timed:
        out["best_split"] = min(timed, key=timed.__getitem__)
        out["best_us"] = timed[out["best_split"]]
    # As the engine runs it: the CUDA build at its split where it serves the form, else
    # gemv_int4.
    served_split = out["shipped_split"]
    out["shipped_us"] = (
        out["triton_us"] if served_split is None else timed.get(served_split, math.nan)
    )
    weights.clear()
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.int4_cuda_forms_h200", description=__doc__
    )
    p.add_argument("--out")
    p.add_argument("--forms", help="comma-separated names (default: all)")
    args = p.parse_args(argv)
    wanted = set(args.forms.split(",")) if args.forms else None
    rows = []
    for name, prologue, epilogue, scalar, n, k, count in FORMS:
        if wanted and name not in wanted:
            continue
        r = form_times(prologue, epilogue, scalar, n, k)
        r.update(name=name, prologue=prologue, epilogue=epilogue, n=n, k=k, count=count)
        rows.append(r)
        splits = ", ".join(
            f"{s}: {us:.2f}" if isinstance(us, float) else f"{s}: {us}"
            for s, us in r["splits"].items()
        )
        print(f"{name} {n}x{k} ({prologue},{epilogue}): triton {r['triton_us']:.2f} us; "
              f"cuda by split {{{splits}}}", flush=True)  # fmt: skip
    lines = [
        f"{torch.cuda.get_device_name()}; one row, us a product (chained, weights past L2)",
        "| form | N x K | count | gemv_int4 | as served (CUDA split) | CUDA, best split "
        "| best / gemv_int4 |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['name']} ({r['prologue']},{r['epilogue']}) | {r['n']}x{r['k']} | {r['count']} "
            f"| {r['triton_us']:.2f} | {r.get('shipped_us', math.nan):.2f} "
            f"({r['shipped_split']}) | {r.get('best_us', math.nan):.2f} "
            f"({r.get('best_split')}) | {r.get('best_us', math.nan) / r['triton_us']:.2f} |"
        )
    step = {
        key: sum(r.get(key, math.nan) * r["count"] for r in rows) / 1e3
        for key in ("triton_us", "shipped_us", "best_us")
    }
    either = sum(min(r["triton_us"], r.get("best_us", math.inf)) * r["count"] for r in rows)
    lines.append(
        f"step's products, ms: gemv_int4 {step['triton_us']:.3f}, as served "
        f"{step['shipped_us']:.3f}, CUDA best splits {step['best_us']:.3f}, the faster of "
        f"each form {either / 1e3:.3f}"
    )
    print("\n".join(lines))
    if args.out:
        result = {"gpu": torch.cuda.get_device_name(), "forms": rows, "step_ms": step,
                  "table": "\n".join(lines)}  # fmt: skip
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
