"""The batch-1 Triton kernels' arithmetic on the CPU, through Triton's interpreter
(`TRITON_INTERPRET=1`): each prologue and epilogue of the matrix-vector kernel, and the
split-KV attention, against their torch forms. The H200 tests (`test_kernels`,
`test_attention_kernel`) check the compiled kernels; these keep the arithmetic checked in
CI, where there is no GPU.

The interpreter runs in a child process (it must be switched on before Triton is
imported, and must not leak into the other tests): this file is that child's script.
Skipped where Triton is not installed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import pytest

from tests.engines.pytorch import interpreter_child

pytest.importorskip("triton")


@pytest.mark.parametrize("part", ["dense", "int4", "program"])
def test_kernels_compute_their_torch_forms_in_the_interpreter(part: str) -> None:
    errors: dict[str, Any] = interpreter_child.run(__file__, part, timeout_s=600)
    failed = {name: e for name, e in errors.items() if not e["ok"]}
    assert not failed, failed


def _gemv_checks(
    gemv: Any, inputs: tuple[Any, ...], record: Any, out: dict[str, dict[str, Any]], tag: str
) -> None:
    """Every prologue and epilogue of `kernels`, against the same torch forms the CPU and
    larger batches run (`fused=False`); `w` dense or int4 (packed, scale)."""
    import torch
    import torch.nn.functional as F

    from engines.pytorch import kernels

    x, b, nw, w, m = inputs
    wf = kernels.dense(w, torch.float32)
    k = wf.shape[1]
    xf, bf, nwf = x.float(), b.float(), nw.float()
    normed = torch.rms_norm(xf, (k,), nwf, 1e-6)
    record(f"plain{tag}", gemv(kernels.PLAIN), xf @ wf.T, kernels.linear(x, w, False))
    torch_norm = kernels.norm_linear(x, nw, 1e-6, w, False)
    record(f"norm{tag}", gemv(kernels.RMS_NORM, norm_weight=nw), normed @ wf.T, torch_norm)
    got = gemv(kernels.RMS_NORM_AFTER, norm_weight=nw)
    record(f"norm scaled after{tag}", got, normed @ wf.T, torch_norm)
    gated = F.gelu(xf, approximate="tanh") * bf @ wf.T
    torch_gated = kernels.gelu_mul_linear(x, b, w, False)
    record(f"gelu gate{tag}", gemv(kernels.GELU_MUL, other=b), gated, torch_gated)
    gate, up = (normed @ wf.T).chunk(2, dim=-1)
    pair = F.gelu(gate, approximate="tanh") * up
    torch_pair = kernels.gated_norm_linear(x, nw, 1e-6, w, False)
    for prologue, label in ((kernels.RMS_NORM, "norm"), (kernels.RMS_NORM_AFTER, "scaled")):
        got = gemv(prologue, kernels.GELU_PAIR, norm_weight=nw)
        out[f"gate/up pair ({label}) shape{tag}"] = {"ok": got.shape == torch_pair.shape}
        record(f"gate/up pair ({label}){tag}", got, pair, torch_pair)
    scalar = torch.full((1,), 0.7).to(x.dtype)
    for norm, scale, times in ((None, None, None), (nw, None, None), (None, scalar, m)):
        label = f"residual{' norm' if norm is not None else ''}{' scalar' if scale else ''}"
        y, x_new = kernels._residual_gemv_op(x, b, nw, scale, norm, *kernels._parts(w), 1e-6, times)
        ref, ref_x = kernels.residual_linear(x, b, nw, scale, norm, 1e-6, w, False, times)
        # Bit-equal on a GPU (`test_kernels`); the interpreter truncates where the GPU
        # rounds to nearest, at each of the row's two roundings: two ulps of the terms.
        terms = x.float().abs() + (ref_x.float() - x.float()).abs()
        row_ok = bool(((x_new.float() - ref_x.float()).abs() <= 2**-6 * terms + 1e-6).all())
        out[f"{label} row{tag}"] = {"ok": row_ok}
        normed_row = ref_x.float()
        if norm is not None:
            normed_row = torch.rms_norm(normed_row, (k,), nwf, 1e-6)
        exact = normed_row @ wf.T
        if times is not None:
            exact = F.gelu(exact, approximate="tanh") * times.float()
            label += " gelu times"
        record(label + tag, y, exact, ref)
    # The residual step after the product (epilogue 3): a residual row and norm as wide
    # as the output; launched twice, since its last program must reset the counter.
    residual, rw = (m * 4).to(x.dtype), m.flatten().flip(0)
    product = xf @ wf.T
    for scale in (None, scalar):
        label = f"residual after{' scalar' if scale is not None else ''}"
        exact = residual.float() + torch.rms_norm(product, (product.shape[-1],), rw.float(), 1e-6)
        if scale is not None:
            exact = exact * scale.float()
        ref = kernels.linear_residual(x, w, residual, rw, scale, 1e-6, False)
        # The step on the kernel's own product (one configuration: the same sums; times
        # the identity, exactly), in torch's form, to the ulps the interpreter's
        # truncation allows at each rounding (as above).
        own_product = gemv(kernels.PLAIN)
        identity = torch.eye(own_product.shape[-1], dtype=x.dtype)
        own = kernels.linear_residual(own_product, identity, residual, rw, scale, 1e-6, False)
        bound = 2**-6 * (residual.float().abs() + own.float().abs()) + 1e-6
        for launch in ("", " again"):
            got = kernels._gemv_residual_after_op(
                x, *kernels._parts(w), residual, rw, scale, 1e-6
            )  # fmt: skip
            record(label + launch + tag, got, exact, ref)
            row_ok = bool(((got.float() - own.float()).abs() <= bound).all())
            out[f"{label} row{launch}{tag}"] = {"ok": row_ok}


def _program_checks(out: dict[str, dict[str, Any]]) -> None:
    """The decode program of tiny-gemma4 with its batch-1 products through the kernels
    (each prologue and epilogue the program uses), and its attention through either
    attention kernel, in float32 so that nothing rounds apart, against the same program
    in torch forms, step by step on the same tokens: how the program wires the kernels,
    to summation order (bf16 on a GPU: `test_kernels`, `test_attention_kernel`)."""
    import torch

    from engines.pytorch import attention_kernel, int4_tuning, kernels, triton_int4, triton_kernels
    from engines.pytorch.model import load_model

    # On the CPU the program keeps the torch forms; here it takes the kernels, one
    # configuration each (the autotuner needs a GPU to time its candidates), and the
    # batch-1 attention kernels in both forms (the normed one writes the new KV rows that
    # the next steps read).
    kernels._use_kernel = lambda fused, x, weight: fused and x.shape[0] == 1  # type: ignore[assignment]
    attention_kernel.use_kernel = lambda q, k_pool: q.shape[0] == 1  # type: ignore[assignment]
    triton_kernels.gemv.configs = [triton_kernels.GEMV_CONFIGS[4]]
    triton_int4.gemv_int4.configs = [int4_tuning.GEMV_INT4_CONFIGS[1]]
    prompt = [257, *range(40, 70)]  # past tiny-gemma4's 16-token sliding window

    def decode(
        through_kernels: bool, quantize: str, form: str = "matmul", compile_mode: str | None = None
    ) -> list[torch.Tensor]:
        model = load_model("random:tiny-gemma4", device="cpu", dtype="float32", quantize=quantize)
        runner = _tiny_runner(model, through_kernels, form, compile_mode)
        runner.prefill(0, prompt)
        return [
            runner.decode([0], [token], [len(prompt) + k]).clone()
            for k, token in enumerate(range(70, 74))
        ]

    # Compiled by Inductor (C++ on the CPU), the normed kernel's op writes the pools in
    # place: were they copied instead, the next steps would read stale rows.
    for quantize, form, mode in (("none", "matmul", None), ("w4a16", "matmul", None),
                                 ("none", "kernel", None), ("none", "normed-kernel", None),
                                 ("none", "normed-kernel", "default")):  # fmt: skip
        got_steps, want_steps = decode(True, quantize, form, mode), decode(False, quantize)
        label = f"program {quantize} {form}{' compiled' if mode else ''}"
        _record_steps(out, label, got_steps, want_steps)
    _int4_rows_program_checks(out, prompt)


def _tiny_runner(
    model: Any, through_kernels: bool, form: str = "matmul", compile_mode: str | None = None
) -> Any:
    """tiny-gemma4's decode program in two slots, its products through the kernels or in
    torch forms (`triton_gemv`), compiled or not."""
    import torch

    from engines.pytorch.runner import ModelRunner

    torch._dynamo.reset()
    return ModelRunner(
        model,
        num_slots=2,
        batch_invariant=False,
        batched_decode=True,
        fused_norms=True,
        decode_program=True,
        triton_gemv=through_kernels,
        attention_form=form,
        compile_mode=compile_mode,
    )


def _record_steps(
    out: dict[str, dict[str, Any]], label: str, got_steps: Any, want_steps: Any
) -> None:
    """Each step's logits against the torch forms', to summation order (float32)."""
    import torch

    for step, (got, want) in enumerate(zip(got_steps, want_steps, strict=True)):
        # the vocabulary's unused rows are -inf in both
        shown = torch.isfinite(want)
        error = float((got[shown] - want[shown]).abs().max() / want[shown].abs().max())
        ok = torch.equal(shown, torch.isfinite(got)) and error <= 1e-4
        out[f"{label} step {step}"] = {"error": error, "limit": 1e-4, "ok": ok}


def _int4_rows_program_checks(out: dict[str, dict[str, Any]], prompt: list[int]) -> None:
    """Two requests' rows of the int4 decode program through `matmul_int4`, as CUDA runs
    a few rows (here `kernels._int4_rows` takes the CPU's), with the GELU gates of
    gate/up and of the per-layer gate as its epilogues; eager, and compiled by Inductor,
    where the ops run from the compiled graph and pick their kernel at run time (a
    compiled trace with symbolic rows: `test_cuda_int4_rows`). Against the
    program's torch forms on the dense weights, step by step on the same tokens."""
    import torch

    from engines.pytorch import checkpoint, int4_tuning, kernels, triton_int4
    from engines.pytorch.model import load_model

    dense_rows = kernels._int4_rows
    triton_int4.matmul_int4.configs = [
        int4_tuning.config_from_label("block_m=16,block_n=32,block_k=64,split_k=2,w=4,s=1")
    ]

    def decode(through_kernels: bool, compile_mode: str | None) -> list[torch.Tensor]:
        model = load_model("random:tiny-gemma4", device="cpu", dtype="float32")
        # int4 modules, as on CUDA (the CPU's --quantize keeps dequantized dense weights)
        checkpoint.quantize_model(model.model, int4_modules=True)
        runner = _tiny_runner(model, through_kernels, compile_mode=compile_mode)
        runner.prefill(0, prompt)
        runner.prefill(1, prompt[:20])
        if through_kernels:
            kernels._int4_rows = lambda x: x.numel() // x.shape[-1] <= kernels.INT4_MATMUL_MAX_ROWS  # type: ignore[assignment]
        try:
            return [
                runner.decode([0, 1], [token, token], [len(prompt) + k, 20 + k]).clone()
                for k, token in enumerate(range(70, 74))
            ]
        finally:
            kernels._int4_rows = dense_rows  # type: ignore[assignment]

    want_steps = decode(False, None)
    for mode in (None, "default"):
        label = f"program w4a16 two rows{' compiled' if mode else ''}"
        _record_steps(out, label, decode(True, mode), want_steps)


def _checks(part: str) -> dict[str, dict[str, Any]]:
    import torch

    from engines.pytorch import attention_kernel, kernels
    from engines.pytorch.programs import _attend

    gen = torch.Generator().manual_seed(0)
    out: dict[str, dict[str, Any]] = {}

    def rand(*shape: int, scale: float = 1.0, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
        return (torch.randn(*shape, generator=gen) * scale).to(dtype)

    def error(got: torch.Tensor, exact: torch.Tensor) -> float:
        return float((got.float() - exact).abs().max() / exact.abs().max())

    def record(name: str, got: torch.Tensor, exact: torch.Tensor, torch_form: torch.Tensor) -> None:
        # Held to the float32 result, no further from it than the torch form in the same
        # dtype (which rounds at other places), with a floor of 3%: the interpreter
        # truncates to bfloat16 where the GPU rounds, a couple of ulps on a gated product.
        # A wrong prologue, row or mask is off by far more.
        limit = max(2 * error(torch_form, exact), 3e-2)
        out[name] = {"error": error(got, exact), "limit": limit, "ok": error(got, exact) <= limit}

    k, n = 300, 96  # k not a multiple of any block: the masks are exercised
    x, b, nw = rand(1, k, scale=3.0), rand(1, k), rand(k)
    w = rand(n, k, scale=k**-0.5)
    m = rand(1, n)

    def gemv(prologue: int, epilogue: int = kernels.NO_EPILOGUE, **kw: Any) -> torch.Tensor:
        return kernels._launch(x, w, eps=1e-6, prologue=prologue, epilogue=epilogue, **kw)

    # The autotuner needs a GPU to time its candidates: one configuration at a time, a
    # narrow, a wide and a whole-row one, each through every form below.
    from engines.pytorch import triton_kernels

    if part == "int4":
        _int4_checks(rand, record, out)
        return out
    if part == "program":
        _program_checks(out)
        return out
    tuner = triton_kernels.gemv
    for config in (
        triton_kernels.GEMV_CONFIGS[1],
        triton_kernels.GEMV_CONFIGS[10],
        triton_kernels.GEMV_CONFIGS[12],
    ):
        tuner.configs, tuner.cache = [config], {}
        tag = f" [{config.kwargs['BLOCK_N']}x{config.kwargs['BLOCK_K']}]"
        _gemv_checks(gemv, (x, b, nw, w, m), record, out, tag)
    # Epilogue 3 on a row longer than one chunk (`triton_kernels.RESIDUAL_CHUNK`): the
    # last program's passes over it in chunks, not its one read of a shorter row.
    wide = triton_kernels.RESIDUAL_CHUNK.value + 52
    w_wide, residual, rw = rand(wide, k, scale=k**-0.5), rand(1, wide, scale=4.0), rand(wide)
    product = x.float() @ w_wide.float().T
    exact = residual.float() + torch.rms_norm(product, (wide,), rw.float(), 1e-6)
    ref = kernels.linear_residual(x, w_wide, residual, rw, None, 1e-6, False)
    for launch in ("", " again"):  # the last program resets the counter
        got = kernels._gemv_residual_after_op(x, w_wide, None, residual, rw, None, 1e-6)
        record(f"residual after, {wide} wide{launch}", got, exact, ref)

    # Attention in float16: the interpreter's bfloat16 tl.dot is not faithful.
    # 4,200 keys 512 wide: 66 blocks of 64, three passes of the combine (32 blocks each).
    # A KV bucket longer than the row (1,024 for 300 or 700 keys) hides whole blocks at
    # its end; keys the mask hides hold NaN, which the kernel must never read.
    cases = (
        (64, 1, 1, 48),
        (64, 130, 130, 48),
        (128, 700, 700, None),
        (256, 1024, 300, None),
        (256, 1024, 700, 512),
        (512, 4200, 4200, 3000),
    )
    for head_dim, kv_len, length, window in cases:
        half = torch.float16
        q = rand(1, 1, 8, head_dim, dtype=half)
        k_pool = rand(2, 1, kv_len + 9, head_dim, dtype=half)
        v_pool = rand(2, 1, kv_len + 9, head_dim, dtype=half)
        hidden = _hidden(kv_len, length, window)
        _fill_hidden(k_pool, hidden, 0.0)
        _fill_hidden(v_pool, hidden, 0.0)
        keys, values = k_pool[:1, :, :kv_len], v_pool[:1, :, :kv_len]
        exact = _attend(q.float(), keys.float(), values.float(), hidden, 1.0, False)
        products = _attend(q, keys, values, hidden, 1.0, False)
        k_nan, v_nan = k_pool.clone(), v_pool.clone()
        _fill_hidden(k_nan, hidden, float("nan"))
        _fill_hidden(v_nan, hidden, float("nan"))
        got = attention_kernel._decode_attention_op(q, k_nan, v_nan, hidden, 1.0)
        record(f"attention d{head_dim} L{length}/{kv_len}", got, exact, products)
    _normed_attention_checks(rand, error, record, out)
    return out


def _hidden(kv_len: int, length: int, window: int | None) -> Any:
    """(1, 1, 1, kv_len) True where the row at position length - 1 may not look."""
    import torch

    keys = torch.arange(kv_len)[None, :]
    hidden = keys > length - 1
    if window:
        hidden = hidden | (keys <= length - 1 - window)
    return hidden[:, None, None, :]


def _fill_hidden(pool: Any, hidden: Any, value: float) -> None:
    """Slot 0's keys the mask hides, set to `value` (NaN: a kernel that reads one shows it)."""
    kv_len = hidden.shape[-1]
    pool[:1, :, :kv_len][hidden.expand(1, 1, 1, kv_len)[0]] = value


def _normed_attention_checks(rand: Any, error: Any, record: Any, out: dict[str, Any]) -> None:
    """`decode_attention_normed` from a raw q/k/v row against the program's torch form
    (norms, rotary, KV write, products) in float16 and float32: its output, and the new
    key and value rows it writes. The new row's slot in the pools holds NaN before (the
    kernel must attend to the row it made, not to the pools'), as do the keys the mask
    hides; layers that read an earlier layer's KV write nothing."""
    import torch

    from engines.pytorch import attention_kernel
    from engines.pytorch.programs import _normed_attention

    half, heads = torch.float16, 8
    for head_dim, kv_len, length, window, writes in (
        (64, 130, 90, 48, True),
        (64, 300, 200, None, True),
        (256, 64, 64, None, False),
    ):
        row = (heads + (2 if writes else 0)) * head_dim
        qkv, n_q, n_k = rand(1, row, scale=2.0, dtype=half), rand(head_dim), rand(head_dim)
        angles = rand(1, head_dim // 2, scale=3.0, dtype=torch.float32)  # seeded
        cos = torch.cat([angles.cos()] * 2, dim=-1)
        sin = torch.cat([angles.sin()] * 2, dim=-1)
        positions = torch.tensor([length - 1])
        k_pool = rand(2, 1, kv_len + 9, head_dim, dtype=half)
        v_pool = rand(2, 1, kv_len + 9, head_dim, dtype=half)
        hidden = _hidden(kv_len, length, window)
        forms = {}  # the torch form in float32 (exact) and in float16 (products)
        for dtype in (torch.float32, half):
            pools = (k_pool.to(dtype).clone(), v_pool.to(dtype).clone())  # written to
            attn = _normed_attention(
                qkv.to(dtype), n_q.to(dtype), n_k.to(dtype), *pools, cos.to(dtype),
                sin.to(dtype), hidden, torch.tensor([0]), positions, heads, head_dim, writes,
                1.0, 1e-6, "matmul",
            )  # fmt: skip
            forms[dtype] = (attn, *pools)
        exact = forms[torch.float32][0]
        products, k_want, v_want = forms[half]
        k_got, v_got = k_pool.clone(), v_pool.clone()
        for pool in (k_got, v_got):
            _fill_hidden(pool, hidden, float("nan"))
            if writes:
                pool[0, :, length - 1] = float("nan")
        got = attention_kernel.decode_attention_normed(
            qkv, n_q, n_k, cos.to(half), sin.to(half), positions, k_got, v_got, hidden, heads,
            writes, 1.0, 1e-6,
        )  # fmt: skip
        tag = f"normed attention d{head_dim} L{length}/{kv_len}" + (" writes" if writes else "")
        record(tag, got, exact, products)
        if writes:  # the new rows, to a rounding of the rotary's (torch rounds it thrice)
            new = (k_got[0, :, length - 1], v_got[0, :, length - 1])
            want = (k_want[0, :, length - 1], v_want[0, :, length - 1])
            row_error = max(error(g, w.float()) for g, w in zip(new, want, strict=True))
            out[f"{tag} new rows"] = {"error": row_error, "limit": 2e-3, "ok": row_error <= 2e-3}


def _int4_checks(rand: Any, record: Any, out: dict[str, dict[str, Any]]) -> None:
    """The int4 kernels against dequantize-then-matmul: groups of 32 and 128 over 512
    inputs (every block shape's chunks cross or split groups; 96 rows: partial row
    blocks), each configuration the autotuner may choose (three, one of them with a scale
    per group of words, through every prologue and epilogue of the dense kernel, the rest
    through the plain product and the gate/up pair); and the few-rows kernel in float16
    (the interpreter's bfloat16 tl.dot is not faithful) at each of its configurations for
    3 and 64 rows, plain and with each GELU epilogue, and (at the first) with each GELU
    gate after the plain product (`gelu_gate_int4`)."""
    import torch
    import triton

    from engines.pytorch import int4, int4_tuning, kernels, triton_int4

    n, k = 96, 512
    x, b, nw, m = rand(1, k, scale=3.0), rand(1, k), rand(k), rand(1, n)
    weights = {g: int4.quantize(rand(n, k, scale=k**-0.5), g) for g in (32, 128)}
    # Every configuration once, the two group sizes in turn (the interpreter is slow).
    tuner = triton_int4.gemv_int4
    for i, config in enumerate(int4_tuning.GEMV_INT4_CONFIGS):
        group = (32, 128)[i % 2]
        w = weights[group]

        def gemv(
            prologue: int, epilogue: int = kernels.NO_EPILOGUE, w: Any = w, **kw: Any
        ) -> torch.Tensor:
            return kernels._launch(x, w, eps=1e-6, prologue=prologue, epilogue=epilogue, **kw)

        tuner.configs, tuner.cache = [config], {}
        tag = " [int4 g{} {BLOCK_N}x{BLOCK_K} group scales {GROUP_SCALES}]".format(
            group, **config.kwargs
        )
        # Every form at three block shapes, one of them with a scale per group (the
        # interpreter is slow).
        if i < 3:
            _gemv_checks(gemv, (x, b, nw, w, m), record, out, tag)
            continue
        # Elsewhere the plain product and the gate/up pair with the norm scaled after it.
        wf = kernels.dense(w, torch.float32)
        exact = x.float() @ wf.T
        record(f"plain{tag}", gemv(kernels.PLAIN), exact, kernels.linear(x, w, False))
        normed = torch.rms_norm(x.float(), (k,), nw.float(), 1e-6)
        gate, up = (normed @ wf.T).chunk(2, dim=-1)
        pair = torch.nn.functional.gelu(gate, approximate="tanh") * up
        got = gemv(kernels.RMS_NORM_AFTER, kernels.GELU_PAIR, norm_weight=nw)
        record(f"gate/up pair{tag}", got, pair, kernels.gated_norm_linear(x, nw, 1e-6, w, False))
    tuner = triton_int4.matmul_int4
    # and a narrow split 64-row tile with the rows on the tensor cores' long side, which
    # the sweep may pick
    rows_first = triton.Config(
        {"BLOCK_M": 64, "BLOCK_N": 32, "BLOCK_K": 128, "SPLIT_K": 2, "ROWS_FIRST": True},
        num_warps=4,
        num_stages=1,
    )
    # and scales read two to a 32-bit word (`SCALE_WORDS`) where a chunk spans two groups
    # of 128 and four of 32
    scale_words = [
        int4_tuning.config_from_label(
            f"block_m=16,block_n=32,block_k={tile},scale_words=1,w=4,s={stages}"
        )
        for tile, stages in (("256,split_k=1", 3), ("128,split_k=2,prefetch=1", 1))
    ]
    # and a split that does not divide the chunks (8 of 64 inputs: 3, 3 and 2), as the
    # sweep's wave-filling splits may be
    uneven = int4_tuning.config_from_label("block_m=16,block_n=32,block_k=64,split_k=3,w=4,s=1")
    configs = [(c, (32, 128)[i % 2]) for i, c in enumerate(int4_tuning.MATMUL_INT4_CONFIGS)]
    configs += [(rows_first, 32), (scale_words[0], 128), (scale_words[1], 32), (uneven, 32)]
    for index, (config, group) in enumerate(configs):
        w16 = (weights[group][0], weights[group][1].to(torch.float16))
        # Values made in pairs are inline PTX, which the interpreter cannot run: the
        # float32 way here, the pairs against it bit for bit on the GPU (test_int4_cuda).
        config = triton.Config(
            {**config.kwargs, "PAIRS": False},
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
        tuner.configs, tuner.cache = [config], {}
        for rows in (3, 64):
            xr = rand(rows, k, dtype=torch.float16)
            got = kernels._launch_matmul_int4(xr, *w16)
            exact = xr.float() @ kernels.dense(w16, torch.float32).T
            torch_form = xr @ kernels.dense(w16, torch.float16).T
            shape = "{BLOCK_M}x{BLOCK_N}x{BLOCK_K} split {SPLIT_K}".format(**config.kwargs)
            shape += " scale words" if config.kwargs.get("SCALE_WORDS") else ""
            record(f"int4 g{group} {rows} rows [{shape}]", got, exact, torch_form)
            # The GELU epilogues: the 96 weight rows as 48 gate rows then 48 up rows
            # (half tiles of 16 to 64 pairs: whole and partial); gelu_tanh(.) times a
            # strided slice (as the per-layer inputs are).
            dense16 = kernels.dense(w16, torch.float16)
            gate, up = exact.chunk(2, dim=-1)
            times = rand(rows, 2, n, dtype=torch.float16)[:, 1]
            gelu = torch.nn.functional.gelu
            forms = {
                "gate/up pair": (
                    kernels._launch_matmul_int4(xr, *w16, kernels.GELU_PAIR),
                    gelu(gate, approximate="tanh") * up,
                    kernels._gated_matmul(xr, dense16, kernels.GELU_PAIR),
                ),
                "gelu times": (
                    kernels._launch_matmul_int4(xr, *w16, kernels.GELU_TIMES, times),
                    gelu(exact, approximate="tanh") * times.float(),
                    kernels._gated_matmul(xr, dense16, kernels.GELU_TIMES, times),
                ),
            }
            if index == 0:
                # The same gates after the plain product (`gelu_gate_int4`: where the CUDA
                # few-row product takes the rows), at the first configuration.
                forms["gate/up pair after"] = (
                    kernels._launch_gelu_gate_int4(got, kernels.GELU_PAIR, None),
                    *forms["gate/up pair"][1:],
                )
                forms["gelu times after"] = (
                    kernels._launch_gelu_gate_int4(got, kernels.GELU_TIMES, times),
                    *forms["gelu times"][1:],
                )
            for form, (got, want, torch_got) in forms.items():
                out[f"int4 {form} shape {rows} rows [{shape}]"] = {
                    "ok": got.shape == torch_got.shape
                }
                record(f"int4 {form} g{group} {rows} rows [{shape}]", got, want, torch_got)
    # The dense weight a prefill multiplies: exactly the CPU's, both groups (in float16:
    # the interpreter truncates to bfloat16; test_int4_cuda checks both on the GPU).
    for group, (packed, scale) in weights.items():
        for dtype in (torch.float16,):
            got = kernels._launch_dequantize_int4(packed, scale.to(dtype), dtype, pairs=False)
            want = int4.dequantize(packed, scale.to(dtype), dtype)
            worst = float((got.float() - want.float()).abs().max())
            ok = torch.equal(got, want)
            out[f"dequantize g{group} {dtype}"] = {"error": worst, "limit": 0.0, "ok": ok}


if __name__ == "__main__":
    from engines.pytorch import triton_interpreter

    triton_interpreter.fix()
    print(json.dumps(_checks(sys.argv[1])))


def test_tuned_configs_lists_the_autotuners_choices() -> None:
    from engines.pytorch import kernels, triton_kernels

    tuner = triton_kernels.gemv
    saved = dict(tuner.cache)
    try:
        tuner.cache[(2560, 1536, 5, False, 0)] = triton_kernels.GEMV_CONFIGS[12]
        chosen = kernels.tuned_configs()
    finally:
        tuner.cache.clear()
        tuner.cache.update(saved)
    assert "BLOCK_N: 4, BLOCK_K: 2048" in chosen["2560,1536,5,False,0"]


def test_tuned_configs_lists_the_int4_kernels_choices() -> None:
    from engines.pytorch import int4_tuning, kernels, triton_int4

    tuner = triton_int4.matmul_int4
    saved = dict(tuner.cache)
    try:
        split4 = next(c for c in int4_tuning.MATMUL_INT4_CONFIGS if c.kwargs["SPLIT_K"] == 4)
        tuner.cache[(64, 1536, 12288, 32)] = split4
        chosen = kernels.tuned_configs()
    finally:
        tuner.cache.clear()
        tuner.cache.update(saved)
    assert "SPLIT_K: 4" in chosen["matmul_int4:64,1536,12288,32"]


def test_splits_are_offered_only_where_row_blocks_leave_sms_idle() -> None:
    from engines.pytorch import int4_tuning

    def splits(**args: int) -> set[int]:
        kept = int4_tuning.prune_splits(int4_tuning.MATMUL_INT4_CONFIGS, args | {"M": 8})
        return {c.kwargs["SPLIT_K"] for c in kept}

    # Down (1,536 outputs of 12,288 inputs): 24 tiles of 64 outputs; the LM head: thousands.
    assert splits(N=1536, K=12288) == {1, 4, 8}
    assert splits(N=262144, K=1536) == {1}
    # A split must leave every program two chunks at least (the lists' smallest split
    # chunks: 4 of 128 inputs, 8 of 64).
    assert splits(N=1536, K=1024) == {1, 4, 8}
    assert splits(N=1536, K=768) == {1}


def test_scales_are_read_as_words_only_where_rows_start_on_one() -> None:
    import triton

    from engines.pytorch import int4_tuning

    words = triton.Config({"BLOCK_K": 128, "SPLIT_K": 1, "SCALE_WORDS": True}, 4, 3)
    one_by_one = triton.Config({"BLOCK_K": 128, "SPLIT_K": 1}, 4, 3)

    def flags(k: int, group: int) -> list[bool]:
        kept = int4_tuning.prune_scale_words([words, one_by_one], k, group)
        return [bool(c.kwargs.get("SCALE_WORDS")) for c in kept]

    assert flags(1536, 32) == [True, False]  # 48 groups a row
    assert flags(1536, 128) == [True, False]  # 12
    assert flags(96 * 32, 32 * 32) == [False, False]  # 3: the word tile loads one by one
