"""The Triton source of the engine's int4 (W4A16) products, driven by `kernels`:
`gemv_int4` (one row: `triton_kernels.gemv`'s prologues, epilogues, codes and roundings
over int4 weights), `matmul_int4` (2 to 64 rows, on the tensor cores, with the GELU
gates of a gate/up pair or times a vector as epilogues; `gelu_gate_int4`, the same gates
after a product that ends without them) and
`dequantize_int4` (the dense weight a longer prefill multiplies through cuBLAS).

The weights stay in compressed-tensors' layout (`int4`: element 8j + i in bits 4i..4i+3
of int32 word j of its row, stored q + 8; one scale per GROUP inputs), read as whole
words, coalesced along each row. Two choices make the unpacking cheap:
- No int-to-float conversion (a quarter-rate instruction on the SM): nibble i is moved
  under the exponent of 1.0 by one shift and one mask-or (a single LOP3, inline), and
  read as the float 1 + u/16 (`_nibble_floats`); q = u - 8 = 16 * f - 24, folded into
  the scale per word.
- The input chunk is loaded (and its prologue computed) once, contiguously, then split
  in registers into the eight strided slices x[8j + i] that meet nibble i of word j,
  instead of eight strided passes that each redo the prologue. `matmul_int4` instead
  interleaves the eight dequantized nibble tiles back into input order (in registers)
  for `tl.dot`.
`matmul_int4` and `dequantize_int4` make 16-bit values, and may make them two at a time
(`PAIRS`, `_dequantized_pairs`: fewer instructions a value in the loop, the same
bits), and load one scale a group, repeated in registers (`_chunk_scales`): one 2-byte
load a word stalled every chunk (records: `2026-12-02-h200-int4-pairs.md`); `matmul_int4`
may load them two to a 32-bit word (`SCALE_WORDS`), which Triton's pipeliner then copies
ahead with the weights (`2026-12-02-h200-int4-scale-words.md`). Both
products may issue the next chunk's loads before the current chunk's work (`PREFETCH`):
their latency then hides behind it where Triton's pipeliner does not.

Split-K (`matmul_int4`): a narrow output over a long input (down: 1,536 outputs of
12,288 inputs) gives too few output tiles to fill the SMs, so such shapes may also split
the input among SPLIT_K programs (the autotuner picks; `int4_tuning.prune_splits` offers
splits only where the tiles alone leave SMs idle). Each writes its float32 partial sums; the last of
a tile's programs to finish (a counter, atomically) adds them in split order and resets
the counter for the next launch: one launch, and the same sums in the same order on
every run, so greedy text repeats. At one row no split won on any E2B shape in
`benchmarks/int4_gemv_sweep.py` (narrow rows of long chunks, up to whole rows, fill the SMs
instead), so `gemv_int4` has none.

Which configuration each runs (the autotuner's lists, the pinned tables) is
`int4_tuning`'s.
"""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
import triton
import triton.language as tl

from engines.pytorch.int4_tuning import (
    GEMV_INT4_CONFIGS,
    MATMUL_INT4_CONFIGS,
    prune_gemv,
    prune_matmul,
)
from engines.pytorch.triton_kernels import (
    COMPILED,
    _gelu_gated,
    _input,
    _prologue,
    _residual_after,
    _round,
    _wait_at_least,
)


