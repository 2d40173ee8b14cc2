"""Decode attention as one Pallas kernel a layer, read straight from the slot KV cache.

XLA runs a decode step's attention as about six kernels a layer: gathering the rows'
keys and values out of the cache, the scores' product, the softmax's two reductions and
a conversion, and the values' product. At batch 1 each costs its launch and tail rather
than its bytes. This kernel does the lot in one launch, flash-decoding style: a program
per (row, KV head, split of the KV length) reads its row's slot of the cache directly,
keeps a running max and sum over blocks of keys, and writes its unnormalized output
with the two statistics. XLA then joins the splits in a fusion that also divides by the
sum.

What a row may see: full-attention layers keep positions 0 .. p at their own index, and
sliding layers' rings hold position q at q mod window, so a row at position p sees
exactly the entries [0, min(p + 1, length)) of either (the ring holds only the last
`window` positions). A padding row (p = -1) sees nothing and gets zeros, as the XLA
path gives it.

Written on `jax.experimental.pallas` with its Triton backend (the same one JAX's own
`pallas.ops.gpu.decode_attention` uses). That op takes keys already gathered per row,
which is the gather this kernel exists to skip. On a CPU the kernel runs in Pallas's
interpreter, which the tests use to check it against the XLA path.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

# A product's rows: a KV head's query heads, padded to at least this many (the tensor
# cores' smallest product; below it Triton multiplies on the CUDA cores, and the padding
# costs a kernel of XLA's before this one)
MIN_QUERY_ROWS = 16
TILE_ELEMENTS = 16384  # keys a block x head size: 32 KB of bf16 keys (and as much values)
TARGET_PROGRAMS = 128  # splits of the KV length until rows x heads x splits reach this


def supported(length: int, head_dim: int, group: int) -> bool:
    """Whether the kernel takes this layer: tiles are powers of two of at least 16 (the
    tensor cores' smallest product), blocks must tile the cache length, and a KV head's
    query heads (padded) must be a power of two."""
    power_of_two = head_dim >= 16 and head_dim & (head_dim - 1) == 0
    rows = query_rows(group)
    return power_of_two and rows & (rows - 1) == 0 and length % block_keys(length, head_dim) == 0


def query_rows(group: int) -> int:
    return max(group, MIN_QUERY_ROWS)


def block_keys(length: int, head_dim: int) -> int:
    """Keys a block: up to 128 and one tile's worth, halved until it divides `length`."""
    block = max(16, min(128, TILE_ELEMENTS // head_dim))
    while block > 16 and length % block:
        block //= 2
    return block


def splits_for(rows: int, kv_heads: int, length: int, block: int) -> int:
    """Splits of the KV length: a power of two, until enough programs run at once, each
    with at least one whole block."""
    splits = 1
    while rows * kv_heads * splits < TARGET_PROGRAMS and length % (2 * splits * block) == 0:
        splits *= 2
    return splits


def _kernel(
    slots_ref, lengths_ref, q_ref, k_ref, v_ref, o_ref, m_ref, l_ref, *, block: int, span: int
):  # fmt: skip
    row, head, split = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    slot = slots_ref[row]
    visible = lengths_ref[row]
    first = split * span
    q = q_ref[...]  # [query rows, d]
    n, d = q.shape
    o = jnp.zeros((n, d), jnp.float32)
    m = jnp.full((n,), -jnp.inf, jnp.float32)
    total = jnp.zeros((n,), jnp.float32)
    blocks = jnp.clip(pl.cdiv(visible - first, block), 0, span // block)

    def body(i: jax.Array, carry: tuple[jax.Array, jax.Array, jax.Array]) -> tuple:
        o, m, total = carry
        start = first + i * block
        keys = k_ref[slot, pl.ds(start, block), head, :]  # [block, d]
        scores = plgpu.dot(q, keys.T)  # [query rows, block], float32
        seen = (start + jnp.arange(block)) < visible
        scores = jnp.where(seen[None, :], scores, -jnp.inf)
        m_next = jnp.maximum(m, scores.max(axis=-1))
        weights = jnp.exp(scores - m_next[:, None])
        correction = jnp.exp(m - m_next)
        values = v_ref[slot, pl.ds(start, block), head, :]
        o = o * correction[:, None] + plgpu.dot(weights.astype(values.dtype), values)
        return o, m_next, total * correction + weights.sum(axis=-1)

    o, m, total = jax.lax.fori_loop(0, blocks, body, (o, m, total))
    o_ref[...] = o
    m_ref[...] = m
    l_ref[...] = total


def decode_attention(
    q: jax.Array,
    cache_k: jax.Array,
    cache_v: jax.Array,
    slots: jax.Array,
    visible: jax.Array,
    *,
    length: int,
    interpret: bool = False,
) -> jax.Array:
    """q [rows, heads, d]; the cache [slots, >= length, kv_heads, d], of which the first
    `length` entries are read at most; each row's slot and the count of entries it sees
    ([rows]; 0 for a padding row) -> [rows, heads * d] in q's dtype. Scale 1 (Gemma 4's)."""
    rows, heads, d = q.shape
    num_slots, _, kv_heads, _ = cache_k.shape
    group = heads // kv_heads
    block = block_keys(length, d)
    splits = splits_for(rows, kv_heads, length, block)
    span = length // splits
    n = query_rows(group)
    grouped = q.reshape(rows, kv_heads, group, d)
    if n > group:
        grouped = jnp.pad(grouped, ((0, 0), (0, 0), (0, n - group), (0, 0)))
    # A padding row's slot is past the last: clamp it (it reads nothing: visible is 0).
    slots = jnp.minimum(slots, num_slots - 1).astype(jnp.int32)
    visible = jnp.clip(visible, 0, length).astype(jnp.int32)
    kernel = functools.partial(_kernel, block=block, span=span)

    def whole(shape: tuple[int, ...]) -> pl.BlockSpec:  # the kernel indexes it by slot
        return pl.BlockSpec(shape, lambda r, h, s: (0,) * len(shape))

    o, m, total = pl.pallas_call(
        kernel,
        grid=(rows, kv_heads, splits),
        in_specs=[
            whole((rows,)),
            whole((rows,)),
            pl.BlockSpec((None, None, n, d), lambda r, h, s: (r, h, 0, 0)),
            whole(cache_k.shape),
            whole(cache_v.shape),
        ],
        out_specs=[
            pl.BlockSpec((None, None, None, n, d), lambda r, h, s: (r, h, s, 0, 0)),
            pl.BlockSpec((None, None, None, n), lambda r, h, s: (r, h, s, 0)),
            pl.BlockSpec((None, None, None, n), lambda r, h, s: (r, h, s, 0)),
        ],
        out_shape=[
            jax.ShapeDtypeStruct((rows, kv_heads, splits, n, d), jnp.float32),
            jax.ShapeDtypeStruct((rows, kv_heads, splits, n), jnp.float32),
            jax.ShapeDtypeStruct((rows, kv_heads, splits, n), jnp.float32),
        ],
        compiler_params=plgpu.CompilerParams(num_warps=4, num_stages=2),
        interpret=interpret,
        name="decode_attention",
    )(slots, visible, grouped, cache_k, cache_v)
    # Join the splits: rescale each to the largest max, then divide by the joint sum. A
    # split (or a row) that saw nothing has max -inf and sum 0: it weighs 0. The padding
    # query rows are dropped first, so the slice is no kernel of its own.
    o, m, total = o[..., :group, :], m[..., :group], total[..., :group]
    top = m.max(axis=2, keepdims=True)
    weight = jnp.where(jnp.isfinite(m), jnp.exp(m - jnp.where(jnp.isfinite(top), top, 0.0)), 0.0)
    joint = (total * weight).sum(axis=2)
    out = (o * weight[..., None]).sum(axis=2) / jnp.maximum(joint, 1e-30)[..., None]
    return out.astype(q.dtype).reshape(rows, heads * d)
