"""Int4 weights asked into the GPU's L2 cache ahead of the products that read them: a torch
custom op (`prefetch`) that passes the activations through and, on its way, prefetches
byte ranges of a layer's int4 block (`int4_blocks`), and the ranges a layer asks for
(`layer_ranges`).

Why: a decode step is a chain of dependent kernels; the products stream weights from
memory while the kernels between them (norms, rotary, attention) leave it idle, and each
product starts with a memory round trip of its own. In int4 a layer's weights are a few
tens of MB, the size of an H200's L2 (50 MB), where in bf16 they are four times that: so
int4, and not bf16, can have the copy engine stream the layer's weights into L2 while
attention runs, and its products then read L2. The copy engine serves a bulk prefetch
without registers, shared memory or a wait (`triton_prefetch`), so the op's kernel costs
a launch in the chain and its copy of the activations.

Where a layer asks (`PLACES`): "layer", at its start, for its block from q/k/v on;
"attention", after attention, from the output projection on. Each asks for at most
`budget_mb` MB, in the block's order (the layer's products run in that order). Bulk
prefetches need compute capability 9.0 or later; elsewhere no layer asks.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from engines.pytorch import dependent_launch, int4
from engines.pytorch.config import L2_PREFETCH_PLACES, EngineConfig
from engines.pytorch.int4 import PER_WORD, Int4Linear

PLACES = L2_PREFETCH_PLACES
DEFAULT_MB = EngineConfig.int4_l2_prefetch_mb
# Bytes one thread asks for with one bulk prefetch (a multiple of 16); threads a program.
PIECE = 16384
_LANES = 32
# Activations one program copies an iteration.
_COPY_BLOCK = 1024


@functools.cache
def _kernel() -> Any:
    from engines.pytorch import triton_prefetch

    return triton_prefetch.prefetch_l2


def supported(device: torch.device) -> bool:
    """Whether the device has bulk prefetches (CUDA, compute capability 9.0 or later)."""
    return dependent_launch.sm90_or_later(device)


def _launch(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    x = x.contiguous()
    y = x.new_empty(x.shape)
    words_bytes = words.numel() * words.element_size() // 16 * 16
    scales_bytes = scales.numel() * scales.element_size() // 16 * 16
    programs = max(1, -(-max(words_bytes, scales_bytes) // (_LANES * PIECE)))
    pdl = dependent_launch.enabled(x.device)
    _kernel()[(programs,)](
        x,
        y,
        x.numel(),
        words,
        words_bytes,
        scales,
        scales_bytes,
        PIECE=PIECE,
        LANES=_LANES,
        BLOCK=_COPY_BLOCK,
        PDL=pdl,
        num_warps=_LANES // 32,
        launch_pdl=pdl,
    )
    return y


@torch.library.custom_op("llm_serving_bench::prefetch_l2", mutates_args=())
def _prefetch_op(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return _launch(x, words, scales)


@_prefetch_op.register_kernel("cpu")
def _prefetch_cpu(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.contiguous().clone()  # a CPU has no L2 to ask: the op only passes x through


@_prefetch_op.register_fake
def _prefetch_shape(x: torch.Tensor, words: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty(x.shape)


def prefetch(x: torch.Tensor, ranges: tuple[torch.Tensor, torch.Tensor] | None) -> torch.Tensor:
    """x, after asking L2 for `ranges` (flat packed words and their scales), or x itself
    where there is nothing to ask for."""
    if ranges is None:
        return x
    return _prefetch_op(x, *ranges)


def layer_ranges(first: nn.Module, budget_mb: float) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The words and scales of `first`'s block from `first` on, at most `budget_mb` MB of
    them together (whole rows of the block, so each stays 16-byte aligned); None where
    `first` is not an int4 weight in a block, or the budget holds no row."""
    if not isinstance(first, Int4Linear) or first.block is None or budget_mb <= 0:
        return None
    block = first.block
    group, row = block.group, block.row
    per_value = int4.BITS / 8 + block.scale.element_size() / group
    total = block.packed.numel() * PER_WORD
    values = min(int(budget_mb * 1e6 / per_value), total - first.offset) // row * row
    if values <= 0:
        return None
    start = first.offset
    words = block.packed[start // PER_WORD : (start + values) // PER_WORD]
    scales = block.scale[start // group : (start + values) // group]
    return words, scales
