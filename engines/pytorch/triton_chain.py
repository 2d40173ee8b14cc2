"""The Triton source of `product_chain`: a Gemma 4 layer at batch 1 with int4 weights as
one launch whose programs wait on counters instead of on the launch before. Each stage's
programs are those of the kernel it stands for (`triton_int4.gemv_int4_tile`,
`triton_attention.attention_partial_normed_tile`, `attention_combine_tile`).

`layer_tail_int4` holds the five products after attention: 0 o, with the residual step
after it (epilogue 3); 1 gate/up, the norm scaled after the product, the GELU gate
(prologue 5, epilogue 1); 2 down; 3 the per-layer gate, the residual step before it, GELU
times the per-layer input (prologue 3, epilogue 2); 4 the per-layer projection, the
residual step and the layer scalar after it (epilogue 3). `layer_int4` puts before them
the q/k/v projection (the input norm scaled after it), the split-KV attention from its
raw row (q/k norms, rotary, the new key and value written) and the combine: the whole
layer.

Each program draws a ticket (an atomic counter: tickets follow the order in which
programs start), which names its stage and tile; it loads what depends on no other
program (its first chunk of weights, a block of older keys), waits on the launch before
(dependent launch), then until the stage before has counted itself done (`done`: every
tile of it, or the one program that took the residual step of an epilogue 3), and counts
itself done in turn. A ticket drawn later never blocks one drawn earlier, so a launch
cannot deadlock however the GPU schedules its programs. The program that takes the last
residual step resets the counters for the next launch.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl

from engines.pytorch.triton_attention import attention_combine_tile, attention_partial_normed_tile
from engines.pytorch.triton_int4 import gemv_int4_tile
from engines.pytorch.triton_kernels import _wait_at_least

# The counters (int32): the two residual steps', the ticket, then each stage's `done`.
RESIDUAL_COUNTS, TICKET, DONE = tl.constexpr(0), tl.constexpr(2), tl.constexpr(3)
COUNTERS = tl.constexpr(16)


@triton.jit
def _count_done(done_ptr):
    # After every thread's stores: the stage's readers acquire what this program wrote.
    tl.debug_barrier()
    tl.atomic_add(done_ptr, 1, sem="release")


@triton.jit
def _tail(
    ticket, attn_ptr, x_ptr, ple_ptr, scalar_ptr,
    wo_ptr, so_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr, wpg_ptr, spg_ptr, wpp_ptr, spp_ptr,
    n_post_attn_ptr, n_pre_ff_ptr, n_post_ff_ptr, n_post_ple_ptr,
    o_ptr, x_attn_ptr, act_ptr, d_ptr, x_ff_ptr, ple_act_ptr, p_ptr, out_ptr, counts_ptr,
    done, HIDDEN, ATTN, FF, PLE, eps, t0, t1, t2, t3, t4, wait_ptr, wait_for,
    STAGES: tl.constexpr, GROUP: tl.constexpr, PDL: tl.constexpr, O_WAITS: tl.constexpr,
    O_TILE: tl.constexpr, GU_TILE: tl.constexpr, D_TILE: tl.constexpr, PG_TILE: tl.constexpr,
    PP_TILE: tl.constexpr,
):  # fmt: skip
    # Ticket `ticket` of the five products after attention (numbered from 0 here; `done`
    # their five counters); each stage's tile is (BLOCK_N, BLOCK_K, GROUP_SCALES,
    # PREFETCH). O_WAITS: o waits until `wait_ptr` counts `wait_for` (the combine, in
    # `layer_int4`). The last program resets the launch's STAGES counters.
    e0 = t0
    e1 = e0 + t1
    e2 = e1 + t2
    e3 = e2 + t3
    if ticket < e0:
        last = gemv_int4_tile(
            ticket, t0, attn_ptr, x_ptr, x_ptr, n_post_attn_ptr, x_ptr, x_attn_ptr, x_ptr,
            counts_ptr + RESIDUAL_COUNTS, wo_ptr, so_ptr, o_ptr, HIDDEN, ATTN, eps, wait_ptr,
            wait_for, 0, False, 3, PDL, GROUP, O_TILE[0], O_TILE[1], O_TILE[2], O_TILE[3],
            O_WAITS,
        )  # fmt: skip
        if last:
            _count_done(done)
    elif ticket < e1:
        gemv_int4_tile(
            ticket - e0, t1, x_attn_ptr, x_ptr, n_pre_ff_ptr, x_ptr, x_ptr, x_ptr, x_ptr,
            counts_ptr, wgu_ptr, sgu_ptr, act_ptr, FF, HIDDEN, eps, done, 1, 5, False, 1,
            PDL, GROUP, GU_TILE[0], GU_TILE[1], GU_TILE[2], GU_TILE[3], True,
        )  # fmt: skip
        _count_done(done + 1)
    elif ticket < e2:
        gemv_int4_tile(
            ticket - e1, t2, act_ptr, x_ptr, x_ptr, x_ptr, x_ptr, x_ptr, x_ptr, counts_ptr,
            wd_ptr, sd_ptr, d_ptr, HIDDEN, FF, eps, done + 1, t1, 0, False, 0, PDL, GROUP,
            D_TILE[0], D_TILE[1], D_TILE[2], D_TILE[3], True,
        )  # fmt: skip
        _count_done(done + 2)
    elif ticket < e3:
        gemv_int4_tile(
            ticket - e2, t3, x_attn_ptr, d_ptr, x_ptr, n_post_ff_ptr, x_ptr, x_ff_ptr,
            ple_ptr, counts_ptr, wpg_ptr, spg_ptr, ple_act_ptr, PLE, HIDDEN, eps, done + 2,
            t2, 3, False, 2, PDL, GROUP, PG_TILE[0], PG_TILE[1], PG_TILE[2], PG_TILE[3],
            True,
        )  # fmt: skip
        _count_done(done + 3)
    else:
        last = gemv_int4_tile(
            ticket - e3, t4, ple_act_ptr, x_ff_ptr, x_ptr, n_post_ple_ptr, scalar_ptr,
            out_ptr, x_ptr, counts_ptr + RESIDUAL_COUNTS + 1, wpp_ptr, spp_ptr, p_ptr,
            HIDDEN, PLE, eps, done + 3, t3, 0, True, 3, PDL, GROUP, PP_TILE[0], PP_TILE[1],
            PP_TILE[2], PP_TILE[3], True,
        )  # fmt: skip
        if last:
            # Every ticket is drawn and every wait passed: ready for the next launch.
            stages = tl.arange(0, COUNTERS)
            first = counts_ptr + DONE
            tl.store(first + stages, tl.zeros((COUNTERS,), tl.int32), mask=stages < STAGES)
            tl.atomic_xchg(counts_ptr + TICKET, 0)


@triton.jit
def layer_tail_int4(
    attn_ptr, x_ptr, ple_ptr, scalar_ptr,
    wo_ptr, so_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr, wpg_ptr, spg_ptr, wpp_ptr, spp_ptr,
    n_post_attn_ptr, n_pre_ff_ptr, n_post_ff_ptr, n_post_ple_ptr,
    o_ptr, x_attn_ptr, act_ptr, d_ptr, x_ff_ptr, ple_act_ptr, p_ptr, out_ptr, counts_ptr,
    HIDDEN, ATTN, FF, PLE, eps, t0, t1, t2, t3, t4,
    GROUP: tl.constexpr, PDL: tl.constexpr,
    O_TILE: tl.constexpr, GU_TILE: tl.constexpr, D_TILE: tl.constexpr, PG_TILE: tl.constexpr,
    PP_TILE: tl.constexpr,
):  # fmt: skip
    # x: the layer's residual row; attn: the attention output (ATTN wide); ple: the
    # layer's per-layer input (PLE wide); scalar: the layer scalar. Rows the launch
    # writes: o and p (products before their residual steps), x_attn (after attention),
    # act (gate/up's GELU gate, FF wide), d (down), x_ff (after the feed-forward),
    # ple_act (the per-layer gate), out (the layer's output). t0..t4: each stage's tiles.
    ticket = tl.atomic_add(counts_ptr + TICKET, 1)
    _tail(
        ticket, attn_ptr, x_ptr, ple_ptr, scalar_ptr, wo_ptr, so_ptr, wgu_ptr, sgu_ptr,
        wd_ptr, sd_ptr, wpg_ptr, spg_ptr, wpp_ptr, spp_ptr, n_post_attn_ptr, n_pre_ff_ptr,
        n_post_ff_ptr, n_post_ple_ptr, o_ptr, x_attn_ptr, act_ptr, d_ptr, x_ff_ptr,
        ple_act_ptr, p_ptr, out_ptr, counts_ptr, counts_ptr + DONE, HIDDEN, ATTN, FF, PLE,
        eps, t0, t1, t2, t3, t4, counts_ptr, 0, 5, GROUP, PDL, False, O_TILE, GU_TILE, D_TILE,
        PG_TILE, PP_TILE,
    )  # fmt: skip


# The KV length and its blocks change with the KV bucket: not specialized (Triton compiles
# a variant for 1 and for multiples of 16), so one compiled launch serves every bucket.
@triton.jit(do_not_specialize=["kv_len", "blocks"])
def layer_int4(
    x_ptr, ple_ptr, scalar_ptr, wqkv_ptr, sqkv_ptr, n_in_ptr, nq_ptr, nk_ptr, cos_ptr,
    sin_ptr, pos_ptr, k_ptr, v_ptr, hidden_ptr,
    wo_ptr, so_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr, wpg_ptr, spg_ptr, wpp_ptr, spp_ptr,
    n_post_attn_ptr, n_pre_ff_ptr, n_post_ff_ptr, n_post_ple_ptr,
    qkv_ptr, part_ptr, top_ptr, total_ptr, attn_ptr,
    o_ptr, x_attn_ptr, act_ptr, d_ptr, x_ff_ptr, ple_act_ptr, p_ptr, out_ptr, counts_ptr,
    QKV, kv_len, blocks, stride_kh, stride_kl, stride_vh, stride_vl, scale,
    HIDDEN, ATTN, FF, PLE, eps, tq, t0, t1, t2, t3, t4,
    HEADS: tl.constexpr, KV_HEADS: tl.constexpr, GROUP_HEADS: tl.constexpr,
    BLOCK_G: tl.constexpr, D: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_S: tl.constexpr,
    SCALED: tl.constexpr, WRITES_KV: tl.constexpr,
    GROUP: tl.constexpr, PDL: tl.constexpr,
    Q_TILE: tl.constexpr, O_TILE: tl.constexpr, GU_TILE: tl.constexpr, D_TILE: tl.constexpr,
    PG_TILE: tl.constexpr, PP_TILE: tl.constexpr,
):  # fmt: skip
    # The whole layer: `layer_tail_int4`'s stages after q/k/v (QKV outputs: the input norm
    # scaled after the product, tq tiles), the attention's KV_HEADS x `blocks` partial
    # tiles (into part, top, total) and its combine (KV_HEADS x GROUP_HEADS rows of
    # attn), as `attention_kernel.decode_attention_normed` runs them. Counters: q/k/v,
    # the partial, the combine, then the tail's five.
    done = counts_ptr + DONE
    ticket = tl.atomic_add(counts_ptr + TICKET, 1)
    tiles = KV_HEADS * blocks
    if ticket < tq:
        gemv_int4_tile(
            ticket, tq, x_ptr, x_ptr, n_in_ptr, x_ptr, x_ptr, x_ptr, x_ptr, counts_ptr,
            wqkv_ptr, sqkv_ptr, qkv_ptr, QKV, HIDDEN, eps, done, 0, 5, False, 0, PDL, GROUP,
            Q_TILE[0], Q_TILE[1], Q_TILE[2], Q_TILE[3], False,
        )  # fmt: skip
        _count_done(done)
    elif ticket < tq + tiles:
        tile = ticket - tq
        attention_partial_normed_tile(
            tile // blocks, tile % blocks, blocks, qkv_ptr, nq_ptr, nk_ptr, cos_ptr, sin_ptr,
            pos_ptr, k_ptr, v_ptr, hidden_ptr, part_ptr, top_ptr, total_ptr, kv_len,
            stride_kh, stride_kl, stride_vh, stride_vl, scale, eps, done, tq, HEADS,
            KV_HEADS, GROUP_HEADS, BLOCK_G, D, BLOCK_L, SCALED, WRITES_KV, PDL, True,
        )  # fmt: skip
        _count_done(done + 1)
    elif ticket < tq + tiles + KV_HEADS * GROUP_HEADS:
        if PDL:
            tl.extra.cuda.gdc_launch_dependents()
            tl.extra.cuda.gdc_wait()
        _wait_at_least(done + 1, tiles)
        attention_combine_tile(
            ticket - tq - tiles, part_ptr, top_ptr, total_ptr, attn_ptr, blocks, GROUP_HEADS,
            BLOCK_G, D, BLOCK_S,
        )  # fmt: skip
        _count_done(done + 2)
    else:
        _tail(
            ticket - tq - tiles - KV_HEADS * GROUP_HEADS, attn_ptr, x_ptr, ple_ptr,
            scalar_ptr, wo_ptr, so_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr, wpg_ptr, spg_ptr,
            wpp_ptr, spp_ptr, n_post_attn_ptr, n_pre_ff_ptr, n_post_ff_ptr, n_post_ple_ptr,
            o_ptr, x_attn_ptr, act_ptr, d_ptr, x_ff_ptr, ple_act_ptr, p_ptr, out_ptr,
            counts_ptr, done + 3, HIDDEN, ATTN, FF, PLE, eps, t0, t1, t2, t3, t4, done + 2,
            KV_HEADS * GROUP_HEADS, 8, GROUP, PDL, True, O_TILE, GU_TILE, D_TILE, PG_TILE,
            PP_TILE,
        )  # fmt: skip
