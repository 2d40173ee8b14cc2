"""The Triton source of `product_chain`: a Gemma 4 layer's five int4 products after
attention at batch 1 in one launch (`layer_tail_int4`), each product's programs those of
`triton_int4.gemv_int4` with its prologue and epilogue, waiting on counters instead of on
the launch before.

Stages, in ticket order: 0 o, with the residual step after it (epilogue 3); 1 gate/up,
the norm scaled after the product, the GELU gate (prologue 5, epilogue 1); 2 down; 3 the
per-layer gate, the residual step before it, GELU times the per-layer input (prologue 3,
epilogue 2); 4 the per-layer projection, the residual step and the layer scalar after it
(epilogue 3). Each program draws a ticket (an atomic counter: tickets follow the order in
which programs start), which names its stage and tile; it loads its first chunk of
weights, waits on the launch before (dependent launch), then until the stage before has
counted itself done (`done`: every tile of it, or the one program that took the residual
step of stages 0 and 4), and counts itself done in turn. A ticket drawn later never
blocks one drawn earlier, so the launch cannot deadlock however the GPU schedules its
programs. The program that takes stage 4's residual step resets the counters for the
next launch.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl

from engines.pytorch.triton_int4 import gemv_int4_tile

# The counters (int32): the residual steps' of stages 0 and 4, each stage's `done`, the
# ticket.
RESIDUAL_COUNTS, DONE, TICKET = tl.constexpr(0), tl.constexpr(2), tl.constexpr(7)
COUNTERS, STAGES = tl.constexpr(8), tl.constexpr(5)


@triton.jit
def _count_done(done_ptr):
    # After every thread's stores: the stage's readers acquire what this program wrote.
    tl.debug_barrier()
    tl.atomic_add(done_ptr, 1, sem="release")


@triton.jit
def layer_tail_int4(
    attn_ptr, x_ptr, ple_ptr, scalar_ptr,
    wo_ptr, so_ptr, wgu_ptr, sgu_ptr, wd_ptr, sd_ptr, wpg_ptr, spg_ptr, wpp_ptr, spp_ptr,
    n_post_attn_ptr, n_pre_ff_ptr, n_post_ff_ptr, n_post_ple_ptr,
    o_ptr, x_attn_ptr, act_ptr, d_ptr, x_ff_ptr, ple_act_ptr, p_ptr, out_ptr, counts_ptr,
    HIDDEN, ATTN, FF, PLE, eps, t0, t1, t2, t3, t4,
    GROUP: tl.constexpr, PDL: tl.constexpr,
    O_BN: tl.constexpr, O_BK: tl.constexpr, O_GS: tl.constexpr, O_PF: tl.constexpr,
    GU_BN: tl.constexpr, GU_BK: tl.constexpr, GU_GS: tl.constexpr, GU_PF: tl.constexpr,
    D_BN: tl.constexpr, D_BK: tl.constexpr, D_GS: tl.constexpr, D_PF: tl.constexpr,
    PG_BN: tl.constexpr, PG_BK: tl.constexpr, PG_GS: tl.constexpr, PG_PF: tl.constexpr,
    PP_BN: tl.constexpr, PP_BK: tl.constexpr, PP_GS: tl.constexpr, PP_PF: tl.constexpr,
):  # fmt: skip
    # x: the layer's residual row; attn: the attention output (ATTN wide); ple: the
    # layer's per-layer input (PLE wide); scalar: the layer scalar. Rows the launch
    # writes: o and p (products before their residual steps), x_attn (after attention),
    # act (gate/up's GELU gate, FF wide), d (down), x_ff (after the feed-forward),
    # ple_act (the per-layer gate), out (the layer's output). t0..t4: each stage's tiles.
    done = counts_ptr + DONE
    ticket = tl.atomic_add(counts_ptr + TICKET, 1)
    e0 = t0
    e1 = e0 + t1
    e2 = e1 + t2
    e3 = e2 + t3
    if ticket < e0:
        last = gemv_int4_tile(
            ticket, t0, attn_ptr, x_ptr, x_ptr, n_post_attn_ptr, x_ptr, x_attn_ptr, x_ptr,
            counts_ptr + RESIDUAL_COUNTS, wo_ptr, so_ptr, o_ptr, HIDDEN, ATTN, eps, done, 0,
            0, False, 3, PDL, GROUP, O_BN, O_BK, O_GS, O_PF, False,
        )  # fmt: skip
        if last:
            _count_done(done)
    elif ticket < e1:
        gemv_int4_tile(
            ticket - e0, t1, x_attn_ptr, x_ptr, n_pre_ff_ptr, x_ptr, x_ptr, x_ptr, x_ptr,
            counts_ptr, wgu_ptr, sgu_ptr, act_ptr, FF, HIDDEN, eps, done, 1, 5, False, 1,
            PDL, GROUP, GU_BN, GU_BK, GU_GS, GU_PF, True,
        )  # fmt: skip
        _count_done(done + 1)
    elif ticket < e2:
        gemv_int4_tile(
            ticket - e1, t2, act_ptr, x_ptr, x_ptr, x_ptr, x_ptr, x_ptr, x_ptr, counts_ptr,
            wd_ptr, sd_ptr, d_ptr, HIDDEN, FF, eps, done + 1, t1, 0, False, 0, PDL, GROUP,
            D_BN, D_BK, D_GS, D_PF, True,
        )  # fmt: skip
        _count_done(done + 2)
    elif ticket < e3:
        gemv_int4_tile(
            ticket - e2, t3, x_attn_ptr, d_ptr, x_ptr, n_post_ff_ptr, x_ptr, x_ff_ptr,
            ple_ptr, counts_ptr, wpg_ptr, spg_ptr, ple_act_ptr, PLE, HIDDEN, eps, done + 2,
            t2, 3, False, 2, PDL, GROUP, PG_BN, PG_BK, PG_GS, PG_PF, True,
        )  # fmt: skip
        _count_done(done + 3)
    else:
        last = gemv_int4_tile(
            ticket - e3, t4, ple_act_ptr, x_ff_ptr, x_ptr, n_post_ple_ptr, scalar_ptr,
            out_ptr, x_ptr, counts_ptr + RESIDUAL_COUNTS + 1, wpp_ptr, spp_ptr, p_ptr,
            HIDDEN, PLE, eps, done + 3, t3, 0, True, 3, PDL, GROUP, PP_BN, PP_BK, PP_GS,
            PP_PF, True,
        )  # fmt: skip
        if last:
            # Every ticket is drawn and every wait passed: ready for the next launch.
            stages = tl.arange(0, 8)
            tl.store(done + stages, tl.zeros((8,), tl.int32), mask=stages < STAGES)
            tl.atomic_xchg(counts_ptr + TICKET, 0)
