"""The Triton source of the engine's batch-1 CUDA matrix-vector product with its prologues
and epilogues, as module-level `triton.jit` functions (`gemv`, driven by `kernels`; the
decode attention's are in `triton_attention`). What each computes, and why, is in
`kernels`' docstring.

Only `kernels` and `triton_int4` import this one, and only when a CUDA call needs a
kernel, so a CPU run never imports Triton. Under `TRITON_INTERPRET=1` the same functions run on the
CPU through Triton's interpreter, which is how the tests check their arithmetic without a
GPU (`tests/engines/pytorch/test_triton_interpreter.py`).

The PROLOGUE and EPILOGUE codes are `gemv_forms`' (plain integers here: Triton reads
constexprs); epilogue 3 is `_residual_after`.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl

# Compiled kernels may carry inline PTX; Triton's interpreter (the CPU tests) runs none.
COMPILED = tl.constexpr(not triton.knobs.runtime.interpret)

GEMV_CONFIGS = [
    triton.Config({"BLOCK_N": bn, "BLOCK_K": bk}, num_warps=w, num_stages=s)
    for bn, bk, w, s in (
        (1, 1024, 4, 3),
        (2, 512, 4, 3),
        (2, 1024, 4, 3),
        (4, 512, 4, 3),
        (8, 256, 4, 3),
        (8, 512, 4, 3),
        (16, 256, 4, 3),
        (16, 128, 4, 4),
        (32, 128, 4, 4),
        (32, 256, 8, 3),
        (64, 128, 8, 3),
        # A whole short row per chunk: every load of a program in flight at once,
        # for the small projections whose time is mostly one memory round trip.
        (2, 2048, 4, 2),
        (4, 2048, 8, 2),
        (2, 4096, 8, 2),
    )
]


@triton.jit
def _round(v, like_ptr):
    return v.to(like_ptr.dtype.element_ty).to(tl.float32)


@triton.jit
def _residual_of(x, b, rw, scalar, branch_rstd, like_ptr, SCALE: tl.constexpr):
    # x + RMSNorm(b) * rw [* scalar], rounded where the unfused ops round.
    xn = _round(x + _round(b * branch_rstd * rw, like_ptr), like_ptr)
    if SCALE:
        xn = _round(xn * scalar, like_ptr)
    return xn


@triton.jit
def _residual(x_ptr, b_ptr, rw_ptr, scalar, cols, col_ok, branch_rstd, SCALE: tl.constexpr):
    x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    rw = tl.load(rw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    return _residual_of(x, b, rw, scalar, branch_rstd, x_ptr, SCALE)


# Epilogue 3 reads a finished output row of up to this many values at once, longer ones
# in chunks of it.
RESIDUAL_CHUNK = tl.constexpr(2048)


@triton.jit
def _residual_after(
    y_ptr, r_ptr, rw_ptr, scalar, xo_ptr, count_ptr, N, eps, programs, SCALE: tl.constexpr
):  # fmt: skip
    # Epilogue 3: the residual step r + RMSNorm(y) * rw [* scalar] of the product y it
    # ends, written to xo, instead of a kernel of its own after the product. It needs the
    # whole row y, so the last of the product's `programs` to finish writes it: each
    # program counts itself (atomically, after all its threads stored their rows, as
    # `triton_int4.matmul_int4`'s split-K does), and the one that counts last reads y back
    # past L1 (other SMs wrote it) and resets the counter for the next launch; True in
    # that one. The step waits on that last program's memory round trips, so a row that
    # fits one chunk is read once: its residual and norm weight load before the count (no
    # program of this launch writes them), y after it, and its mean square comes from
    # the same registers.
    tl.debug_barrier()
    if N <= RESIDUAL_CHUNK:
        cols = tl.arange(0, RESIDUAL_CHUNK)
        ok = cols < N
        r = tl.load(r_ptr + cols, mask=ok, other=0.0)
        rw = tl.load(rw_ptr + cols, mask=ok, other=0.0)
        last = tl.atomic_add(count_ptr, 1, sem="acq_rel") == programs - 1
        if last:
            y = tl.load(y_ptr + cols, mask=ok, other=0.0, cache_modifier=".cg").to(tl.float32)
            rstd = 1.0 / tl.sqrt(tl.sum(y * y, axis=0) / N + eps)
            xn = _residual_of(r.to(tl.float32), y, rw.to(tl.float32), scalar, rstd, r_ptr, SCALE)
            tl.store(xo_ptr + cols, xn.to(xo_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(count_ptr, 0)
    else:
        last = tl.atomic_add(count_ptr, 1, sem="acq_rel") == programs - 1
        if last:
            rstd = _mean_square_rstd(y_ptr, N, eps, RESIDUAL_CHUNK, ".cg")
            for n0 in range(0, N, RESIDUAL_CHUNK):
                cols = n0 + tl.arange(0, RESIDUAL_CHUNK)
                ok = cols < N
                y = tl.load(y_ptr + cols, mask=ok, other=0.0, cache_modifier=".cg")
                y = y.to(tl.float32)
                r = tl.load(r_ptr + cols, mask=ok, other=0.0).to(tl.float32)
                rw = tl.load(rw_ptr + cols, mask=ok, other=0.0).to(tl.float32)
                xn = _residual_of(r, y, rw, scalar, rstd, r_ptr, SCALE)
                tl.store(xo_ptr + cols, xn.to(xo_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(count_ptr, 0)
    return last


@triton.jit
def _wait_at_least(count_ptr, need):
    # Until another program of the launch has counted `need` (an acquiring load a poll,
    # a short sleep between polls: the waiting programs leave the counter's L2 slice and
    # their SM's issue slots to the programs that work).
    seen = tl.atomic_add(count_ptr, 0, sem="acquire")
    while seen < need:
        if COMPILED:
            seen = tl.inline_asm_elementwise(
                "nanosleep.u32 64; mov.b32 $0, $1;", "=r,r", [seen], dtype=tl.int32,
                is_pure=False, pack=1,
            )  # fmt: skip
        seen = tl.atomic_add(count_ptr, 0, sem="acquire")


@triton.jit
def _gelu_tanh(x):
    inner = 0.7978845608028654 * (x + 0.044715 * x * x * x)
    return 0.5 * x * (2.0 - 2.0 / (tl.exp(2.0 * inner) + 1.0))


@triton.jit
def _gelu_gated(gate, m, ptr):
    # gelu_tanh(gate) * m, rounded to ptr's dtype where the unfused ops round (F.gelu's
    # output, then the multiply's); the caller rounds gate and m where they were tensors.
    return _round(_round(_gelu_tanh(gate), ptr) * m, ptr)


@triton.jit
def _input(
    x_ptr,
    b_ptr,
    nw_ptr,
    rw_ptr,
    scalar,
    cols,
    col_ok,
    rstd,
    branch_rstd,
    squares,
    xo_ptr,
    writes_residual,
    PROLOGUE: tl.constexpr,
    SCALE: tl.constexpr,
):
    # One chunk of the product's input row, and the running squares of prologue 5.
    # Prologue 3's new residual row is written here, chunk by chunk as the product reads
    # it, by the one program told to (`_prologue` says why).
    if PROLOGUE == 5:
        # Times the norm weight now, the reciprocal RMS (of these same chunks) at the end.
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        squares += x * x
        x = x * tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        return x, squares
    if PROLOGUE == 3 or PROLOGUE == 4:
        x = _residual(x_ptr, b_ptr, rw_ptr, scalar, cols, col_ok, branch_rstd, SCALE)
        if PROLOGUE == 3 and writes_residual:
            tl.store(xo_ptr + cols, x.to(xo_ptr.dtype.element_ty), mask=col_ok)
    else:
        x = tl.load(x_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
    if PROLOGUE == 1 or PROLOGUE == 4:
        nw = tl.load(nw_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = _round(x * rstd * nw, x_ptr)
    elif PROLOGUE == 2:
        b = tl.load(b_ptr + cols, mask=col_ok, other=0.0).to(tl.float32)
        x = _gelu_gated(x, b, x_ptr)
    return x, squares


@triton.jit
def _mean_square_rstd(x_ptr, K, eps, BLOCK_K: tl.constexpr, CACHE: tl.constexpr):
    # CACHE ".cg" reads past L1, for a row other SMs wrote; given at every call, because a
    # constexpr string default did not compile (Triton 3.6).
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(x_ptr + cols, mask=cols < K, other=0.0, cache_modifier=CACHE)
        x = x.to(tl.float32)
        squares += x * x
    return 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)


@triton.jit
def _prologue(
    x_ptr, b_ptr, rw_ptr, s_ptr, xo_ptr, K, eps, writes_residual, PROLOGUE: tl.constexpr,
    SCALE: tl.constexpr, BLOCK_K: tl.constexpr,
):  # fmt: skip
    # What a product's input needs before its first chunk, shared by `gemv` and
    # `triton_int4.gemv_int4`: the row's reciprocal RMS (prologues 1, 4), the branch's
    # (3, 4) and the scalar. Every program rebuilds the new residual row from L2 (a few
    # KB); the one told to (`writes_residual`) also writes it out for the rest of the layer.
    # Prologue 4 normalises that row before the product, so it takes a pass here; 3 does
    # not, and builds it chunk by chunk in `_input` (a pass here, in every program, cost
    # the per-layer gate 7.7 us a launch: records, `2026-12-02-h200-int4-batch1-profile`).
    rstd = 1.0
    branch_rstd = 1.0
    scalar = 1.0
    if SCALE:
        scalar = tl.load(s_ptr).to(tl.float32)
    if PROLOGUE == 1:
        rstd = _mean_square_rstd(x_ptr, K, eps, BLOCK_K, "")
    if PROLOGUE == 3 or PROLOGUE == 4:
        branch_rstd = _mean_square_rstd(b_ptr, K, eps, BLOCK_K, "")
    if PROLOGUE == 4:
        squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
        for k0 in range(0, K, BLOCK_K):
            res_cols = k0 + tl.arange(0, BLOCK_K)
            res_ok = res_cols < K
            xn = _residual(x_ptr, b_ptr, rw_ptr, scalar, res_cols, res_ok, branch_rstd, SCALE)
            squares += xn * xn
            if writes_residual:
                tl.store(xo_ptr + res_cols, xn.to(xo_ptr.dtype.element_ty), mask=res_ok)
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
    return rstd, branch_rstd, scalar


@triton.jit
def _weights(w_ptr, rows, row_ok, cols, col_ok, N, K, EPILOGUE: tl.constexpr):
    # One chunk of the program's weight rows (and of the matching up rows of a gate/up pair).
    mask = row_ok[:, None] & col_ok[None, :]
    w = tl.load(
        w_ptr + rows[:, None] * K + cols[None, :],
        mask=mask,
        other=0.0,
        eviction_policy="evict_first",
    )
    w_up = w
    if EPILOGUE == 1:
        w_up = tl.load(
            w_ptr + (rows + N)[:, None] * K + cols[None, :],
            mask=mask,
            other=0.0,
            eviction_policy="evict_first",
        )
    return w, w_up


# cache_results: the timings go to Triton's disk cache, so every later process on the
# machine (the server after the step benchmark, a restarted server) runs the same block
# shapes instead of re-timing them, which made their figures differ by chance. PDL is
# not in the key: with or without dependent launch a shape runs the same blocks, so the
# two differ in launch alone (and sum in the same order: the same logits).
@triton.autotune(
    configs=GEMV_CONFIGS, key=["N", "K", "PROLOGUE", "SCALE", "EPILOGUE"], cache_results=True
)
@triton.jit
def gemv(
    x_ptr,
    b_ptr,
    nw_ptr,
    rw_ptr,
    s_ptr,
    xo_ptr,
    m_ptr,
    count_ptr,
    w_ptr,
    y_ptr,
    N,
    K,
    eps,
    PROLOGUE: tl.constexpr,
    SCALE: tl.constexpr,
    EPILOGUE: tl.constexpr,
    PDL: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    # N counts outputs; with GELU_PAIR the weight has 2N rows, gate rows then up rows.
    # Epilogue 3 takes the residual row as b, its norm weight as rw (`_residual_after`).
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    # The first chunk of weights depends on no earlier kernel. Launched as a dependent
    # (PDL), the program fetches it while the kernel before finishes, and only then waits
    # for that kernel's results; nothing is read from or written to activations before.
    cols = tl.arange(0, BLOCK_K)
    col_ok = cols < K
    w, w_up = _weights(w_ptr, rows, row_ok, cols, col_ok, N, K, EPILOGUE)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    rstd, branch_rstd, scalar = _prologue(
        x_ptr, b_ptr, rw_ptr, s_ptr, xo_ptr, K, eps, pid == 0, PROLOGUE, SCALE, BLOCK_K
    )
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    x, squares = _input(
        x_ptr, b_ptr, nw_ptr, rw_ptr, scalar, cols, col_ok, rstd, branch_rstd, squares,
        xo_ptr, pid == 0, PROLOGUE, SCALE,
    )  # fmt: skip
    acc = w.to(tl.float32) * x[None, :]
    acc_up = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    if EPILOGUE == 1:
        acc_up = w_up.to(tl.float32) * x[None, :]
    for k0 in range(BLOCK_K, K, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)
        col_ok = cols < K
        x, squares = _input(
            x_ptr, b_ptr, nw_ptr, rw_ptr, scalar, cols, col_ok, rstd, branch_rstd, squares,
            xo_ptr, pid == 0, PROLOGUE, SCALE,
        )  # fmt: skip
        w, w_up = _weights(w_ptr, rows, row_ok, cols, col_ok, N, K, EPILOGUE)
        acc += w.to(tl.float32) * x[None, :]
        if EPILOGUE == 1:
            acc_up += w_up.to(tl.float32) * x[None, :]
    y = tl.sum(acc, axis=1)
    up = tl.sum(acc_up, axis=1)
    if PROLOGUE == 5:
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
        y = y * rstd
        up = up * rstd
    if EPILOGUE == 1:
        y = _gelu_gated(_round(y, y_ptr), _round(up, y_ptr), y_ptr)
    elif EPILOGUE == 2:
        m = tl.load(m_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        y = _gelu_gated(_round(y, y_ptr), m, y_ptr)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)
    if EPILOGUE == 3:
        _residual_after(
            y_ptr, b_ptr, rw_ptr, scalar, xo_ptr, count_ptr, N, eps, tl.num_programs(0), SCALE
        )
