"""The Triton source of the engine's batch-1 split-KV decode attention (`attention_partial`,
`attention_combine`), driven by `attention_kernel`, whose docstring says what they compute
and why. Imported only when a CUDA batch-1 call needs them; under `TRITON_INTERPRET=1` they
run on the CPU (`tests/engines/pytorch/test_triton_interpreter.py`).
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl


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
    blocks = tl.num_programs(1)
    heads = tl.arange(0, BLOCK_G)
    head_ok = heads < GROUP
    keys = block * BLOCK_L + tl.arange(0, BLOCK_L)
    key_ok = keys < kv_len
    dims = tl.arange(0, D)
    dims_v = tl.arange(0, DV)
    q = tl.load(
        q_ptr + (h * GROUP + heads)[:, None] * D + dims[None, :],
        mask=head_ok[:, None],
        other=0.0,
    )
    # Keys the mask hides (past the row's length in its KV bucket, or outside a sliding
    # window) are never fetched: the step pays for the keys it reads, not for the bucket.
    hidden = tl.load(hidden_ptr + keys, mask=key_ok, other=1) != 0
    live = key_ok & ~hidden
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
    pid = tl.program_id(0)  # one (KV head, query head of its group)
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
