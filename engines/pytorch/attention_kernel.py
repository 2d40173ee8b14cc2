"""Batch-1 decode attention as one split-KV Triton kernel and a combine, a torch custom op
with the matrix-product form it replaces (which every other batch size and the CPU run).

Why: at batch 1 the decode program's attention (`programs._attend`) is two cuBLAS batched
products around a softmax, three launches per layer for a few hundred keys: a few
microseconds and two launch gaps a layer, a measurable share of the step
(benchmarks/records/2026-11-29-h200-pytorch-epilogues.md). Here the
keys are split into blocks of `BLOCK_L`; each program takes every query head of one KV
head (grouped-query attention: the heads share the keys it loads) over one block and
writes its unnormalised output (zeros where no key of the block is visible), running
maximum and sum; one small kernel combines the blocks, with all their loads in flight at
once for up to 64 blocks (32 where heads are 512 wide), rescaling pass by pass beyond.
The pools are passed whole (slot 0 is row 0 at batch 1), so no view of them is copied
before the kernel. Keys the mask hides (past the row's length in its KV bucket, outside
a sliding window) are never fetched: the kernel costs what the row reads, not what its
bucket holds (what that saved on an H200, with dependent launch:
benchmarks/records/2026-11-30-h200-pytorch-dependent-launch.md).

`decode_attention_normed` (`--attention-form normed-kernel`) starts from the q/k/v
projection's raw row instead: the query heads' RMSNorm and rotary, and the new key's and
value's with their write to the pools, happen in the partial kernel, which attends to the
new row from registers. In the program's torch form they are compiled kernels of their
own, launched as ordinary kernels: each breaks the dependent-launch overlap around
attention (a dependent cannot start before an ordinary kernel ends). Everything but the
q/k/v row is read before the kernel waits on the projection (`dependent_launch` says
what may be): the norm weights, the rotary rows, the position, the mask and the block's
keys and values, whose every row but the new one an earlier step or prefill wrote. The
new row is this step's: a layer that writes KV makes it in registers; one that reads an
earlier layer's pools reads it again after the wait.

Numerics: scores are rounded to the activation dtype as the products' output is, and the
probabilities are rounded before they weigh the values, as the products' form rounds
them; they are normalised after the values' product (flash-decoding), so results differ
from it by rounding, not by method.

Triton is imported only when a CUDA batch-1 call needs the kernel.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from engines.pytorch import dependent_launch


@functools.cache
def _kernels() -> Any:
    from engines.pytorch import triton_attention

    return triton_attention


def _launch(
    partial: Any, args: tuple[Any, ...], kv_heads: int, group: int, dv: int, kv_len: int,
    dtype: torch.dtype, device: torch.device, *, strides: tuple[int, ...],
    scalars: tuple[float, ...], **constants: Any,
) -> torch.Tensor:  # fmt: skip
    """A split-KV kernel over blocks of the keys, then the combine: `partial` takes `args`,
    its partial outputs, the KV length, `strides`, `scalars`, then `constants` (D, ...)."""
    pdl = dependent_launch.enabled(device)
    block_l, blocks, block_g = split(kv_len, group)
    acc = torch.empty(kv_heads * blocks * block_g, dv, dtype=torch.float32, device=device)
    top = torch.empty(kv_heads * blocks * block_g, dtype=torch.float32, device=device)
    total = torch.empty_like(top)
    out = torch.empty(1, kv_heads, group, dv, dtype=dtype, device=device)
    partial[(kv_heads, blocks)](
        *args,
        acc,
        top,
        total,
        kv_len,
        *strides,
        *scalars,
        GROUP=group,
        BLOCK_G=block_g,
        BLOCK_L=block_l,
        PDL=pdl,
        num_warps=partial_warps(max(constants["D"], dv)),
        launch_pdl=pdl,
        **constants,
    )
    _kernels().attention_combine[(kv_heads * group,)](
        acc,
        top,
        total,
        out,
        blocks,
        GROUP=group,
        BLOCK_G=block_g,
        DV=dv,
        BLOCK_S=combine_blocks(dv, blocks, COMBINE_WARPS),
        PDL=pdl,
        num_warps=COMBINE_WARPS,
        launch_pdl=pdl,
    )
    return out


COMBINE_WARPS = 8


def split(kv_len: int, group: int) -> tuple[int, int, int]:
    """The partial kernel's blocks of keys: (keys a block, blocks, query rows a program:
    the group padded to the 16 rows tl.dot wants at least)."""
    block_l = 32 if kv_len <= 2048 else 64
    return block_l, -(-kv_len // block_l), max(16, 1 << (group - 1).bit_length())


def combine_blocks(dv: int, blocks: int, warps: int) -> int:
    """The combine's blocks a pass: as many as fit 64 floats a thread of its warps."""
    return min(max(1, 64 * 32 * warps // dv), 1 << (blocks - 1).bit_length())


def partial_warps(head_dim: int) -> int:
    """The partial kernel's warps: 8 for rows of 512 and wider, else 4."""
    return 8 if head_dim >= 512 else 4


def pool_strides(k0: torch.Tensor, v0: torch.Tensor) -> tuple[int, int, int, int]:
    """The (head, row) strides of a slot's key and value pools."""
    return k0.stride(0), k0.stride(1), v0.stride(0), v0.stride(1)


@torch.library.custom_op("llm_serving_bench::decode_attention", mutates_args=())
def _decode_attention_op(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, hidden: torch.Tensor, scale: float
) -> torch.Tensor:
    _rows, kv_heads, group, head_dim = q.shape
    dv = v_pool.shape[-1]
    k0, v0 = k_pool[0], v_pool[0]  # (KVH, capacity, D): row 0 is slot 0
    args = (q.contiguous(), k0, v0, hidden.reshape(-1).view(torch.uint8))
    return _launch(
        _kernels().attention_partial, args, kv_heads, group, dv, hidden.shape[-1], q.dtype,
        q.device, strides=pool_strides(k0, v0), scalars=(scale,), D=head_dim, DV=dv,
        SCALED=scale != 1.0,
    )  # fmt: skip


@_decode_attention_op.register_fake
def _decode_attention_shape(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, hidden: torch.Tensor, scale: float
) -> torch.Tensor:
    return q.new_empty(q.shape[0], q.shape[1], q.shape[2], v_pool.shape[-1])


@torch.library.custom_op(
    "llm_serving_bench::decode_attention_normed", mutates_args=("k_pool", "v_pool")
)
def decode_attention_normed(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    hidden: torch.Tensor,
    heads: int,
    writes_kv: bool,
    scale: float,
    eps: float,
) -> torch.Tensor:
    """`decode_attention` from the q/k/v projection's row (1, (heads + 2 KVH) * D), or
    (1, heads * D) where the layer reads an earlier layer's KV: the query heads are
    RMS-normed (`q_norm`) and rotated (cos, sin: (1, D) at the row's position) in the
    kernel, and where `writes_kv`, so are the new key (`k_norm`) and value (no weight),
    written to slot 0 of the pools at `positions[0]`. The same arithmetic as the
    program's torch form to rounding: float32, rounded where torch.rms_norm and the
    rotary's output are."""
    kv_heads, head_dim = k_pool.shape[1], k_pool.shape[-1]
    k0, v0 = k_pool[0], v_pool[0]  # (KVH, capacity, D): row 0 is slot 0
    args = (qkv.contiguous(), q_norm, k_norm, cos.contiguous(), sin.contiguous(), positions,
            k0, v0, hidden.reshape(-1).view(torch.uint8))  # fmt: skip
    return _launch(
        _kernels().attention_partial_normed, args, kv_heads, heads // kv_heads, head_dim,
        hidden.shape[-1], qkv.dtype, qkv.device, strides=pool_strides(k0, v0),
        scalars=(scale, eps), HEADS=heads, KV_HEADS=kv_heads, D=head_dim, SCALED=scale != 1.0,
        WRITES_KV=writes_kv,
    )  # fmt: skip


@decode_attention_normed.register_fake
def _decode_attention_normed_shape(
    qkv: torch.Tensor,
    q_norm: torch.Tensor,
    k_norm: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    hidden: torch.Tensor,
    heads: int,
    writes_kv: bool,
    scale: float,
    eps: float,
) -> torch.Tensor:
    kv_heads, head_dim = k_pool.shape[1], k_pool.shape[-1]
    return qkv.new_empty(1, kv_heads, heads // kv_heads, head_dim)


def use_kernel(q: torch.Tensor, k_pool: torch.Tensor) -> bool:
    """Batch 1 on CUDA in 16-bit floats, over pools whose last dimension is contiguous."""
    return (
        q.shape[0] == 1
        and q.device.type == "cuda"
        and q.dtype in (torch.bfloat16, torch.float16)
        and k_pool.stride(-1) == 1
    )


def decode_attention(
    q: torch.Tensor,
    k_pool: torch.Tensor,
    v_pool: torch.Tensor,
    hidden: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """q (1, KVH, G, D) over the first `hidden.shape[-1]` positions of slot 0 of the
    pools (slots, KVH, capacity, D), `hidden` (1, 1, 1, L) True where a key is not
    visible: (1, KVH, G, Dv)."""
    return _decode_attention_op(q, k_pool, v_pool, hidden, scale)


def use_normed_kernel(qkv: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor) -> bool:
    """`decode_attention_normed` applies: `use_kernel`'s conditions, and values as wide as
    keys (the new value row is made beside the new key)."""
    return use_kernel(qkv, k_pool) and v_pool.shape[-1] == k_pool.shape[-1]
