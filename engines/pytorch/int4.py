"""Int4 weights (W4A16): compressed-tensors' `pack-quantized` layout, round-to-nearest
quantization, and the modules that hold such weights in a model.

The format, from compressed-tensors' own source (`compressors/pack_quantized/helpers.py`
and `base.py`, `quantization/utils/helpers.py`, version 0.20): a quantized module stores
`weight_packed` int32 (out, ceil(in / 8)), `weight_scale` (out, in / group) in the model's
dtype and `weight_shape` int32 (out, in). Each signed value q in [-8, 7] is stored as q + 8,
eight to a word, element 8j + i in bits 4i..4i+3 of word j; the weight is q * scale.
A symmetric scale is max|w| of its group / 7.5, and q = clamp(round(w / scale), -8, 7).

An int4 weight travels through the engine as the pair (packed, scale): the group size is
in/scale.shape[1] and in = 8 * packed.shape[1], so nothing else is needed, and the pair
passes through torch.compile as plain tensors. Rows are independent, so the merged
projections of the decode program are concatenations of packed rows and scale rows.

`Int4Linear` and `Int4Embedding` replace a model's `nn.Linear` / `nn.Embedding` on CUDA
(the weights stay int4 in GPU memory; `kernels` multiplies them). On the CPU the engine
dequantizes instead and runs its dense path (`dequantize_into`).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel

from contract.errors import BenchError

if TYPE_CHECKING:
    from engines.pytorch.int4_blocks import Int4Block

log = logging.getLogger(__name__)

BITS = 4
OFFSET = 8
QMIN, QMAX = -8, 7
PER_WORD = 32 // BITS
DEFAULT_GROUP_SIZE = 32
# compressed-tensors' symmetric scale: max|w| / ((qmax - qmin) / 2).
SCALE_DIVISOR = (QMAX - QMIN) / 2
# Values `quantize`, `dequantize`, `pack` and `unpack` work on at a time: their float32
# and int32 temporaries are several times the weight's size. Whole, on E2B's per-layer
# embedding table (262,144 x 8,960), they made int4's peak on an H200 76 GB against
# bf16's 22 (records: `2026-12-06-h200-same-run-targets.md`). By rows each stays about
# 64 MB; rows are independent, so the values are the same.
CHUNK_VALUES = 1 << 24

Int4 = tuple[torch.Tensor, torch.Tensor]  # (packed int32 (N, K/8), scale (N, K/group))
TENSOR_NAMES = ("weight_packed", "weight_scale", "weight_shape")


class Int4FormatError(BenchError, ValueError):
    """An int4 tensor set that does not fit the format (shapes, dtypes, group size)."""


def _row_chunks(rows: int, cols: int) -> Iterator[slice]:
    """Slices of at most CHUNK_VALUES values each (whole rows, at least one)."""
    step = max(1, CHUNK_VALUES // max(cols, 1))
    for start in range(0, rows, step):
        yield slice(start, min(rows, start + step))


def pack(q: torch.Tensor) -> torch.Tensor:
    """Signed int4 values (N, K) in [-8, 7] -> int32 words (N, ceil(K / 8))."""
    rows, cols = q.shape
    words = -(-cols // PER_WORD)
    out = torch.empty(rows, words, dtype=torch.int32, device=q.device)
    shifts = torch.arange(PER_WORD, device=q.device, dtype=torch.int32) * BITS
    for part in _row_chunks(rows, cols):
        u = (q[part].to(torch.int32) + OFFSET) & 0xF
        u = F.pad(u, (0, words * PER_WORD - cols)).view(-1, words, PER_WORD)
        # Disjoint bit fields: the sum is their OR; int32 wraps the top nibble into the sign.
        out[part] = (u << shifts).sum(dim=-1, dtype=torch.int64).to(torch.int32)
    return out


def unpack(packed: torch.Tensor, cols: int) -> torch.Tensor:
    """int32 words (N, W) -> signed int4 values (N, cols) as int8."""
    rows, words = packed.shape
    out = torch.empty(rows, cols, dtype=torch.int8, device=packed.device)
    for part in _row_chunks(rows, words * PER_WORD):
        out[part] = _unpacked(packed[part], cols)
    return out


def _unpacked(packed: torch.Tensor, cols: int) -> torch.Tensor:
    rows, words = packed.shape
    shifts = torch.arange(PER_WORD, device=packed.device, dtype=torch.int32) * BITS
    u = (packed[:, :, None] >> shifts) & 0xF
    return (u.view(rows, words * PER_WORD)[:, :cols] - OFFSET).to(torch.int8)


def group_size_of(packed: torch.Tensor, scale: torch.Tensor) -> int:
    return packed.shape[1] * PER_WORD // scale.shape[1]


def dequantize(
    packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype, out: torch.Tensor | None = None
) -> torch.Tensor:
    """q * scale, (N, K) in `dtype`, computed in float32 and rounded once; into `out` (on
    any device) where given, rows at a time, with no second dense copy."""
    rows, cols = packed.shape[0], packed.shape[1] * PER_WORD
    if out is None:
        out = torch.empty(rows, cols, dtype=dtype, device=packed.device)
    for part in _row_chunks(rows, cols):
        out[part] = _dequantized(packed[part], scale[part], dtype)
    return out


def _dequantized(packed: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # `dequantize` in one pass: also for an embedding's gathered rows inside a compiled
    # program, where a Python loop over their (dynamic) count would specialize on it.
    rows, cols = packed.shape[0], packed.shape[1] * PER_WORD
    groups = scale.shape[1]
    q = _unpacked(packed, cols).float().view(rows, groups, cols // groups)
    return (q * scale.float()[:, :, None]).view(rows, cols).to(dtype)


def quantize(weight: torch.Tensor, group_size: int = DEFAULT_GROUP_SIZE) -> Int4:
    """Round-to-nearest symmetric int4 of a (N, K) weight: (packed, scale in its dtype),
    the values compressed-tensors' own min/max scales and `quantize` give. The scale is
    rounded to the weight's dtype before q is chosen."""
    rows, cols = weight.shape
    if group_size % PER_WORD or cols % group_size:
        raise Int4FormatError(
            f"group size {group_size} must be a multiple of {PER_WORD} dividing the "
            f"input width {cols}"
        )
    packed = torch.empty(rows, cols // PER_WORD, dtype=torch.int32, device=weight.device)
    scale = torch.empty(rows, cols // group_size, dtype=weight.dtype, device=weight.device)
    for part in _row_chunks(rows, cols):
        packed[part], scale[part] = _quantized_rows(weight[part].detach(), group_size)
    return packed, scale


def _quantized_rows(weight: torch.Tensor, group_size: int) -> Int4:
    rows, cols = weight.shape
    w = weight.float().view(rows, cols // group_size, group_size)
    scale = (w.abs().amax(dim=-1) / SCALE_DIVISOR).to(weight.dtype)
    # An all-zero group gets the dtype's epsilon, as compressed-tensors gives it.
    scale = torch.where(scale == 0, torch.finfo(weight.dtype).eps, scale)
    # w / scale in the weight's dtype, then rounded: compressed-tensors' `quantize` order.
    ratio = weight.view(rows, cols // group_size, group_size) / scale[:, :, None]
    q = torch.clamp(torch.round(ratio.float()), QMIN, QMAX).to(torch.int8)
    return pack(q.view(rows, cols)), scale


def check(name: str, packed: torch.Tensor, scale: torch.Tensor, shape: tuple[int, int]) -> int:
    """The group size of a checkpoint's (packed, scale) for a weight of `shape`, or
    Int4FormatError naming what does not fit."""
    rows, cols = shape
    if packed.dtype != torch.int32:
        raise Int4FormatError(f"{name}.weight_packed is {packed.dtype}, not int32")
    if tuple(packed.shape) != (rows, -(-cols // PER_WORD)):
        raise Int4FormatError(
            f"{name}.weight_packed has shape {tuple(packed.shape)}, expected "
            f"{(rows, -(-cols // PER_WORD))} for a {rows}x{cols} weight"
        )
    if scale.dim() != 2 or scale.shape[0] != rows or not scale.is_floating_point():
        raise Int4FormatError(
            f"{name}.weight_scale has shape {tuple(scale.shape)} ({scale.dtype}), expected "
            f"({rows}, groups) floating point"
        )
    if cols % PER_WORD or cols % scale.shape[1] or (cols // scale.shape[1]) % PER_WORD:
        raise Int4FormatError(
            f"{name}: {scale.shape[1]} scale groups over {cols} inputs; supported: group "
            f"sizes that are multiples of {PER_WORD} and divide the input width"
        )
    return cols // scale.shape[1]


class Int4Linear(nn.Module):
    """y = x @ (q * scale)^T with the weight kept as int4 (`kernels.linear` multiplies).
    In a layer's block (`int4_blocks`), the weight is values `offset`.. of the block, and
    products that multiply the dequantized weight share the block's one dequantize."""

    packed: torch.Tensor
    scale: torch.Tensor
    block: Int4Block | None

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.bias = None if bias is None else nn.Parameter(bias, requires_grad=False)
        self.out_features = packed.shape[0]
        self.in_features = packed.shape[1] * PER_WORD
        self.block, self.offset = None, 0

    @property
    def int4(self) -> Int4:
        return self.packed, self.scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from engines.pytorch import kernels

        rows = x.reshape(-1, self.in_features)  # transformers passes (batch, tokens, in)
        if self.block is not None and kernels.int4_multiplies_dense(rows):
            n, k = self.out_features, self.in_features
            weight = self.block.dense(rows.dtype)[self.offset : self.offset + n * k].view(n, k)
            y = F.linear(rows, weight)
        else:
            y = kernels.linear(rows, self.int4)
        y = y.view(*x.shape[:-1], self.out_features)
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        group = group_size_of(self.packed, self.scale)
        return f"in={self.in_features}, out={self.out_features}, int4 group {group}"


def embedding(tokens: torch.Tensor, packed: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Rows `tokens` of an int4 table, dequantized: (..., dim) in the scale's dtype."""
    flat = tokens.reshape(-1)
    rows = _dequantized(packed[flat], scale[flat], scale.dtype)
    return rows.view(*tokens.shape, rows.shape[-1])


class Int4Embedding(nn.Module):
    """An embedding table kept as int4; rows are dequantized as they are gathered. Keeps
    the replaced module's `embed_scale` (Gemma's scaled embeddings multiply by it)."""

    packed: torch.Tensor
    scale: torch.Tensor

    def __init__(self, packed: torch.Tensor, scale: torch.Tensor, embed_scale: object = None):
        super().__init__()
        self.register_buffer("packed", packed)
        self.register_buffer("scale", scale)
        self.num_embeddings = packed.shape[0]
        self.embedding_dim = packed.shape[1] * PER_WORD
        if isinstance(embed_scale, torch.Tensor):
            self.register_buffer("embed_scale", embed_scale, persistent=False)
        else:
            self.embed_scale = embed_scale

    @property
    def int4(self) -> Int4:
        return self.packed, self.scale

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        rows = embedding(tokens, self.packed, self.scale)
        if self.embed_scale is None:
            return rows
        return rows * torch.as_tensor(self.embed_scale).to(rows.dtype)


@dataclass(frozen=True)
class QuantizedModule:
    """One module of a model whose weight is int4: its name and kind."""

    name: str
    kind: str  # "linear" or "embedding"
    group_size: int


def value_count(model: nn.Module) -> int:
    """The weight values `model` holds as int4 (8 a packed word), each tensor once: with
    its parameters, the size of the model it was quantized from."""
    packed = {
        (m.packed.data_ptr(), m.packed.numel()): m.packed.numel() * PER_WORD
        for m in model.modules()
        if isinstance(m, (Int4Linear, Int4Embedding))
    }
    return sum(packed.values())


def _parent(model: nn.Module, name: str) -> tuple[nn.Module, str]:
    parent_name, _, child = name.rpartition(".")
    return (model.get_submodule(parent_name) if parent_name else model), child


def install(model: nn.Module, name: str, packed: torch.Tensor, scale: torch.Tensor) -> str:
    """Replace module `name` (nn.Linear or nn.Embedding) by its int4 form, on the
    module's device, the scales in its dtype (the activations'); returns the kind."""
    module = model.get_submodule(name)
    parent, child = _parent(model, name)
    if isinstance(module, nn.Embedding):
        device, dtype = module.weight.device, module.weight.dtype
        replacement: nn.Module = Int4Embedding(
            packed.to(device), scale.to(device, dtype), getattr(module, "embed_scale", None)
        )
        kind = "embedding"
    elif isinstance(module, nn.Linear):
        device, dtype = module.weight.device, module.weight.dtype
        bias = None if module.bias is None else module.bias.detach()
        replacement = Int4Linear(packed.to(device), scale.to(device, dtype), bias)
        kind = "linear"
    else:
        raise Int4FormatError(f"{name} is a {type(module).__name__}, not a Linear or Embedding")
    setattr(parent, child, replacement)
    return kind


def dequantize_into(model: nn.Module, name: str, packed: torch.Tensor, scale: torch.Tensor) -> str:
    """Write q * scale into module `name`'s dense weight (in place, so a tied head that
    shares the tensor follows); returns the kind."""
    module = model.get_submodule(name)
    if not isinstance(module, nn.Linear | nn.Embedding):
        raise Int4FormatError(f"{name} is a {type(module).__name__}, not a Linear or Embedding")
    weight = module.weight
    with torch.no_grad():
        dequantize(packed, scale, weight.dtype, out=weight)
    return "embedding" if isinstance(module, nn.Embedding) else "linear"


def tie_head(model: PreTrainedModel) -> bool:
    """Point a tied LM head at the int4 token embedding (the same packed rows); True if
    it did. Called after the embedding became int4."""
    config = model.config
    tied = bool(getattr(config, "tie_word_embeddings", False)) or bool(
        getattr(config.get_text_config(), "tie_word_embeddings", False)
    )
    embed = model.get_input_embeddings()
    if not tied or not isinstance(embed, Int4Embedding):
        return False
    head = model.get_output_embeddings()
    head_name = next((n for n, m in model.named_modules() if m is head), None)
    if head_name is None:
        return False
    parent, child = _parent(model, head_name)
    setattr(parent, child, Int4Linear(embed.packed, embed.scale, None))
    return True
