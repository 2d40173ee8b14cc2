"""A decoder layer's int4 Linear weights stored end to end in one pair of flat tensors
(an `Int4Block`), so that a prefill dequantizes the whole layer in one launch.

Why: a prefill has more rows than `kernels.matmul_int4` takes, so each int4 product
dequantizes its weight and multiplies it through cuBLAS. A prefill's time is mostly the
host's, and one dequantize launch a module made int4's prefill about twice bf16's
(records: `2026-12-03-h200-int4-prefill.md`). In one storage, the layer's first product of a
forward dequantizes every weight of the layer at once (one `dequantize_int4` launch over
the storage seen as rows of `row` values), and the others multiply views of that copy.

The layout: q * scale is elementwise with one scale per `group` consecutive values of a
row, and every weight's width is a multiple of the group, so the values of weights laid
end to end still take their scales in order: value e of the storage has scale e // group.
Each weight starts at a multiple of `row` values (so its packed words and scales stay
16-byte aligned for the kernels); weights whose sizes are multiples of `row` leave no gap
and consecutive ones (q/k/v, gate/up) are one (rows, K) view (`joined`), which is how the
decode program merges them without a copy.

Only one dense copy exists for a model at a time (`DenseSlot`): the layer last
dequantized. Kernels on one stream run in order, so the next layer's copy never overtakes
a product still reading the last one.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import nn

from engines.pytorch import int4
from engines.pytorch.int4 import PER_WORD, Int4, Int4Linear

# A weight's values start at a multiple of this many (and of 8 groups): aligned words
# and scales, and the dequantize kernel's row width.
_MIN_ROW = 256
# A layer's modules: the part of the name up to its index in a list of layers.
_LAYER = re.compile(r"^(.*\.\d+)\.")


@dataclass
class DenseSlot:
    """The one dense copy of a block a model keeps: the block a prefill dequantized last."""

    block: Int4Block | None = None
    dense: torch.Tensor | None = None


@dataclass(eq=False)
class Int4Block:
    """The packed words (flat int32) and scales (flat) of several int4 weights with one
    group size, each starting at a multiple of `row` values."""

    packed: torch.Tensor
    scale: torch.Tensor
    group: int
    row: int
    slot: DenseSlot  # shared by every block of the model

    def dense(self, dtype: torch.dtype) -> torch.Tensor:
        """Every value of the block as q * scale in `dtype`, flat: dequantized in one
        launch, or the slot's copy if this block was the last one dequantized."""
        from engines.pytorch import kernels

        slot = self.slot
        if slot.block is self and slot.dense is not None and slot.dense.dtype == dtype:
            return slot.dense
        slot.block, slot.dense = None, None  # the last copy goes back before the next
        rows = self.packed.numel() * PER_WORD // self.row
        as_rows = (self.packed.view(rows, self.row // PER_WORD), self.scale.view(rows, -1))
        slot.dense = kernels.dense(as_rows, dtype).view(-1)
        slot.block = self
        return slot.dense


def row_width(group: int) -> int:
    """The values a weight's start is aligned to: a multiple of 8 groups, at least 256."""
    return -(-_MIN_ROW // (8 * group)) * 8 * group


def gather(model: nn.Module) -> int:
    """Move each decoder layer's int4 Linear weights into one block a layer (modules that
    share a group size, scale dtype and device); the modules keep views of it. Modules
    outside a numbered layer (the head) and weights shared with another module stay as
    they are. Returns the number of blocks."""
    slot = DenseSlot()
    layers: dict[tuple[str, int, torch.dtype, torch.device], list[Int4Linear]] = {}
    shared = _shared_storages(model)
    for name, module in model.named_modules():
        match = _LAYER.match(name)
        if not isinstance(module, Int4Linear) or match is None:
            continue
        if module.packed.untyped_storage().data_ptr() in shared:
            continue
        packed, scale = module.int4
        group = int4.group_size_of(packed, scale)
        key = (match.group(1), group, scale.dtype, scale.device)
        layers.setdefault(key, []).append(module)
    for (_, group, _, _), modules in layers.items():
        _store(modules, group, slot)
    return len(layers)


def _shared_storages(model: nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for module in model.modules():
        if isinstance(module, Int4Linear | int4.Int4Embedding):
            ptr = module.packed.untyped_storage().data_ptr()
            seen[ptr] = seen.get(ptr, 0) + 1
    return {ptr for ptr, count in seen.items() if count > 1}


def _store(modules: list[Int4Linear], group: int, slot: DenseSlot) -> None:
    row = row_width(group)
    starts, end = [], 0
    for m in modules:
        starts.append(end)
        end += -(-m.out_features * m.in_features // row) * row
    first = modules[0].scale
    packed = torch.zeros(end // PER_WORD, dtype=torch.int32, device=first.device)
    scale = torch.zeros(end // group, dtype=first.dtype, device=first.device)
    block = Int4Block(packed, scale, group, row, slot)
    for m, start in zip(modules, starts, strict=True):
        size = m.out_features * m.in_features
        words = packed[start // PER_WORD : (start + size) // PER_WORD]
        scales = scale[start // group : (start + size) // group]
        words.copy_(m.packed.reshape(-1))
        scales.copy_(m.scale.reshape(-1))
        m.packed = words.view(m.out_features, m.in_features // PER_WORD)
        m.scale = scales.view(m.out_features, m.in_features // group)
        m.block, m.offset = block, start


def joined(modules: Sequence[Int4Linear]) -> Int4 | None:
    """The (packed, scale) rows of consecutive weights of one block (same width, no gap
    between them) as one pair of views, or None if they are not such a run."""
    block = modules[0].block
    k = modules[0].in_features
    if block is None or any(m.block is not block or m.in_features != k for m in modules):
        return None
    for before, after in itertools.pairwise(modules):
        if after.offset != before.offset + before.out_features * k:
            return None
    start = modules[0].offset
    end = modules[-1].offset + modules[-1].out_features * k
    rows = (end - start) // k
    packed = block.packed[start // PER_WORD : end // PER_WORD].view(rows, k // PER_WORD)
    scale = block.scale[start // block.group : end // block.group].view(rows, k // block.group)
    return packed, scale
