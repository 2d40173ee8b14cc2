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

The model's forward gets a layout twice: the cache reads it (set before the forward) to
know where to write, and the attention function receives it as the `engine_layout`
keyword argument, which transformers passes through to attention. Three layouts:
- `BatchLayout`: a decode step of any rows in any slots, read row by row (one SDPA call
  per row and layer), so a row's numbers never depend on its neighbours: the CPU path.
- `DecodeLayout`: a decode step over static pools, one batched attention per layer for
  all rows, lengths and sliding windows as tensor masks, no Python value that changes
  between steps: the CUDA path, capturable in a CUDA graph. Row b is slot b (the
  scheduler keeps running sequences in the lowest slots); rows past the real ones are
  padding up to a graph's batch size and write into a scratch slot no sequence owns.
- `PackedLayout`: a prefill of one or more prompt chunks packed into one row, each
  chunk attending only to its own sequence: for short chunks in one call a layer over
  their keys gathered, with a mask (`PACKED_ONE_CALL_MAX_SCORES`), else chunk by chunk.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import AttentionInterface

ENGINE_ATTENTION = "engine_ragged"
# A packed prefill attends in one call a layer, its chunks' keys gathered and a mask
# keeping each query to its own chunk's, while the scores (queries x gathered keys) are
# this many or fewer: a call a chunk and layer was what a prefill of short prompts spent
# its time on, on the host (records: `2026-12-03-h200-int4-residual-epilogue.md`). Past
# it (long chunks, whose own work dwarfs a loop's host time, and whose masked-out scores
# would not fit) one call a chunk.
PACKED_ONE_CALL_MAX_SCORES = 1 << 22


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


@dataclass
class DecodeLayout:
    """A batched decode step over static pools (see the module docstring).

    Only tensors and per-graph constants: `rows` (a batch-size bucket) and `kv_len` (how
    many key positions every row's attention reads, a bucket at least as long as the
    longest real row) are fixed for a captured graph; the tensors are views of static
    input buffers that are refilled before each replay.
    """

    rows: int
    kv_len: int
    slot_index: torch.Tensor  # (rows,) long: where each row's new K/V goes (padding: scratch)
    write_positions: torch.Tensor  # (rows,) long: the new token's position (padding: 0)
    # Masks by sliding window (None: full attention), built once per forward on first use,
    # so that inside a captured graph they are computed by the graph from the buffers.
    masks: dict[int | None, torch.Tensor] = field(default_factory=dict, repr=False)
    q_len: int = 1

    def hidden(self, window: int | None) -> torch.Tensor:
        """`hidden_keys` at this step's positions, built once per forward and window,
        not once per layer."""
        cached = self.masks.get(window)
        if cached is not None:
            return cached
        mask = hidden_keys(self.write_positions, self.kv_len, window)
        self.masks[window] = mask
        return mask


def hidden_keys(write_positions: torch.Tensor, kv_len: int, window: int | None) -> torch.Tensor:
    """(rows, 1, 1, kv_len) bool, True where row b may not look: key k is visible to the
    query at position p = write_positions[b] when k <= p, and k > p - window on sliding
    layers."""
    k_pos = torch.arange(kv_len, device=write_positions.device)[None, :]
    q_pos = write_positions[:, None]
    hidden = k_pos > q_pos
    if window:
        hidden = hidden | (k_pos <= q_pos - window)
    return hidden[:, None, None, :]


