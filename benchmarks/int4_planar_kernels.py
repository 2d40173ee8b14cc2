"""The planar int4 layout's kernels, for `benchmarks.int4_planar_h200` (issue 18): word j
of each 128-input chunk holds inputs j, 16 + j, ..., 112 + j (nibble i is input 16 i + j),
where compressed-tensors' words hold 8j..8j+7. `planar_pack` writes the layout;
`planar_int4` multiplies a few rows on the tensor cores, a dot a nibble tile;
`planar_gemv` multiplies one row, each nibble against 16 consecutive inputs. Neither is
the engine's: they measure whether the layout is worth a repack at load."""

# No `from __future__ import annotations`: Triton reads `tl.constexpr` annotations as objects.
from typing import Any

import triton
import triton.language as tl

from engines.pytorch.triton_int4 import PAIR_FORMS, _dequantized, _nibble_floats
from engines.pytorch.triton_kernels import COMPILED

CHUNK = 128  # inputs a planar chunk: 16 words of 8 nibbles


def _planar_pairs_asm(base: int, one: int, minus_offset: int, fma: str) -> str:
    # `triton_int4._pairs_asm` with a scale a group: nibbles (i, i + 4) of a planar word
    # are inputs 16 i + j and 16 (i + 4) + j, of groups i // 2 and i // 2 + 2, so the
    # pair is scaled by {$9, $11} (i = 0, 1) or {$10, $12} (i = 2, 3).
    pairs = "".join(
        f"shr.u32 t, $8, {4 * i}; lop3.b32 t, t, 0x000F000F, {base:#x}, 0xEA; "
        f"{fma} t, t, one, off; {fma} t, t, {'s02' if i < 2 else 's13'}, zero; "
        f"mov.b32 {{${i}, ${i + 4}}}, t; "
        for i in range(4)
    )
    constants = f"mov.b32 one, {one:#x}; mov.b32 off, {minus_offset:#x}; mov.b32 zero, 0x80008000; "
    scales = "mov.b32 s02, {$9, $11}; mov.b32 s13, {$10, $12}; "
    return "{ .reg .b32 t, s02, s13, one, off, zero; " + scales + constants + pairs + "}"


PLANAR_PAIRS_BF16 = tl.constexpr(_planar_pairs_asm(*PAIR_FORMS["bfloat16"]))
PLANAR_PAIRS_FP16 = tl.constexpr(_planar_pairs_asm(*PAIR_FORMS["float16"]))


