"""The engine's KV cache (one slot per running sequence) and the attention function that
reads it, registered with transformers under `ENGINE_ATTENTION`.

Layout: for each layer that computes keys and values, one K and one V pool of shape
(slots, kv_heads, capacity, head_dim). A running sequence owns one slot; its token at
position p lives at [slot, :, p]. There is no padding inside a sequence and no sharing
between sequences, so the attention of a sequence reads exactly its own keys, in the
same order, whether it decodes alone or beside 63 others. That is what makes batching
leave greedy text unchanged (see `runner` for the matmul half of that guarantee).

Pools are allocated lazily on a layer's first write, from the shapes it writes, so any
architecture works (Gemma 4 has two head sizes, and its KV-sharing layers never write).
On CPU the capacity grows by doubling up to `max_len`; with `grow=False` it is fixed at
`max_len` from the start, the static layout a CUDA-graph decode needs (fixed addresses).

The model's forward gets a `BatchLayout` twice: the cache reads it (set before the
forward) to know where to write, and the attention function receives it as the
`engine_layout` keyword argument, which transformers passes through to attention.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ENGINE_ATTENTION = "engine_ragged"


@dataclass(frozen=True)
class BatchLayout:
    """Where one forward's tokens go.

    Row b is the sequence in slot `slots[b]`; its `q_len` new tokens are the last ones of
    its `lengths[b]` tokens (positions lengths[b] - q_len ... lengths[b] - 1). A decode
    step has q_len 1 and any number of rows; a prefill (chunk) has one row.
    """

    slots: tuple[int, ...]
    lengths: tuple[int, ...]
    q_len: int
    slot_index: torch.Tensor  # (rows,) long, on the cache's device
    write_positions: torch.Tensor  # (rows,) long: where a decode step's token is written

    @classmethod
    def build(
        cls, slots: list[int], lengths: list[int], q_len: int, device: torch.device
    ) -> BatchLayout:
        if len(slots) != len(lengths) or not slots:
            raise ValueError("a batch layout needs one length per slot and at least one row")
        if q_len > 1 and len(slots) != 1:
            raise ValueError("a prefill layout has exactly one row")
        return cls(
            slots=tuple(slots),
            lengths=tuple(lengths),
            q_len=q_len,
            slot_index=torch.tensor(slots, dtype=torch.long, device=device),
            write_positions=torch.tensor([n - 1 for n in lengths], dtype=torch.long, device=device),
        )


class SlotKVCache:
    """Per-slot K/V pools, written through transformers' `past_key_values.update` call."""

    def __init__(
        self,
        num_slots: int,
        max_len: int,
        device: torch.device,
        *,
        initial_capacity: int = 256,
        grow: bool = True,
    ) -> None:
        self.num_slots = num_slots
        self.max_len = max_len
        self.device = device
        self.grow = grow
        self.capacity = min(initial_capacity, max_len) if grow else max_len
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.layout: BatchLayout | None = None

    # transformers asks a cache these; this cache answers for a whole batch of sequences
    # of different lengths, so "seen tokens" has no single value and masks are not built.
    is_compileable = False

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return 0

    def ensure_capacity(self, needed: int) -> None:
        """Make room for `needed` tokens per slot (the longest sequence of the next step)."""
        if needed > self.max_len:
            raise ValueError(f"{needed} tokens exceed the cache's max_len {self.max_len}")
        if needed <= self.capacity:
            return
        new_cap = self.capacity
        while new_cap < needed:  # doubling: a long sequence costs log2 copies, not one a token
            new_cap *= 2
        new_cap = min(self.max_len, new_cap)
        for pools in (self.keys, self.values):
            for layer, old in pools.items():
                new = old.new_zeros(*old.shape[:2], new_cap, old.shape[3])
                new[:, :, : self.capacity] = old
                pools[layer] = new
        self.capacity = new_cap

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values())
        )

    def _pool(self, pools: dict[int, torch.Tensor], layer: int, like: torch.Tensor) -> torch.Tensor:
        pool = pools.get(layer)
        if pool is None:
            _rows, kv_heads, _q, head_dim = like.shape
            pool = torch.zeros(
                self.num_slots,
                kv_heads,
                self.capacity,
                head_dim,
                dtype=like.dtype,
                device=self.device,
            )
            pools[layer] = pool
        return pool

    def update(
        self,
        key_states: torch.Tensor,
        value_states: torch.Tensor,
        layer_idx: int,
        cache_kwargs: dict | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write this step's keys/values (rows, kv_heads, q_len, head_dim) into the slots;
        return the layer's whole pools, which `ragged_attention` reads with the layout."""
        layout = self.layout
        if layout is None:
            raise RuntimeError("SlotKVCache.update called outside a runner step")
        k_pool = self._pool(self.keys, layer_idx, key_states)
        v_pool = self._pool(self.values, layer_idx, value_states)
        if layout.q_len == 1:
            k_pool[layout.slot_index, :, layout.write_positions] = key_states[:, :, 0]
            v_pool[layout.slot_index, :, layout.write_positions] = value_states[:, :, 0]
        else:
            slot, end = layout.slots[0], layout.lengths[0]
            start = end - layout.q_len
            k_pool[slot, :, start:end] = key_states[0]
            v_pool[slot, :, start:end] = value_states[0]
        return k_pool, v_pool


def _attend(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    is_causal: bool,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """One sequence: q (1, H, q_len, D), k/v (1, KVH, n, D) -> (1, H, q_len, Dv)."""
    if softcap is None:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    # Logit soft-capping (Gemma 2) has no SDPA kernel: the plain formula.
    groups = q.shape[1] // k.shape[1]
    k = k.repeat_interleave(groups, dim=1)
    v = v.repeat_interleave(groups, dim=1)
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        n = scores.shape[-1]
        mask = torch.ones(q.shape[2], n, dtype=torch.bool, device=q.device).tril(n - q.shape[2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)


def ragged_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float | None = None,
    dropout: float = 0.0,
    sliding_window: int | None = None,
    softcap: float | None = None,
    engine_layout: BatchLayout | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention of each row over its own slot: `query` (rows, H, q_len, D), `key`/`value`
    the layer's pools from `SlotKVCache.update`. Returns (rows, q_len, H, Dv).

    Each row is one SDPA call over exactly its own keys (a window of them on sliding
    layers), so a row's result does not depend on the other rows. The loop costs one
    kernel per row and layer, cheap at CPU batch sizes; the CUDA path replaces it with
    one batched kernel over the static pools.
    """
    if engine_layout is None:
        raise RuntimeError(f"{ENGINE_ATTENTION} attention needs the engine's batch layout")
    rows, heads, q_len, head_dim = query.shape
    scale = scaling if scaling is not None else 1.0 / math.sqrt(head_dim)
    out = query.new_empty(rows, q_len, heads, value.shape[-1])
    for b, (slot, length) in enumerate(
        zip(engine_layout.slots, engine_layout.lengths, strict=True)
    ):
        start = length - q_len  # absolute position of this row's first query
        # A query at position p sees keys p - window + 1 ... p (transformers' convention).
        lo = max(0, start - sliding_window + 1) if sliding_window else 0
        k = key[slot : slot + 1, :, lo:length]
        v = value[slot : slot + 1, :, lo:length]
        mask = None
        is_causal = False
        if q_len > 1:
            if lo == 0 and start == 0 and not sliding_window:
                is_causal = True
            else:
                q_pos = torch.arange(start, length, device=query.device)[:, None]
                k_pos = torch.arange(lo, length, device=query.device)[None, :]
                mask = k_pos <= q_pos
                if sliding_window:
                    mask = mask & (k_pos > q_pos - sliding_window)
        o = _attend(query[b : b + 1], k, v, mask, is_causal, scale, softcap)
        out[b] = o[0].transpose(0, 1)
    return out, None


AttentionInterface.register(ENGINE_ATTENTION, ragged_attention)