@dataclass(frozen=True)
class PackedLayout:
    """A prefill forward of prompt chunks packed into one row of `q_len` tokens: chunk i is
    tokens offsets[i] ... offsets[i] + ends[i] - starts[i] - 1 of the row, at positions
    starts[i] ... ends[i] - 1 of the sequence in `slots[i]`."""

    slots: tuple[int, ...]
    starts: tuple[int, ...]
    ends: tuple[int, ...]
    offsets: tuple[int, ...]
    q_len: int
    # Index tensors and masks, built at a forward's first layer and reused by the others.
    plans: dict[tuple, object] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def build(cls, chunks: list[tuple[int, int, int]]) -> PackedLayout:
        """`chunks`: (slot, start, end) per chunk, in packing order."""
        if not chunks:
            raise ValueError("a packed layout needs at least one chunk")
        if len({slot for slot, _s, _e in chunks}) != len(chunks):
            raise ValueError("a packed layout holds at most one chunk per slot")
        offsets, total = [], 0
        for _slot, start, end in chunks:
            if not 0 <= start < end:
                raise ValueError(f"bad chunk positions {start}..{end}")
            offsets.append(total)
            total += end - start
        return cls(
            slots=tuple(c[0] for c in chunks),
            starts=tuple(c[1] for c in chunks),
            ends=tuple(c[2] for c in chunks),
            offsets=tuple(offsets),
            q_len=total,
        )

    def segments(self) -> list[tuple[int, int, int, int]]:
        """(slot, start, end, offset) per chunk."""
        return list(zip(self.slots, self.starts, self.ends, self.offsets, strict=True))

    def write_index(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """(slot, position) of each token of the packed row: one write a pool."""
        key = ("write", device)
        if key not in self.plans:
            spans = [(slot, start, end) for slot, start, end, _o in self.segments()]
            self.plans[key] = _spans_index(spans, device)
        return self.plans[key]  # type: ignore[return-value]

    def read_plan(
        self, window: int | None, device: torch.device
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The keys every chunk reads, in one index: (slot, position) of each, and the
        mask (q_len, keys) keeping each query to its own chunk's keys, causal and within
        `window`. None past `PACKED_ONE_CALL_MAX_SCORES` (attend chunk by chunk)."""
        key = ("read", window, device)
        if key not in self.plans:
            spans = [
                (slot, _first_key(start, window), end) for slot, start, end, _o in self.segments()
            ]
            keys = sum(end - lo for _s, lo, end in spans)
            plan = None
            if keys * self.q_len <= PACKED_ONE_CALL_MAX_SCORES:
                k_slot, k_pos = _spans_index(spans, device)
                _slots, q_pos = self.write_index(device)
                k_chunk = _chunk_ids([end - lo for _s, lo, end in spans], device)
                q_chunk = _chunk_ids([e - s for _slot, s, e, _o in self.segments()], device)
                mask = (q_chunk[:, None] == k_chunk[None, :]) & (k_pos[None, :] <= q_pos[:, None])
                if window:
                    mask = mask & (k_pos[None, :] > q_pos[:, None] - window)
                plan = (k_slot, k_pos, mask)
            self.plans[key] = plan
        return self.plans[key]  # type: ignore[return-value]


def _first_key(start: int, window: int | None) -> int:
    """The first key a chunk starting at `start` reads: a query at position p sees keys
    p - window + 1 ... p (transformers' convention)."""
    return max(0, start - window + 1) if window else 0


def _spans_index(
    spans: list[tuple[int, int, int]], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """(slot, lo, end) spans -> the slot and position of each of their tokens, in order."""
    slots = [slot for slot, lo, end in spans for _ in range(lo, end)]
    positions = [p for _slot, lo, end in spans for p in range(lo, end)]
    return (
        torch.tensor(slots, dtype=torch.long, device=device),
        torch.tensor(positions, dtype=torch.long, device=device),
    )


def _chunk_ids(lengths: list[int], device: torch.device) -> torch.Tensor:
    return torch.repeat_interleave(
        torch.arange(len(lengths), device=device), torch.tensor(lengths, device=device)
    )


Layout = BatchLayout | DecodeLayout | PackedLayout


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
        scratch_slot: bool = False,
    ) -> None:
        self.num_slots = num_slots
        # One slot past the sequences' own, written by a graph's padding rows and never
        # read by a real row (`DecodeLayout`).
        self.scratch_slot: int | None = num_slots if scratch_slot else None
        self.pool_slots = num_slots + (1 if scratch_slot else 0)
        self.max_len = max_len
        self.device = device
        self.grow = grow
        self.capacity = min(initial_capacity, max_len) if grow else max_len
        self.keys: dict[int, torch.Tensor] = {}
        self.values: dict[int, torch.Tensor] = {}
        self.layout: Layout | None = None

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

    def swap_slots(self, a: int, b: int) -> None:
        """Exchange the contents of two slots in every pool (slot compaction)."""
        if a == b:
            return
        for pools in (self.keys, self.values):
            for pool in pools.values():
                held = pool[a].clone()
                pool[a] = pool[b]
                pool[b] = held

    def clear_slot(self, slot: int) -> None:
        """Zero a slot in every pool. Its next owner never attends to what is left there
        (masked to probability 0), but 0 x NaN is NaN: a sequence whose forward went
        non-finite would otherwise poison the slot for the next one."""
        for pools in (self.keys, self.values):
            for pool in pools.values():
                pool[slot].zero_()

    def nbytes(self) -> int:
        return sum(
            t.numel() * t.element_size() for t in (*self.keys.values(), *self.values.values())
        )

    def allocate(self, layer: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> None:
        """Create a layer's pools now (a decode program reads them before any write)."""
        like = torch.empty(1, kv_heads, 1, head_dim, dtype=dtype, device="meta")
        self._pool(self.keys, layer, like)
        self._pool(self.values, layer, like)

    def _pool(self, pools: dict[int, torch.Tensor], layer: int, like: torch.Tensor) -> torch.Tensor:
        pool = pools.get(layer)
        if pool is None:
            _rows, kv_heads, _q, head_dim = like.shape
            pool = torch.zeros(
                self.pool_slots,
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
        if isinstance(layout, PackedLayout):
            slots, positions = layout.write_index(k_pool.device)
            k_pool[slots, :, positions] = key_states[0].transpose(0, 1)
            v_pool[slots, :, positions] = value_states[0].transpose(0, 1)
        elif layout.q_len == 1:
            # One index_put per pool for the whole batch: no host sync, so a CUDA graph
            # can capture it, and the positions are read from tensors at replay.
            k_pool[layout.slot_index, :, layout.write_positions] = key_states[:, :, 0]
            v_pool[layout.slot_index, :, layout.write_positions] = value_states[:, :, 0]
        else:
            assert isinstance(layout, BatchLayout), "a DecodeLayout writes one token a row"
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
        if not _keeps_grouped_heads(q, k, v, mask, is_causal):
            k, v = _heads_expanded(k, v, q.shape[1])
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=is_causal, scale=scale, enable_gqa=True
        )
    # Logit soft-capping (Gemma 2) has no SDPA kernel: the plain formula.
    k, v = _heads_expanded(k, v, q.shape[1])
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    scores = torch.tanh(scores / softcap) * softcap
    if is_causal:
        n = scores.shape[-1]
        mask = torch.ones(q.shape[2], n, dtype=torch.bool, device=q.device).tril(n - q.shape[2])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(scores.float(), dim=-1).to(v.dtype), v)


def _heads_expanded(
    k: torch.Tensor, v: torch.Tensor, heads: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values (1, KVH, n, D) repeated to `heads` heads, each query head's own."""
    groups = heads // k.shape[1]
    if groups == 1:
        return k, v
    return k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)


# (device, dtype, each tensor's shape and strides, the mask's too, causal) ->
# `_keeps_grouped_heads`: what torch's `can_use_*` checks read. The lengths matter: a fused
# kernel may take a square causal call and not a longer key's (flash refuses causal calls
# whose lengths differ); so do the strides (a fused kernel wants each row contiguous).
_KEEPS_GROUPED: dict[tuple[object, ...], bool] = {}
# A server meets a few lengths a prompt; past this many answers the cache starts over.
_KEEPS_GROUPED_MAX = 4096


def _layout(t: torch.Tensor | None) -> tuple[object, ...] | None:
    return None if t is None else (t.dtype, tuple(t.shape), t.stride())


def _keeps_grouped_heads(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, is_causal: bool
) -> bool:
    """Should this SDPA call pass its grouped heads (KVH < H) as they are? Not where no
    fused kernel takes them grouped and one takes them expanded; always off CUDA.

    Why: with the device's torch (2.11), the calls of Gemma 4's full-attention layers
    (512 wide, one KV head) went to the math backend, which computes in float32: two
    float32 GEMMs a layer, a large share of a packed prefill's device time in a profile
    on an H100 (benchmarks/records/2026-12-07-h100-int4-server-run-time-gates.md).
    Flash and cuDNN do not take heads that wide; torch's memory-efficient kernel takes
    them, but not grouped. transformers' SDPA path expands heads the same way whenever it
    passes a mask. Torch itself is asked (`torch.backends.cuda.can_use_*`), once a shape,
    so a torch whose fused kernels take the grouped call keeps it grouped."""
    if q.device.type != "cuda" or k.shape[1] == q.shape[1]:
        return True
    key = (q.device, q.dtype, *(_layout(t) for t in (q, k, v, mask)), is_causal)
    keeps = _KEEPS_GROUPED.get(key)
    if keeps is None:
        from torch.backends import cuda as backends

        def fused(key_heads: torch.Tensor, value_heads: torch.Tensor) -> bool:
            params = backends.SDPAParams(q, key_heads, value_heads, mask, 0.0, is_causal, True)
            return any(
                can_use(params, False)
                for can_use in (
                    backends.can_use_flash_attention,
                    backends.can_use_efficient_attention,
                    backends.can_use_cudnn_attention,
                )
            )

        keeps = fused(k, v) or not fused(*_heads_expanded(k, v, q.shape[1]))
        if len(_KEEPS_GROUPED) >= _KEEPS_GROUPED_MAX:
            _KEEPS_GROUPED.clear()
        _KEEPS_GROUPED[key] = keeps
    return keeps


def _attend_segment(
    q: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    slot: int,
    start: int,
    end: int,
    window: int | None,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """Queries q (1, H, n, D) at positions start ... end - 1 of the sequence in `slot`,
    over its own keys in the pools: (1, H, n, Dv)."""
    q_len = end - start
    lo = _first_key(start, window)
    k = key[slot : slot + 1, :, lo:end]
    v = value[slot : slot + 1, :, lo:end]
    mask = None
    is_causal = False
    if q_len > 1:
        if lo == 0 and start == 0 and not window:
            is_causal = True
        else:
            q_pos = torch.arange(start, end, device=q.device)[:, None]
            k_pos = torch.arange(lo, end, device=q.device)[None, :]
            mask = k_pos <= q_pos
            if window:
                mask = mask & (k_pos > q_pos - window)
    return _attend(q, k, v, mask, is_causal, scale, softcap)


def _packed_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: PackedLayout,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """A packed row's queries (1, H, q_len, D) over their chunks' keys in the pools:
    (1, q_len, H, Dv). One call for short chunks (`PackedLayout.read_plan`), else one a
    chunk."""
    plan = layout.read_plan(window, query.device)
    if plan is not None:
        slots, positions, mask = plan
        k = key[slots, :, positions].transpose(0, 1)[None]
        v = value[slots, :, positions].transpose(0, 1)[None]
        return _attend(query, k, v, mask, False, scale, softcap).transpose(1, 2).contiguous()
    out = query.new_empty(1, layout.q_len, query.shape[1], value.shape[-1])
    for slot, start, end, offset in layout.segments():
        n = end - start
        o = _attend_segment(
            query[:, :, offset : offset + n], key, value, slot, start, end, window, scale, softcap
        )
        out[0, offset : offset + n] = o[0].transpose(0, 1)
    return out


def batched_decode_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    layout: DecodeLayout,
    scale: float,
    window: int | None,
    softcap: float | None,
) -> torch.Tensor:
    """One decode token per row for the whole batch in a handful of kernels:
    query (rows, H, 1, D), key/value the layer's pools; returns (rows, 1, H, Dv).

    Row b reads slot b's first `kv_len` positions (a view, no copy) and the mask hides
    what it may not see. The H query heads of a row are folded onto its KV heads as
    H/KVH query rows of one matrix product, so grouped-query attention reads each key
    once instead of repeating it per head.

    Hidden positions get probability exactly 0, so stale keys and values there (from an
    earlier sequence in the slot) add exactly nothing, as long as they are finite: a
    NaN written by a broken forward would survive as 0 * NaN.
    """
    rows, heads, _q, head_dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    k = key[:rows, :, : layout.kv_len]  # (rows, KVH, kv_len, D)
    v = value[:rows, :, : layout.kv_len]
    q = query.reshape(rows, kv_heads, groups, head_dim)
    # Four kernels per layer (product, mask, softmax, product): at batch 1 each tiny kernel
    # costs microseconds, so nothing is spent on separate casts. Scores stay in the
    # cache's dtype as in transformers' eager attention; softmax accumulates in float32.
    scores = torch.matmul(q, k.transpose(-1, -2))  # (rows, KVH, G, kv_len)
    if scale != 1.0:
        scores = scores * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    scores = scores.masked_fill_(layout.hidden(window), float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    out = torch.matmul(probs, v)  # (rows, KVH, G, Dv)
    return out.reshape(rows, 1, heads, v.shape[-1])


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
    engine_layout: Layout | None = None,
    **kwargs: object,
) -> tuple[torch.Tensor, None]:
    """Attention over the slot pools: `query` (rows, H, q_len, D), `key`/`value` the layer's
    pools from `SlotKVCache.update`. Returns (rows, q_len, H, Dv).

    With a `BatchLayout`, each row is one SDPA call over exactly its own keys (a window
    of them on sliding layers), so a row's result does not depend on the other rows; the
    loop costs one kernel per row and layer, cheap at CPU batch sizes. A `DecodeLayout`
    goes to `batched_decode_attention` (one call per layer for the batch), a
    `PackedLayout` to `_packed_attention` (one call per layer for short chunks).
    """
    if engine_layout is None:
        raise RuntimeError(f"{ENGINE_ATTENTION} attention needs the engine's batch layout")
    rows, heads, q_len, head_dim = query.shape
    scale = scaling if scaling is not None else 1.0 / math.sqrt(head_dim)
    if isinstance(engine_layout, DecodeLayout):
        out = batched_decode_attention(
            query, key, value, engine_layout, scale, sliding_window, softcap
        )
        return out, None
    if isinstance(engine_layout, PackedLayout):
        out = _packed_attention(query, key, value, engine_layout, scale, sliding_window, softcap)
        return out, None
    out = query.new_empty(rows, q_len, heads, value.shape[-1])
    for b, (slot, length) in enumerate(
        zip(engine_layout.slots, engine_layout.lengths, strict=True)
    ):
        o = _attend_segment(
            query[b : b + 1],
            key,
            value,
            slot,
            length - q_len,
            length,
            sliding_window,
            scale,
            softcap,
        )
        out[b] = o[0].transpose(0, 1)
    return out, None


AttentionInterface.register(ENGINE_ATTENTION, ragged_attention)