@triton.jit
def _nibble_floats(packed, i: tl.constexpr):
    # Nibble i of every word as the float 1 + u/16, exactly: its four bits moved to the
    # mantissa's top (bits 19..22) under the exponent of 1.0.
    if 4 * i <= 19:  # noqa: SIM108 (constexpr branches: no shift by a negative count)
        bits = packed << (19 - 4 * i)
    else:
        bits = packed >> (4 * i - 19)
    if COMPILED:
        # One LOP3 for the mask and the or: written as two operations they stay two (a
        # LOP3 takes one immediate; here ptxas keeps the other in a register), one
        # instruction a value of about 6.7 (SASS of the LM head's loop: 860 -> 738).
        bits = tl.inline_asm_elementwise(
            "lop3.b32 $0, $1, 0x780000, 0x3F800000, 0xEA;", "=r,r", [bits], dtype=tl.int32,
            is_pure=True, pack=1,
        )  # fmt: skip
    else:
        bits = (bits & 0x780000) | 0x3F800000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _eighths(x, WORDS: tl.constexpr):
    # x (8 * WORDS,) -> its eight slices x[8j + i], i = 0..7, each (WORDS,).
    odd_pairs, even_pairs = tl.split(tl.reshape(x, (WORDS, 4, 2)))
    x04, x26 = tl.split(tl.reshape(odd_pairs, (WORDS, 2, 2)))
    x15, x37 = tl.split(tl.reshape(even_pairs, (WORDS, 2, 2)))
    x0, x4 = tl.split(x04)
    x2, x6 = tl.split(x26)
    x1, x5 = tl.split(x15)
    x3, x7 = tl.split(x37)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _word_dot(packed, x0, x1, x2, x3, x4, x5, x6, x7):
    # sum_i f_i * x[8j + i] for every word (rows, words); f_i = 1 + u_i / 16.
    part = _nibble_floats(packed, 0) * x0[None, :]
    part += _nibble_floats(packed, 1) * x1[None, :]
    part += _nibble_floats(packed, 2) * x2[None, :]
    part += _nibble_floats(packed, 3) * x3[None, :]
    part += _nibble_floats(packed, 4) * x4[None, :]
    part += _nibble_floats(packed, 5) * x5[None, :]
    part += _nibble_floats(packed, 6) * x6[None, :]
    part += _nibble_floats(packed, 7) * x7[None, :]
    return part


