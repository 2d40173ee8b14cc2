"""The Triton source of the engine's batch-1 split-KV decode attention (`attention_partial`,
or `attention_partial_normed` from the q/k/v projection's raw row, then
`attention_combine`), driven by `attention_kernel`, whose docstring says what they compute
and why. Imported only when a CUDA batch-1 call needs them; under `TRITON_INTERPRET=1` they
run on the CPU (`tests/engines/pytorch/test_triton_interpreter.py`).
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl

from engines.pytorch.triton_kernels import _wait_at_least


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
    # Only rows the combine reads: real heads (BLOCK_G pads the group to 16 for tl.dot)
    # of a block with a visible key (the combine skips a block whose maximum is -inf).
    written = head_ok & (top > float("-inf"))
    tl.store(acc_ptr + row[:, None] * DV + dims_v[None, :], acc, mask=written[:, None])
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
def _normed(x_ptr, rows, row_ok, w_ptr, eps, D: tl.constexpr, WEIGHTED: tl.constexpr):
    # RMSNorm of rows (R, D) of x_ptr, times w where WEIGHTED, in float32 and rounded to
    # x's dtype (as torch.rms_norm of a 16-bit tensor); also the values at the partner
    # dimensions rotary pairs them with (d +- D/2), normed alike.
    dims = tl.arange(0, D)
    partner = (dims + D // 2) % D
    x = tl.load(x_ptr + rows[:, None] * D + dims[None, :], mask=row_ok[:, None], other=0.0)
    xp = tl.load(x_ptr + rows[:, None] * D + partner[None, :], mask=row_ok[:, None], other=0.0)
    x = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(x * x, axis=1) / D + eps)
    y = x * rstd[:, None]
    yp = xp.to(tl.float32) * rstd[:, None]
    if WEIGHTED:
        y = y * tl.load(w_ptr + dims).to(tl.float32)[None, :]
        yp = yp * tl.load(w_ptr + partner).to(tl.float32)[None, :]
    dtype = x_ptr.dtype.element_ty
    return y.to(dtype).to(tl.float32), yp.to(dtype).to(tl.float32)


@triton.jit
def _rotated(y, yp, cos_ptr, sin_ptr, D: tl.constexpr):
    # transformers' rotary: y * cos + rotate_half(y) * sin, where rotate_half(y)[d] is
    # -y[d + D/2] below D/2 and y[d - D/2] above (y, yp from `_normed`); rounded once.
    dims = tl.arange(0, D)
    sign = tl.where(dims < D // 2, -1.0, 1.0)
    cos = tl.load(cos_ptr + dims).to(tl.float32)
    sin = tl.load(sin_ptr + dims).to(tl.float32)
    return (y * cos[None, :] + sign[None, :] * yp * sin[None, :]).to(cos_ptr.dtype.element_ty)


@triton.jit
def attention_partial_normed(
    qkv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, hidden_ptr, acc_ptr,
    max_ptr, sum_ptr, kv_len, stride_kh, stride_kl, stride_vh, stride_vl, scale, eps,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
    D: tl.constexpr, BLOCK_L: tl.constexpr, SCALED: tl.constexpr, WRITES_KV: tl.constexpr,
    PDL: tl.constexpr,
):  # fmt: skip
    attention_partial_normed_tile(
        tl.program_id(0), tl.program_id(1), tl.num_programs(1), qkv_ptr, nq_ptr, nk_ptr,
        cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr, hidden_ptr, acc_ptr, max_ptr, sum_ptr, kv_len,
        stride_kh, stride_kl, stride_vh, stride_vl, scale, eps, pos_ptr, 0, HEADS, KV_HEADS,
        GROUP, BLOCK_G, D, BLOCK_L, SCALED, WRITES_KV, PDL, False,
    )  # fmt: skip


@triton.jit
def attention_partial_normed_tile(
    h, block, blocks, qkv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr, pos_ptr, k_ptr, v_ptr,
    hidden_ptr, acc_ptr, max_ptr, sum_ptr, kv_len, stride_kh, stride_kl, stride_vh,
    stride_vl, scale, eps, wait_ptr, wait_for, HEADS: tl.constexpr, KV_HEADS: tl.constexpr,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_L: tl.constexpr,
    SCALED: tl.constexpr, WRITES_KV: tl.constexpr, PDL: tl.constexpr, WAITS: tl.constexpr,
):  # fmt: skip
    # KV head h's block `block` of `blocks`. With WAITS it also waits, after the block's
    # keys where it reads them early, until `wait_ptr` counts `wait_for` (`triton_chain`:
    # the q/k/v projection, in the same launch).
    # `attention_partial` from the q/k/v projection's raw row: the query heads' RMSNorm and
    # rotary, and where the layer writes KV, the new key's and value's (the value's norm
    # has no weight), written to the pools at the row's position and attended from
    # registers (every other row of the block comes from the pools).
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    if WRITES_KV:
        # The layer's own pools: every row but the new one was written by an earlier step
        # or prefill, so the block's keys stream while the projection before still runs.
        keys, live, k, v = _block_keys(
            hidden_ptr, k_ptr, v_ptr, h, block, kv_len, stride_kh, stride_kl, stride_vh,
            stride_vl, D, D, BLOCK_L,
        )  # fmt: skip
    if PDL:
        tl.extra.cuda.gdc_wait()
    if WAITS:
        _wait_at_least(wait_ptr, wait_for)
    if not WRITES_KV:
        # Pools of an earlier layer of this step, its new row written by that layer.
        keys, live, k, v = _block_keys(
            hidden_ptr, k_ptr, v_ptr, h, block, kv_len, stride_kh, stride_kl, stride_vh,
            stride_vl, D, D, BLOCK_L,
        )  # fmt: skip
    heads = tl.arange(0, BLOCK_G)
    head_ok = heads < GROUP
    y, yp = _normed(qkv_ptr, h * GROUP + heads, head_ok, nq_ptr, eps, D, True)
    q = _rotated(y, yp, cos_ptr, sin_ptr, D)
    if WRITES_KV:
        one = tl.full((1,), 0, tl.int32)
        y, yp = _normed(qkv_ptr, HEADS + h + one, one == 0, nk_ptr, eps, D, True)
        k_new = _rotated(y, yp, cos_ptr, sin_ptr, D)  # (1, D)
        y, _ = _normed(qkv_ptr, HEADS + KV_HEADS + h + one, one == 0, nk_ptr, eps, D, False)
        v_new = y.to(k_new.dtype)
        pos = tl.load(pos_ptr)
        new = (keys == pos)[:, None]
        k = tl.where(new, k_new, k)
        v = tl.where(new, v_new, v)
        dims = tl.arange(0, D)[None, :]
        mine = (pos >= block * BLOCK_L) & (pos < block * BLOCK_L + BLOCK_L)
        tl.store(k_ptr + h * stride_kh + pos * stride_kl + dims, k_new, mask=mine)
        tl.store(v_ptr + h * stride_vh + pos * stride_vl + dims, v_new, mask=mine)
    _block_partial(
        q, k, v, live, h, block, blocks, acc_ptr, max_ptr, sum_ptr, scale, GROUP, BLOCK_G, D,
        SCALED,
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
    attention_combine_tile(
        tl.program_id(0), acc_ptr, max_ptr, sum_ptr, out_ptr, blocks, GROUP, BLOCK_G, DV, BLOCK_S
    )


@triton.jit
def attention_combine_tile(
    pid, acc_ptr, max_ptr, sum_ptr, out_ptr, blocks, GROUP: tl.constexpr,
    BLOCK_G: tl.constexpr, DV: tl.constexpr, BLOCK_S: tl.constexpr,
):  # fmt: skip
    # Output row `pid`: one (KV head, query head of its group).
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
        # A block with no visible key wrote no partial output (its weight is 0).
        acc = tl.load(
            acc_ptr + row[:, None] * DV + dims[None, :],
            mask=(s_ok & (m > float("-inf")))[:, None],
            other=0.0,
        )
        new_top = tl.maximum(top, tl.max(m, axis=0))
        safe_top = tl.where(new_top == float("-inf"), 0.0, new_top)
        weight = tl.where(m == float("-inf"), 0.0, tl.exp(m - safe_top))
        carry = tl.where(top == float("-inf"), 0.0, tl.exp(top - safe_top))
        total = total * carry + tl.sum(weight * block_sum, axis=0)
        out = out * carry + tl.sum(weight[:, None] * acc, axis=0)
        top = new_top
    out = out / total
    tl.store(out_ptr + pid * DV + dims, out.to(out_ptr.dtype.element_ty))
