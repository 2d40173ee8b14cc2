"""The Triton source of the engine's batch-1 split-KV decode attention (`attention_partial`,
or `attention_partial_normed` from the q/k/v projection's raw row, then
`attention_combine`), driven by `attention_kernel`, whose docstring says what they compute
and why. Imported only when a CUDA batch-1 call needs them; under `TRITON_INTERPRET=1` they
run on the CPU (`tests/engines/pytorch/test_triton_interpreter.py`).
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl


@triton.jit
def _block_keys(
    hidden_ptr, k_ptr, v_ptr, h, block, kv_len, stride_kh, stride_kl, stride_vh, stride_vl,
    D: tl.constexpr, DV: tl.constexpr, BLOCK_L: tl.constexpr,
):  # fmt: skip
    # One block of keys: their positions, which of them the row sees, and K and V (rows
    # the row does not see are zeros: they are never fetched).
    keys = block * BLOCK_L + tl.arange(0, BLOCK_L)
    key_ok = keys < kv_len
    # Keys the mask hides (past the row's length in its KV bucket, or outside a sliding
    # window) are never fetched: the step pays for the keys it reads, not for the bucket.
    hidden = tl.load(hidden_ptr + keys, mask=key_ok, other=1) != 0
    live = key_ok & ~hidden
    dims = tl.arange(0, D)
    dims_v = tl.arange(0, DV)
    k = tl.load(
        k_ptr + h * stride_kh + keys[:, None] * stride_kl + dims[None, :],
        mask=live[:, None],
        other=0.0,
    )
    # V is loaded with K, before the scores need it: the two memory round trips overlap.
    v = tl.load(
        v_ptr + h * stride_vh + keys[:, None] * stride_vl + dims_v[None, :],
        mask=live[:, None],
        other=0.0,
    )
    return keys, live, k, v


@triton.jit
def _block_partial(
    q, k, v, live, h, block, blocks, acc_ptr, max_ptr, sum_ptr, scale, GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr, DV: tl.constexpr, SCALED: tl.constexpr,
):  # fmt: skip
    # The block's unnormalised output, maximum and sum for each query head of the group.
    heads = tl.arange(0, BLOCK_G)
    head_ok = heads < GROUP
    dims_v = tl.arange(0, DV)
    scores = tl.dot(q, tl.trans(k)).to(q.dtype).to(tl.float32)
    if SCALED:
        scores = (scores * scale).to(q.dtype).to(tl.float32)
    scores = tl.where(live[None, :], scores, float("-inf"))
    top = tl.max(scores, axis=1)
    safe_top = tl.where(top == float("-inf"), 0.0, top)
    p = tl.exp(scores - safe_top[:, None])
    total = tl.sum(p, axis=1)
    acc = tl.dot(p.to(v.dtype), v)
    row = (h * blocks + block) * BLOCK_G + heads
    # Rows of real heads only (BLOCK_G pads the group to 16 for tl.dot). A block with no
    # visible key writes zeros (p is 0 there), so the combine reads every block's output
    # in the same round trip as its maximum and sum instead of after them.
    tl.store(acc_ptr + row[:, None] * DV + dims_v[None, :], acc, mask=head_ok[:, None])
    tl.store(max_ptr + row, top)
    tl.store(sum_ptr + row, total)


@triton.jit
def attention_partial(
    q_ptr,
    k_ptr,
    v_ptr,
    hidden_ptr,
    acc_ptr,
    max_ptr,
    sum_ptr,
    kv_len,
    stride_kh,
    stride_kl,
    stride_vh,
    stride_vl,
    scale,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    D: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_L: tl.constexpr,
    SCALED: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:  # q and the cache's new row come from the kernels just before
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    h = tl.program_id(0)
    block = tl.program_id(1)
    heads = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, D)
    q = tl.load(
        q_ptr + (h * GROUP + heads)[:, None] * D + dims[None, :],
        mask=(heads < GROUP)[:, None],
        other=0.0,
    )
    _keys, live, k, v = _block_keys(
        hidden_ptr, k_ptr, v_ptr, h, block, kv_len, stride_kh, stride_kl, stride_vh,
        stride_vl, D, DV, BLOCK_L,
    )  # fmt: skip
    _block_partial(
        q, k, v, live, h, block, tl.num_programs(1), acc_ptr, max_ptr, sum_ptr, scale, GROUP,
        BLOCK_G, DV, SCALED,
    )  # fmt: skip


@triton.jit
def _row_weights(w_ptr, D: tl.constexpr):
    # A row vector over D dimensions (a norm weight, a rotary row) and its values at the
    # partner dimensions rotary pairs them with (d +- D/2), in float32.
    dims = tl.arange(0, D)
    partner = (dims + D // 2) % D
    return tl.load(w_ptr + dims).to(tl.float32), tl.load(w_ptr + partner).to(tl.float32)


@triton.jit
def _normed(x_ptr, rows, row_ok, w, wp, eps, D: tl.constexpr, WEIGHTED: tl.constexpr):
    # RMSNorm of rows (R, D) of x_ptr, times w where WEIGHTED (w, wp: `_row_weights`), in
    # float32 and rounded to x's dtype (as torch.rms_norm of a 16-bit tensor); also the
    # values at the partner dimensions, normed alike.
    dims = tl.arange(0, D)
    partner = (dims + D // 2) % D
    x = tl.load(x_ptr + rows[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0.0)
    xp = tl.load(x_ptr + rows[:, None] * D + partner[None, :], mask=row_ok[:, None], other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    y = x * rstd[:, None]
    yp = xp.to(tl.float32) * rstd[:, None]
    if WEIGHTED:
        y = y * w[None, :]
        yp = yp * wp[None, :]
    dtype = x_ptr.dtype.element_ty
    return y.to(dtype).to(tl.float32), yp.to(dtype).to(tl.float32)


@triton.jit
def _rotated(y, yp, cos, sin, dtype: tl.constexpr, D: tl.constexpr):
    # transformers' rotary: y * cos + rotate_half(y) * sin, where rotate_half(y)[d] is
    # -y[d + D/2] below D/2 and y[d - D/2] above (y, yp from `_normed`); rounded once.
    sign = tl.where(tl.arange(0, D) < D // 2, -1.0, 1.0)
    return (y * cos[None, :] + sign[None, :] * yp * sin[None, :]).to(dtype)


@triton.jit
def attention_partial_normed(
    qkv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, hidden_ptr, acc_ptr,
    max_ptr, sum_ptr, kv_len, stride_kh, stride_kl, stride_vh, stride_vl, scale, eps,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, BLOCK_L: tl.constexpr, SCALED: tl.constexpr, WRITES_KV: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    # KV head h's block of keys `block`: `attention_partial` from the q/k/v projection's
    # raw row: the query heads' RMSNorm and rotary, and where the layer writes KV, the new
    # key's and value's (the value's norm has no weight), written to the pools at the
    # row's position and attended from registers (every other row of the block comes from
    # the pools).
    h = tl.program_id(0)
    block = tl.program_id(1)
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    # Before the wait, everything but the q/k/v row (`dependent_launch` says why each is
    # safe to read then): the norm weights, the rotary rows, the row's position, the mask
    # and the block's keys and values. Every row of the pools but the new one was written
    # by an earlier step or by prefill, so the block streams while the projection before
    # still runs; the new row is this step's.
    wq, wqp = _row_weights(nq_ptr, D)
    wk, wkp = _row_weights(nk_ptr, D)
    cos = tl.load(cos_ptr + tl.arange(0, D)).to(tl.float32)
    sin = tl.load(sin_ptr + tl.arange(0, D)).to(tl.float32)
    pos = tl.load(pos_ptr)
    keys, live, k, v = _block_keys(
        hidden_ptr, k_ptr, v_ptr, h, block, kv_len, stride_kh, stride_kl, stride_vh,
        stride_vl, D, D, BLOCK_L,
    )  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
    heads = tl.arange(0, BLOCK_G)
    head_ok = heads < GROUP
    y, yp = _normed(qkv_ptr, h * GROUP + heads, head_ok, wq, wqp, eps, D, True)
    q = _rotated(y, yp, cos, sin, cos_ptr.dtype.element_ty, D)
    new = (keys == pos)[:, None]
    mine = (pos >= block * BLOCK_L) & (pos < block * BLOCK_L + BLOCK_L)
    dims = tl.arange(0, D)[None, :]
    if WRITES_KV:
        one = tl.full((1,), 0, tl.int32)
        y, yp = _normed(qkv_ptr, HEADS + h + one, one == 0, wk, wkp, eps, D, True)
        k_new = _rotated(y, yp, cos, sin, cos_ptr.dtype.element_ty, D)  # (1, D)
        y, _ = _normed(qkv_ptr, HEADS + KV_HEADS + h + one, one == 0, wk, wkp, eps, D, False)
        v_new = y.to(k_new.dtype)
        tl.store(k_ptr + h * stride_kh + pos * stride_kl + dims, k_new, mask=mine)
        tl.store(v_ptr + h * stride_vh + pos * stride_vl + dims, v_new, mask=mine)
    else:
        # The new row, written by an earlier layer of this step: read past L1, which may
        # hold the line from the read before the wait.
        k_new = tl.load(
            k_ptr + h * stride_kh + pos * stride_kl + dims, mask=mine, other=0.0,
            cache_modifier=".cg",
        )  # fmt: skip
        v_new = tl.load(
            v_ptr + h * stride_vh + pos * stride_vl + dims, mask=mine, other=0.0,
            cache_modifier=".cg",
        )  # fmt: skip
    k = tl.where(new, k_new, k)
    v = tl.where(new, v_new, v)
    _block_partial(
        q, k, v, live, h, block, tl.num_programs(1), acc_ptr, max_ptr, sum_ptr, scale, GROUP,
        BLOCK_G, D, SCALED,
    )  # fmt: skip


@triton.jit
def attention_combine(
    acc_ptr,
    max_ptr,
    sum_ptr,
    out_ptr,
    blocks,
    GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr,
    DV: tl.constexpr,
    BLOCK_S: tl.constexpr,
    PDL: tl.constexpr,
):
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    # Output row `pid`: one (KV head, query head of its group).
    pid = tl.program_id(0)
    h = pid // GROUP
    g = pid % GROUP
    dims = tl.arange(0, DV)
    # One pass, BLOCK_S blocks at a time, rescaling what is summed so far when the maximum
    # grows (as flash-decoding does); up to BLOCK_S blocks, every load is in flight at once.
    top = tl.full((), float("-inf"), tl.float32)
    total = tl.full((), 0.0, tl.float32)
    out = tl.zeros((DV,), dtype=tl.float32)
    for s0 in range(0, blocks, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        s_ok = s < blocks
        row = (h * blocks + s) * BLOCK_G + g
        m = tl.load(max_ptr + row, mask=s_ok, other=float("-inf"))
        block_sum = tl.load(sum_ptr + row, mask=s_ok, other=0.0)
        # A block with no visible key wrote zeros (its weight is 0).
        acc = tl.load(acc_ptr + row[:, None] * DV + dims[None, :], mask=s_ok[:, None], other=0.0)
        new_top = tl.maximum(top, tl.max(m, axis=0))
        safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - safe_top))
        carry = tl.where(top == float("-inf"), 0.0, tl.exp(top - safe_top))
        total = total * carry + tl.sum(weight * block_sum, axis=0)
        out = out * carry + tl.sum(weight[:, None] * acc, axis=0)
        top = new_top
    out = out / total
    tl.store(out_ptr + pid * DV + dims, out.to(out_ptr.dtype.element_ty))