@triton.jit
def _int4_weights(
    wq_ptr, s_ptr, rows, row_ok, w0, N, K, BLOCK_K: tl.constexpr, GROUP: tl.constexpr,
    EPILOGUE: tl.constexpr, SW: tl.constexpr,
):  # fmt: skip
    # One chunk of the program's int4 rows as (rows, words) int32 and their scales, one
    # per SW words (and the matching up rows of a gate/up pair).
    words = w0 + tl.arange(0, BLOCK_K // 8)
    mask = row_ok[:, None] & (words < K // 8)[None, :]
    offsets = rows[:, None] * (K // 8) + words[None, :]
    scale_words = w0 + tl.arange(0, BLOCK_K // 8 // SW) * SW
    s_mask = row_ok[:, None] & (scale_words < K // 8)[None, :]
    s_offsets = rows[:, None] * (K // GROUP) + (scale_words * 8 // GROUP)[None, :]
    packed = tl.load(wq_ptr + offsets, mask=mask, other=0, eviction_policy="evict_first")
    scale = tl.load(s_ptr + s_offsets, mask=s_mask, other=0.0).to(tl.float32)
    packed_up = packed
    scale_up = scale
    if EPILOGUE == 1:
        up = N * (K // 8)
        packed_up = tl.load(
            wq_ptr + up + offsets, mask=mask, other=0, eviction_policy="evict_first"
        )
        scale_up = tl.load(s_ptr + N * (K // GROUP) + s_offsets, mask=s_mask, other=0.0)
        scale_up = scale_up.to(tl.float32)
    return packed, scale, packed_up, scale_up


@triton.jit
def _per_scale(part, BLOCK_N: tl.constexpr, WORDS: tl.constexpr, SW: tl.constexpr):
    # (rows, words) -> (rows, words / SW): the sums of the words that share a scale.
    if SW == 1:
        return part
    return tl.sum(tl.reshape(part, (BLOCK_N, WORDS // SW, SW)), axis=2)


@triton.jit
def _finish(
    y, up, rstd, rows, row_ok, y_ptr, m_ptr, PROLOGUE: tl.constexpr, EPILOGUE: tl.constexpr
):  # fmt: skip
    if PROLOGUE == 5:
        y = y * rstd
        up = up * rstd
    if EPILOGUE == 1:
        y = _gelu_gated(_round(y, y_ptr), _round(up, y_ptr), y_ptr)
    elif EPILOGUE == 2:
        m = tl.load(m_ptr + rows, mask=row_ok, other=0.0).to(tl.float32)
        y = _gelu_gated(_round(y, y_ptr), m, y_ptr)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


@triton.autotune(
    configs=GEMV_INT4_CONFIGS,
    key=["N", "K", "PROLOGUE", "SCALE", "EPILOGUE", "GROUP"],
    prune_configs_by={"early_config_prune": prune_gemv},
    cache_results=True,
)
@triton.jit
def gemv_int4(
    x_ptr,
    b_ptr,
    nw_ptr,
    rw_ptr,
    s_ptr,
    xo_ptr,
    m_ptr,
    count_ptr,
    wq_ptr,
    ws_ptr,
    y_ptr,
    N,
    K,
    eps,
    PROLOGUE: tl.constexpr,
    SCALE: tl.constexpr,
    EPILOGUE: tl.constexpr,
    PDL: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_SCALES: tl.constexpr,
    PREFETCH: tl.constexpr = False,
):
    gemv_int4_tile(
        tl.program_id(0), tl.num_programs(0), x_ptr, b_ptr, nw_ptr, rw_ptr, s_ptr, xo_ptr,
        m_ptr, count_ptr, wq_ptr, ws_ptr, y_ptr, N, K, eps, count_ptr, 0, PROLOGUE, SCALE,
        EPILOGUE, PDL, GROUP, BLOCK_N, BLOCK_K, GROUP_SCALES, PREFETCH, False,
    )  # fmt: skip


@triton.jit
def gemv_int4_tile(
    pid, programs, x_ptr, b_ptr, nw_ptr, rw_ptr, s_ptr, xo_ptr, m_ptr, count_ptr, wq_ptr,
    ws_ptr, y_ptr, N, K, eps, wait_ptr, wait_for, PROLOGUE: tl.constexpr,
    SCALE: tl.constexpr, EPILOGUE: tl.constexpr, PDL: tl.constexpr, GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_SCALES: tl.constexpr,
    PREFETCH: tl.constexpr, WAITS: tl.constexpr,
):  # fmt: skip
    # Program `pid` of `programs` of `gemv_int4`; with WAITS, it also waits, after its
    # first chunk of weights, until `wait_ptr` counts `wait_for`
    # (`benchmarks/stage_chain_h200.py`: another product of the same launch made its
    # input). True for the program that took the residual step of epilogue 3.
    # N counts outputs; with GELU_PAIR the weight has 2N rows, gate rows then up rows.
    WORDS: tl.constexpr = BLOCK_K // 8
    # GROUP_SCALES: one scale load and multiply per group of words (group <= chunk)
    # instead of one per word; SW words share a scale.
    SW: tl.constexpr = GROUP // 8 if GROUP_SCALES and GROUP <= BLOCK_K else 1
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    # The first chunk of weights depends on no earlier kernel (see `triton_kernels.gemv`).
    packed, scale, packed_up, scale_up = _int4_weights(
        wq_ptr, ws_ptr, rows, row_ok, 0, N, K, BLOCK_K, GROUP, EPILOGUE, SW
    )
    if PDL:
        tl.extra.cuda.gdc_launch_dependents()
        tl.extra.cuda.gdc_wait()
    if WAITS:
        _wait_at_least(wait_ptr, wait_for)
    rstd, branch_rstd, scalar = _prologue(
        x_ptr, b_ptr, rw_ptr, s_ptr, xo_ptr, K, eps, pid == 0, PROLOGUE, SCALE, BLOCK_K
    )
    acc = tl.zeros((BLOCK_N, WORDS // SW), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, WORDS // SW), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        if PREFETCH:
            # The next chunk's loads go out before this one's product (zeros past K).
            next_chunk = _int4_weights(
                wq_ptr, ws_ptr, rows, row_ok, (k0 + BLOCK_K) // 8, N, K, BLOCK_K, GROUP,
                EPILOGUE, SW,
            )  # fmt: skip
        elif k0 > 0:
            packed, scale, packed_up, scale_up = _int4_weights(
                wq_ptr, ws_ptr, rows, row_ok, k0 // 8, N, K, BLOCK_K, GROUP, EPILOGUE, SW
            )
        cols = k0 + tl.arange(0, BLOCK_K)
        x, squares = _input(
            x_ptr, b_ptr, nw_ptr, rw_ptr, scalar, cols, cols < K, rstd, branch_rstd,
            squares, xo_ptr, pid == 0, PROLOGUE, SCALE,
        )  # fmt: skip
        # Per word: sum_i q_i x_i = 16 * sum_i f_i x_i - 24 * sum_i x_i (16 applied at the end).
        offset = 1.5 * tl.sum(tl.reshape(x, (WORDS, 8)), axis=1)
        x0, x1, x2, x3, x4, x5, x6, x7 = _eighths(x, WORDS)
        part = _word_dot(packed, x0, x1, x2, x3, x4, x5, x6, x7)
        acc += _per_scale(part - offset[None, :], BLOCK_N, WORDS, SW) * scale
        if EPILOGUE == 1:
            part_up = _word_dot(packed_up, x0, x1, x2, x3, x4, x5, x6, x7)
            acc_up += _per_scale(part_up - offset[None, :], BLOCK_N, WORDS, SW) * scale_up
        if PREFETCH:
            packed, scale, packed_up, scale_up = next_chunk
    y = 16.0 * tl.sum(acc, axis=1)
    up = 16.0 * tl.sum(acc_up, axis=1)
    if PROLOGUE == 5:
        rstd = 1.0 / tl.sqrt(tl.sum(squares, axis=0) / K + eps)
    _finish(y, up, rstd, rows, row_ok, y_ptr, m_ptr, PROLOGUE, EPILOGUE)
    last = pid < 0
    if EPILOGUE == 3:
        last = _residual_after(
            y_ptr, b_ptr, rw_ptr, scalar, xo_ptr, count_ptr, N, eps, programs, SCALE
        )
    return last


@triton.jit
def _dequantized(packed, scale, i: tl.constexpr, dtype: tl.constexpr):
    # q * scale of nibble i of every word: q = 16 f - 24 (`_nibble_floats`), one fma.
    return (_nibble_floats(packed, i) * (16.0 * scale) - 24.0 * scale).to(dtype)


def _pairs_asm(base: int, one: int, minus_offset: int, fma: str) -> str:
    # Nibbles (i, i + 4) of word $8 into the 16-bit halves of a pair of `base` (whose
    # ulp is 1: 128 + u in bf16, 1024 + u in fp16, exactly), then (x - base - 8) by one
    # fma.x2 (exact) and x * scale by another (x + -0 keeps a product's sign): rounded
    # once, as (u - 8) * scale computed in float32 and rounded is.
    pairs = "".join(
        f"shr.u32 t, $8, {4 * i}; lop3.b32 t, t, 0x000F000F, {base:#x}, 0xEA; "
        f"{fma} t, t, one, off; {fma} t, t, s2, zero; mov.b32 {{${i}, ${i + 4}}}, t; "
        for i in range(4)
    )
    # fma.x2 takes registers only.
    constants = f"mov.b32 one, {one:#x}; mov.b32 off, {minus_offset:#x}; mov.b32 zero, 0x80008000; "
    return "{ .reg .b32 t, s2, one, off, zero; mov.b32 s2, {$9, $9}; " + constants + pairs + "}"


@triton.constexpr_function
def _pairs_fit(pairs: bool, scale_dtype: tl.dtype, dtype: tl.dtype) -> bool:
    # `_dequantized_pairs` needs the scale and the values in one 16-bit float type.
    return bool(pairs) and scale_dtype == dtype and dtype in (tl.bfloat16, tl.float16)


# Per 16-bit type: the pair of bases (128.0, 1024.0), of 1.0, of -(base + 8), the fma.
PAIR_FORMS = {
    "bfloat16": (0x43004300, 0x3F803F80, 0xC308C308, "fma.rn.bf16x2"),
    "float16": (0x64006400, 0x3C003C00, 0xE408E408, "fma.rn.f16x2"),
}
PAIRS_BF16 = tl.constexpr(_pairs_asm(*PAIR_FORMS["bfloat16"]))
PAIRS_FP16 = tl.constexpr(_pairs_asm(*PAIR_FORMS["float16"]))


@triton.jit
def _dequantized_pairs(packed, scale):
    # The eight q * scale of every word (`_pairs_asm`), in the scale's 16-bit dtype: a
    # shift, a LOP3 and two fma.x2 a pair of elements, against a shift, a mask-or, an fma
    # and half a conversion an element for `_dequantized`.
    return tl.inline_asm_elementwise(
        PAIRS_BF16 if scale.dtype == tl.bfloat16 else PAIRS_FP16,
        "=h,=h,=h,=h,=h,=h,=h,=h,r,h", [packed, scale], dtype=(scale.dtype,) * 8,
        is_pure=True, pack=1,
    )  # fmt: skip


@triton.jit
def _dequantized_tile(packed, scale, dtype: tl.constexpr, PAIRS: tl.constexpr = False):
    # (outputs, words) -> (outputs, 8 * words) in input order. Element 8j + i is nibble i
    # of word j: interleaving nibbles (0,4), (2,6), (1,5), (3,7), then the pairs, then
    # the halves, puts every nibble back at its input. PAIRS: `_dequantized_pairs` makes
    # the values where it can (`_pairs_fit`), else the float32 way does.
    if _pairs_fit(PAIRS, scale.dtype, dtype):
        w0, w1, w2, w3, w4, w5, w6, w7 = _dequantized_pairs(packed, scale)
    else:
        scale32 = scale.to(tl.float32)
        w0 = _dequantized(packed, scale32, 0, dtype)
        w1 = _dequantized(packed, scale32, 1, dtype)
        w2 = _dequantized(packed, scale32, 2, dtype)
        w3 = _dequantized(packed, scale32, 3, dtype)
        w4 = _dequantized(packed, scale32, 4, dtype)
        w5 = _dequantized(packed, scale32, 5, dtype)
        w6 = _dequantized(packed, scale32, 6, dtype)
        w7 = _dequantized(packed, scale32, 7, dtype)
    evens = tl.interleave(tl.interleave(w0, w4), tl.interleave(w2, w6))
    odds = tl.interleave(tl.interleave(w1, w5), tl.interleave(w3, w7))
    return tl.interleave(evens, odds)


@triton.jit
def _chunk_scales(
    ws_ptr, outs, out_ok, k0, K, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, SCALE_WORDS: tl.constexpr = False,
):  # fmt: skip
    # The scale of every word of a chunk (outputs, BLOCK_K / 8), loaded once a group and
    # repeated in registers: one load a word (each scale four times for groups of 32)
    # stalled every chunk of the pipelined loop on its synchronous 2-byte loads.
    WORDS: tl.constexpr = BLOCK_K // 8
    if GROUP >= BLOCK_K:
        scale = tl.load(ws_ptr + outs * (K // GROUP) + k0 // GROUP, mask=out_ok, other=0.0)
        return tl.broadcast_to(scale[:, None], (BLOCK_N, WORDS))
    GROUPS: tl.constexpr = BLOCK_K // GROUP
    if SCALE_WORDS and GROUPS % 2 == 0:
        # Two scales a 32-bit word (rows of an even number of groups): Triton's pipeliner
        # copies loads of 4 bytes and more ahead asynchronously and leaves 2-byte ones
        # synchronous in the loop (its TTGIR for sm_90), where each chunk waited on them.
        pairs = k0 // (2 * GROUP) + tl.arange(0, GROUPS // 2)
        words = tl.load(
            ws_ptr.to(tl.pointer_type(tl.int32), bitcast=True)
            + outs[:, None] * (K // GROUP // 2)
            + pairs[None, :],
            mask=out_ok[:, None] & (pairs < K // GROUP // 2)[None, :],
            other=0,
        )
        dtype = ws_ptr.dtype.element_ty
        low = words.to(tl.int16).to(dtype, bitcast=True)  # the lower address: even group
        high = (words >> 16).to(tl.int16).to(dtype, bitcast=True)
        scale = tl.interleave(low, high)
    else:
        groups = k0 // GROUP + tl.arange(0, GROUPS)
        scale = tl.load(
            ws_ptr + outs[:, None] * (K // GROUP) + groups[None, :],
            mask=out_ok[:, None] & (groups < K // GROUP)[None, :],
            other=0.0,
        )
    repeated = tl.broadcast_to(scale[:, :, None], (BLOCK_N, GROUPS, GROUP // 8))
    return tl.reshape(repeated, (BLOCK_N, WORDS))


@triton.jit
def _matmul_chunk(
    x_ptr, wq_ptr, ws_ptr, rows, row_ok, outs, out_ok, k0, K, GROUP: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SCALE_WORDS: tl.constexpr,
):  # fmt: skip
    # One chunk's packed words and their scales (outputs, BLOCK_K / 8) and its inputs
    # (rows, BLOCK_K); all zero past K (what a prefetch after the last chunk asks for).
    words = k0 // 8 + tl.arange(0, BLOCK_K // 8)
    # K // 8 written as a multiple of GROUP // 8 (K is whole groups): Triton knows only
    # that K is a multiple of 16, so it loaded 8 bytes a copy; 16 once rows start so.
    row_words = (K // GROUP) * (GROUP // 8)
    mask = out_ok[:, None] & (words < row_words)[None, :]
    packed = tl.load(wq_ptr + outs[:, None] * row_words + words[None, :], mask=mask, other=0)
    scale = _chunk_scales(
        ws_ptr, outs, out_ok & (k0 < K), k0, K, GROUP, BLOCK_N, BLOCK_K, SCALE_WORDS
    )
    cols = k0 + tl.arange(0, BLOCK_K)
    x = tl.load(
        x_ptr + rows[:, None] * K + cols[None, :],
        mask=row_ok[:, None] & (cols < K)[None, :],
        other=0.0,
    )
    return packed, scale, x


@triton.jit
def _chunk_product(acc, packed, scale, x, PAIRS: tl.constexpr, ROWS_FIRST: tl.constexpr):
    # Outputs on the product's long side (the rows are few): wgmma's M, the dequantized
    # tile its register operand. ROWS_FIRST (64-row tiles fill wgmma's M): the rows
    # there, the dequantized tile stored once to shared memory as its other operand.
    w = _dequantized_tile(packed, scale, x.dtype, PAIRS)
    if ROWS_FIRST:  # noqa: SIM108 (a constexpr branch: only one dot is built)
        acc = acc + tl.dot(x, tl.trans(w))
    else:
        acc = acc + tl.dot(w, tl.trans(x))
    return acc


@triton.autotune(
    configs=MATMUL_INT4_CONFIGS,
    key=["M_BUCKET", "N", "K", "GROUP"],
    prune_configs_by={"early_config_prune": prune_matmul},
    cache_results=True,
)
@triton.jit
def matmul_int4(
    x_ptr,
    wq_ptr,
    ws_ptr,
    y_ptr,
    part_ptr,
    count_ptr,
    m_ptr,
    M,
    N,
    K,
    M_BUCKET,
    m_row_stride,
    GROUP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
    PAIRS: tl.constexpr = False,
    PREFETCH: tl.constexpr = False,
    ROWS_FIRST: tl.constexpr = False,
    SCALE_WORDS: tl.constexpr = False,
    EPILOGUE: tl.constexpr = 0,
):
    # Tiles of BLOCK_M rows by BLOCK_N weight rows; each chunk's int4 tile is dequantized
    # in registers, nibble by nibble, interleaved back into input order and multiplied on
    # the tensor cores, so the weights stream once for all rows.
    # Row tiles first: the programs that share a weight tile run together, and all but
    # the first read it from L2.
    # N counts weight rows. EPILOGUE (`gemv_forms`' codes): 1 (GELU_PAIR) N / 2 gate rows
    # then N / 2 up rows, y taking gelu_tanh(gate) * up (N / 2 outputs a row); 2
    # (GELU_TIMES) y taking gelu_tanh(product) * m (m: rows by N, each row m_row_stride
    # after the one before: a slice of the per-layer inputs).
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    split = tl.program_id(2)
    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    outs, out_ok = _tile_outs(pid_n, N, BLOCK_N, EPILOGUE == 1)
    row_ok = rows < M
    if ROWS_FIRST:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    STEP: tl.constexpr = BLOCK_K * SPLIT_K
    start = split * BLOCK_K
    # Not a dependent launch: served at 8 and 64 rows, the step took 0.13 ms longer with
    # one (records: `2026-12-02-h200-int4-rows-first.md`).
    packed, scale, x = _matmul_chunk(
        x_ptr, wq_ptr, ws_ptr, rows, row_ok, outs, out_ok, start, K, GROUP, BLOCK_N, BLOCK_K,
        SCALE_WORDS,
    )  # fmt: skip
    if PREFETCH:
        for k0 in range(start, K, STEP):
            # The next chunk's loads go out before this one's dequantize and product,
            # so their latency hides behind them (the loop itself is not pipelined).
            chunk_next = _matmul_chunk(
                x_ptr, wq_ptr, ws_ptr, rows, row_ok, outs, out_ok, k0 + STEP, K, GROUP,
                BLOCK_N, BLOCK_K, SCALE_WORDS,
            )  # fmt: skip
            acc = _chunk_product(acc, packed, scale, x, PAIRS, ROWS_FIRST)
            packed, scale, x = chunk_next
    else:
        acc = _chunk_product(acc, packed, scale, x, PAIRS, ROWS_FIRST)
        for k0 in range(start + STEP, K, STEP):
            packed, scale, x = _matmul_chunk(
                x_ptr, wq_ptr, ws_ptr, rows, row_ok, outs, out_ok, k0, K, GROUP, BLOCK_N,
                BLOCK_K, SCALE_WORDS,
            )  # fmt: skip
            acc = _chunk_product(acc, packed, scale, x, PAIRS, ROWS_FIRST)
    if ROWS_FIRST:
        acc = tl.trans(acc)
    offsets = outs[:, None] + rows[None, :] * N
    tile_ok = out_ok[:, None] & row_ok[None, :]
    if SPLIT_K == 1:
        _store_tile(
            y_ptr, m_ptr, m_row_stride, acc, outs, tile_ok, rows, row_ok, pid_n, N, BLOCK_N,
            BLOCK_M, EPILOGUE,
        )  # fmt: skip
    else:
        tl.store(part_ptr + split * M * N + offsets, acc, mask=tile_ok)
        tile = pid_n * tl.num_programs(0) + pid_m
        tl.debug_barrier()
        if tl.atomic_add(count_ptr + tile, 1, sem="acq_rel") == SPLIT_K - 1:
            total = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
            for s in tl.static_range(SPLIT_K):
                total += tl.load(
                    part_ptr + s * M * N + offsets, mask=tile_ok, other=0.0, cache_modifier=".cg"
                )
            _store_tile(
                y_ptr, m_ptr, m_row_stride, total, outs, tile_ok, rows, row_ok, pid_n, N,
                BLOCK_N, BLOCK_M, EPILOGUE,
            )  # fmt: skip
            tl.atomic_xchg(count_ptr + tile, 0)


@triton.jit
def _tile_outs(pid_n, N, BLOCK_N: tl.constexpr, PAIRED: tl.constexpr):
    # The weight rows a program multiplies, and which are there. PAIRED: its first
    # BLOCK_N / 2 are gate rows and the rest the up rows of the same outputs, so that its
    # epilogue holds both halves of every output it writes.
    if PAIRED:
        HALF: tl.constexpr = BLOCK_N // 2
        j = tl.arange(0, BLOCK_N)
        pairs = pid_n * HALF + j % HALF
        return pairs + (j // HALF) * (N // 2), pairs < N // 2
    outs = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    return outs, outs < N


@triton.jit
def _store_tile(
    y_ptr, m_ptr, m_row_stride, acc, outs, tile_ok, rows, row_ok, pid_n, N,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, EPILOGUE: tl.constexpr,
):  # fmt: skip
    # acc: the float32 sums (BLOCK_N weight rows, rows) of `_tile_outs`' rows; a GELU
    # gate rounded where the unfused ops (the product, F.gelu, the multiply) round, as
    # `gemv_int4`'s.
    if EPILOGUE == 1:
        HALF: tl.constexpr = BLOCK_N // 2
        halves = tl.permute(tl.reshape(acc, (2, HALF, BLOCK_M)), (1, 2, 0))
        gate, up = tl.split(halves)
        y = _gelu_gated(_round(gate, y_ptr), _round(up, y_ptr), y_ptr)
        pairs = pid_n * HALF + tl.arange(0, HALF)
        pair_ok = (pairs < N // 2)[:, None] & row_ok[None, :]
        offsets = pairs[:, None] + rows[None, :] * (N // 2)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=pair_ok)
    else:
        offsets = outs[:, None] + rows[None, :] * N
        y = acc
        if EPILOGUE == 2:
            m_at = outs[:, None] + rows[None, :] * m_row_stride
            m = tl.load(m_ptr + m_at, mask=tile_ok, other=0.0).to(tl.float32)
            y = _gelu_gated(_round(acc, y_ptr), m, y_ptr)
        tl.store(y_ptr + offsets, y.to(y_ptr.dtype.element_ty), mask=tile_ok)


@triton.jit
def gelu_gate_int4(
    y_ptr, m_ptr, out_ptr, N, y_row_stride, m_row_stride, PAIR: tl.constexpr,
    BLOCK: tl.constexpr,
):  # fmt: skip
    # `matmul_int4`'s GELU epilogues (`_store_tile`, the same roundings) after a product
    # that ends without them (`cuda_int4_rows`'): out (rows, N) = gelu_tanh(y's first N)
    # * (y's next N with PAIR, else m's), a row's BLOCK outputs a program, one launch.
    row = tl.program_id(0)
    outs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = outs < N
    gate = tl.load(y_ptr + row * y_row_stride + outs, mask=ok, other=0.0).to(tl.float32)
    if PAIR:
        m = tl.load(y_ptr + row * y_row_stride + N + outs, mask=ok, other=0.0)
    else:
        m = tl.load(m_ptr + row * m_row_stride + outs, mask=ok, other=0.0)
    y = _gelu_gated(gate, m.to(tl.float32), out_ptr)
    tl.store(out_ptr + row * N + outs, y.to(out_ptr.dtype.element_ty), mask=ok)


@triton.jit
def dequantize_int4(
    wq_ptr, ws_ptr, w_ptr, N, K, GROUP: tl.constexpr, BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr, PAIRS: tl.constexpr,
):  # fmt: skip
    # The dense (N, K) weight q * scale in w's dtype, a tile a program: what a prefill
    # (more rows than `matmul_int4` takes) multiplies through cuBLAS.
    outs = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    words = tl.program_id(1) * (BLOCK_K // 8) + tl.arange(0, BLOCK_K // 8)
    mask = (outs < N)[:, None] & (words < K // 8)[None, :]
    packed = tl.load(wq_ptr + outs[:, None] * (K // 8) + words[None, :], mask=mask, other=0)
    k0 = tl.program_id(1) * BLOCK_K
    scale = _chunk_scales(ws_ptr, outs, outs < N, k0, K, GROUP, BLOCK_N, BLOCK_K)
    dtype = w_ptr.dtype.element_ty
    w = _dequantized_tile(packed, scale, dtype, PAIRS)
    cols = k0 + tl.arange(0, BLOCK_K)
    tl.store(
        w_ptr + outs[:, None] * K + cols[None, :], w, mask=(outs < N)[:, None] & (cols < K)[None, :]
    )