@triton.jit
def _group_tiles(
    wq_ptr, ws_ptr, outs, k0, K, BLOCK_N: tl.constexpr, SCALE_VECTOR: tl.constexpr,
    dtype: tl.constexpr,
):  # fmt: skip
    # A chunk's eight nibble tiles (outputs, 16): tiles 2g and 2g + 1 are group g's
    # (groups of 32), each scaled by its group's scale.
    j = tl.arange(0, 16)
    packed = tl.load(wq_ptr + outs[:, None] * (K // 8) + (k0 // 8 + j)[None, :])
    scales = ws_ptr + outs * (K // 32) + k0 // 32
    if SCALE_VECTOR:
        # The chunk's four scales of each output in one 8-byte load (Triton's pipeliner
        # copies loads of 4 bytes and more ahead; 2-byte ones stay synchronous).
        even, odd = tl.split(tl.reshape(
            tl.load(scales[:, None] + tl.arange(0, 4)[None, :]), (BLOCK_N, 2, 2)
        ))  # fmt: skip
        g0, g2 = tl.split(even)
        g1, g3 = tl.split(odd)
    else:
        g0 = tl.load(scales)
        g1 = tl.load(scales + 1)
        g2 = tl.load(scales + 2)
        g3 = tl.load(scales + 3)
    s0 = tl.broadcast_to(g0[:, None], (BLOCK_N, 16))
    s1 = tl.broadcast_to(g1[:, None], (BLOCK_N, 16))
    s2 = tl.broadcast_to(g2[:, None], (BLOCK_N, 16))
    s3 = tl.broadcast_to(g3[:, None], (BLOCK_N, 16))
    if COMPILED:
        return tl.inline_asm_elementwise(
            PLANAR_PAIRS_BF16 if s0.dtype == tl.bfloat16 else PLANAR_PAIRS_FP16,
            "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h,h,h", [packed, s0, s1, s2, s3], dtype=(s0.dtype,) * 8,
            is_pure=True, pack=1,
        )  # fmt: skip
    return (
        _dequantized(packed, s0.to(tl.float32), 0, dtype),
        _dequantized(packed, s0.to(tl.float32), 1, dtype),
        _dequantized(packed, s1.to(tl.float32), 2, dtype),
        _dequantized(packed, s1.to(tl.float32), 3, dtype),
        _dequantized(packed, s2.to(tl.float32), 4, dtype),
        _dequantized(packed, s2.to(tl.float32), 5, dtype),
        _dequantized(packed, s3.to(tl.float32), 6, dtype),
        _dequantized(packed, s3.to(tl.float32), 7, dtype),
    )


@triton.jit
def _tile_dot(acc, w, x_ptr, rows, row_ok, k0, K, i: tl.constexpr):
    cols = k0 + 16 * i + tl.arange(0, 16)
    x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=row_ok[:, None], other=0.0)
    return acc + tl.dot(w, tl.trans(x))


@triton.jit
def planar_int4(
    x_ptr, wq_ptr, ws_ptr, y_ptr, M, N, K, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SPLIT_K: tl.constexpr, CHUNKS: tl.constexpr, SCALE_VECTOR: tl.constexpr,
):  # fmt: skip
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    outs = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < M
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    STEP: tl.constexpr = 128 * CHUNKS * SPLIT_K
    dtype = x_ptr.dtype.element_ty
    for k1 in range(tl.program_id(2) * 128 * CHUNKS, K, STEP):
        for c in tl.static_range(CHUNKS):
            k0 = k1 + 128 * c
            w0, w1, w2, w3, w4, w5, w6, w7 = _group_tiles(
                wq_ptr, ws_ptr, outs, k0, K, BLOCK_N, SCALE_VECTOR, dtype
            )
            acc = _tile_dot(acc, w0, x_ptr, rows, row_ok, k0, K, 0)
            acc = _tile_dot(acc, w1, x_ptr, rows, row_ok, k0, K, 1)
            acc = _tile_dot(acc, w2, x_ptr, rows, row_ok, k0, K, 2)
            acc = _tile_dot(acc, w3, x_ptr, rows, row_ok, k0, K, 3)
            acc = _tile_dot(acc, w4, x_ptr, rows, row_ok, k0, K, 4)
            acc = _tile_dot(acc, w5, x_ptr, rows, row_ok, k0, K, 5)
            acc = _tile_dot(acc, w6, x_ptr, rows, row_ok, k0, K, 6)
            acc = _tile_dot(acc, w7, x_ptr, rows, row_ok, k0, K, 7)
    offsets = outs[:, None] + rows[None, :] * N
    if SPLIT_K == 1:
        tl.store(y_ptr + offsets, acc.to(y_ptr.dtype.element_ty), mask=row_ok[None, :])
    else:
        tl.atomic_add(y_ptr + offsets, acc, mask=row_ok[None, :], sem="relaxed")


@triton.jit
def _slice_sum(packed, x_ptr, inputs, ok, i: tl.constexpr):
    # f_i * x_i of every word (f = 1 + u / 16, `_nibble_floats`) and x_i itself.
    x = tl.load(x_ptr + inputs + 16 * i, mask=ok, other=0.0).to(tl.float32)
    return _nibble_floats(packed, i) * x[None, :], x


@triton.jit
def _group_part(packed, x_ptr, inputs, ok, g: tl.constexpr, BLOCK_N: tl.constexpr,
                CHUNKS: tl.constexpr):  # fmt: skip
    # Group g of each chunk (nibbles 2g, 2g + 1): sum over its 16 words of
    # f x - 1.5 x, which is q x / 16 (q = 16 f - 24).
    fa, xa = _slice_sum(packed, x_ptr, inputs, ok, 2 * g)
    fb, xb = _slice_sum(packed, x_ptr, inputs, ok, 2 * g + 1)
    part = fa + fb - 1.5 * (xa + xb)[None, :]
    return tl.sum(tl.reshape(part, (BLOCK_N, CHUNKS, 16)), axis=2)


@triton.jit
def planar_gemv(
    x_ptr, wq_ptr, ws_ptr, y_ptr, N, K, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr
):  # fmt: skip
    # One row: BLOCK_N outputs a program, chunks of BLOCK_K inputs (whole planar chunks).
    WORDS: tl.constexpr = BLOCK_K // 8
    CHUNKS: tl.constexpr = BLOCK_K // 128
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < N
    w = tl.arange(0, WORDS)
    base = 128 * (w // 16) + w % 16  # nibble 0's input of each word, in its chunk
    c = tl.arange(0, CHUNKS)
    acc = tl.zeros((BLOCK_N, CHUNKS), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        words = k0 // 8 + w
        packed = tl.load(
            wq_ptr + rows[:, None] * (K // 8) + words[None, :],
            mask=row_ok[:, None] & (words < K // 8)[None, :], other=0,
        )  # fmt: skip
        inputs = k0 + base
        ok = inputs < K
        groups = k0 // 32 + 4 * c
        s_ptrs = ws_ptr + rows[:, None] * (K // 32) + groups[None, :]
        s_ok = row_ok[:, None] & (groups < K // 32)[None, :]
        for g in tl.static_range(4):
            scale = tl.load(s_ptrs + g, mask=s_ok, other=0.0).to(tl.float32)
            acc += _group_part(packed, x_ptr, inputs, ok, g, BLOCK_N, CHUNKS) * scale
    y = 16.0 * tl.sum(acc, axis=1)
    tl.store(y_ptr + rows, y.to(y_ptr.dtype.element_ty), mask=row_ok)


def planar_pack(q: Any) -> Any:
    """(N, K) int4 values in [-8, 7] -> (N, K / 8) int32 words, planar per 128 inputs."""
    import torch

    n, k = q.shape
    u = (q.to(torch.int32) + 8).reshape(n, k // CHUNK, 8, 16)
    words = torch.zeros(n, k // CHUNK, 16, dtype=torch.int32, device=q.device)
    for i in range(8):
        words |= u[:, :, i, :] << (4 * i)
    return words.reshape(n, k // 8)
