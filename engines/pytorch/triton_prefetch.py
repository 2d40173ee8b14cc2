"""The Triton source of `l2_prefetch`'s kernel: byte ranges asked into the GPU's L2
cache ahead of the products that read them, and the activations passed through.

Each thread asks for one PIECE of a range with one bulk prefetch
(`cp.async.bulk.prefetch.L2`, compute capability 9.0 and later: a hint the copy engine
serves without registers, shared memory or a wait; the compiler issues a warp's 32 one
after another), before the kernel waits on the one before it (dependent launch), so the
bytes start to stream while that kernel still runs. Then the programs copy x to y: the
copy is the op's output, which orders it in a traced graph. Under Triton's interpreter
(the CPU tests) the prefetch is skipped and only the copy runs.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl

COMPILED = tl.constexpr(not triton.knobs.runtime.interpret)


@triton.jit
def _bulk_prefetch(base, offsets, total, PIECE: tl.constexpr):
    # PIECE bytes from base + each offset (fewer at the range's end, none past it).
    size = tl.minimum(tl.maximum(total - offsets, 0), PIECE).to(tl.int32)
    addresses = base.to(tl.pointer_type(tl.int8), bitcast=True) + offsets
    tl.inline_asm_elementwise(
        "{ .reg .pred p; setp.gt.s32 p, $2, 0; "
        "@p cp.async.bulk.prefetch.L2.global [$1], $2; mov.u32 $0, 0; }",
        "=r,l,r", [addresses, size], dtype=tl.int32, is_pure=False, pack=1,
    )  # fmt: skip


@triton.jit
def prefetch_l2(
    x_ptr, y_ptr, numel, words_ptr, words_bytes, scales_ptr, scales_bytes,
    PIECE: tl.constexpr, LANES: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr,
):  # fmt: skip
    # LANES threads a program (one warp), one bulk prefetch of PIECE bytes each.
    # The next kernel may launch at once: it waits for this one to finish anyway.
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
    pid = tl.program_id(0)
    offsets = (pid * LANES + tl.arange(0, LANES)).to(tl.int64) * PIECE
    if COMPILED:
        _bulk_prefetch(words_ptr, offsets, words_bytes, PIECE)
        _bulk_prefetch(scales_ptr, offsets, scales_bytes, PIECE)
    if PDL:
        tl.extra.cuda.gdc_wait()
    for start in range(pid * BLOCK, numel, tl.num_programs(0) * BLOCK):
        at = start + tl.arange(0, BLOCK)
        tl.store(y_ptr + at, tl.load(x_ptr + at, mask=at < numel), mask=at < numel)
