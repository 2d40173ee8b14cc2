"""The slot cache and its attention: writes land in the right slot and position, and each
row's attention equals plain causal (and sliding-window) attention over its own tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from engines.pytorch import kv_cache
from engines.pytorch.kv_cache import (
    PACKED_ONE_CALL_MAX_SCORES,
    BatchLayout,
    DecodeLayout,
    PackedLayout,
    SlotKVCache,
    ragged_attention,
)

CPU = torch.device("cpu")


def _reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, window: int | None
) -> torch.Tensor:
    """Full-sequence attention for one sequence: q (H, n, D), k/v (KVH, n, D)."""
    n = q.shape[1]
    pos = torch.arange(n)
    mask = pos[None, :] <= pos[:, None]
    if window:
        mask &= pos[None, :] > pos[:, None] - window
    return F.scaled_dot_product_attention(
        q[None], k[None], v[None], attn_mask=mask, enable_gqa=True
    )[0]


def test_layout_rejects_bad_shapes() -> None:
    with pytest.raises(ValueError):
        BatchLayout.build([0, 1], [3], 1, CPU)
    with pytest.raises(ValueError):
        BatchLayout.build([0, 1], [3, 4], 2, CPU)


@pytest.mark.parametrize("window", [None, 4])
def test_prefill_then_decode_matches_full_attention(window: int | None) -> None:
    torch.manual_seed(0)
    heads, kv_heads, dim, n = 4, 2, 8, 11
    cache = SlotKVCache(num_slots=3, max_len=32, device=CPU, initial_capacity=4)
    seqs = {
        slot: (
            torch.randn(heads, n, dim),
            torch.randn(kv_heads, n, dim),
            torch.randn(kv_heads, n, dim),
        )
        for slot in (2, 0)
    }
    outputs: dict[int, list[torch.Tensor]] = {s: [] for s in seqs}
    prompt = 6
    cache.ensure_capacity(prompt)
    for slot, (q, k, v) in seqs.items():  # prefill the first `prompt` tokens of each
        layout = BatchLayout.build([slot], [prompt], prompt, CPU)
        cache.layout = layout
        kp, vp = cache.update(k[None, :, :prompt], v[None, :, :prompt], layer_idx=0)
        out, _ = ragged_attention(
            None, q[None, :, :prompt], kp, vp, None, sliding_window=window, engine_layout=layout
        )  # type: ignore[arg-type]
        outputs[slot].append(out[0].transpose(0, 1))
    for t in range(prompt, n):  # decode both together, one token a step
        cache.ensure_capacity(t + 1)
        slots = list(seqs)
        layout = BatchLayout.build(slots, [t + 1] * 2, 1, CPU)
        cache.layout = layout
        q = torch.stack([seqs[s][0][:, t : t + 1] for s in slots])
        k = torch.stack([seqs[s][1][:, t : t + 1] for s in slots])
        v = torch.stack([seqs[s][2][:, t : t + 1] for s in slots])
        kp, vp = cache.update(k, v, layer_idx=0)
        out, _ = ragged_attention(
            None, q, kp, vp, None, sliding_window=window, engine_layout=layout
        )  # type: ignore[arg-type]
        for row, s in enumerate(slots):
            outputs[s].append(out[row].transpose(0, 1))
    assert cache.capacity >= n
    for slot, (q, k, v) in seqs.items():
        got = torch.cat(outputs[slot], dim=1)
        torch.testing.assert_close(got, _reference(q, k, v, window), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(cache.keys[0][slot, :, :n], k)
    assert torch.count_nonzero(cache.keys[0][1]) == 0  # the unused slot stayed empty


def test_capacity_is_bounded() -> None:
    cache = SlotKVCache(num_slots=1, max_len=16, device=CPU, initial_capacity=4)
    cache.ensure_capacity(9)
    assert cache.capacity == 16
    with pytest.raises(ValueError, match="max_len"):
        cache.ensure_capacity(17)
    static = SlotKVCache(num_slots=1, max_len=16, device=CPU, grow=False)
    assert static.capacity == 16


def _decode_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    window: int | None,
    scale: float,
    softcap: float | None,
) -> torch.Tensor:
    """The last position's attention over n keys in float64: q (H, D), k/v (KVH, n, D)."""
    groups = q.shape[0] // k.shape[0]
    k = k.double().repeat_interleave(groups, dim=0)
    v = v.double().repeat_interleave(groups, dim=0)
    n = k.shape[1]
    scores = torch.einsum("hd,hnd->hn", q.double(), k) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if window:
        scores[:, : max(0, n - window)] = float("-inf")
    return torch.einsum("hn,hnd->hd", torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize(
    ("window", "softcap", "kv_heads"), [(None, None, 2), (5, None, 1), (3, 20.0, 4), (None, 8.0, 1)]
)
def test_batched_decode_attention_matches_reference(
    window: int | None, softcap: float | None, kv_heads: int
) -> None:
    """Rows of different lengths (some past the window, one of length 1) plus padding rows,
    each equal to its own attention; padding writes only into the scratch slot."""
    gen = torch.Generator().manual_seed(1)
    heads, dim, capacity, real = 4, 8, 32, 5
    rows = 8  # a bucket: rows 5..7 are padding
    lengths = [1, 7, 12, 3, 20]
    cache = SlotKVCache(num_slots=rows, max_len=capacity, device=CPU, grow=False, scratch_slot=True)
    assert cache.scratch_slot == rows
    keys = [torch.randn(kv_heads, n, dim, generator=gen) for n in lengths]
    values = [torch.randn(kv_heads, n, dim, generator=gen) for n in lengths]
    # The first n - 1 tokens of each row were written before (by prefill or earlier steps).
    earlier = [(slot, 0, n - 1) for slot, n in enumerate(lengths) if n > 1]
    cache.layout = PackedLayout.build(earlier)
    cache.update(
        torch.cat([keys[s][None, :, :e] for s, _b, e in earlier], dim=2),
        torch.cat([values[s][None, :, :e] for s, _b, e in earlier], dim=2),
        0,
    )
    # Positions a row may not see hold large stale values (finite, as everything a model
    # writes is): any leak of them into a row's result would show.
    garbage = 1e3 * torch.randn(cache.pool_slots, kv_heads, capacity, dim, generator=gen)
    for pool in (cache.keys[0], cache.values[0]):
        written = pool.clone()
        pool.copy_(garbage)
        for slot, n in enumerate(lengths):
            pool[slot, :, : n - 1] = written[slot, :, : n - 1]
    positions = [n - 1 for n in lengths] + [0] * (rows - real)
    slots = list(range(real)) + [rows] * (rows - real)
    kv_len = 32
    layout = DecodeLayout(
        rows=rows,
        kv_len=kv_len,
        slot_index=torch.tensor(slots),
        write_positions=torch.tensor(positions),
    )
    cache.layout = layout
    new_k = torch.stack([k[:, -1:] for k in keys] + [torch.randn(kv_heads, 1, dim)] * (rows - real))
    new_v = torch.stack(
        [v[:, -1:] for v in values] + [torch.randn(kv_heads, 1, dim)] * (rows - real)
    )
    kp, vp = cache.update(new_k, new_v, 0)
    q = torch.randn(rows, heads, 1, dim, generator=gen)
    scale = 0.3
    out, _ = ragged_attention(
        None,  # type: ignore[arg-type]
        q,
        kp,
        vp,
        None,
        scaling=scale,
        sliding_window=window,
        softcap=softcap,
        engine_layout=layout,
    )
    assert out.shape == (rows, 1, heads, dim)
    for b in range(real):
        expected = _decode_reference(q[b, :, 0], keys[b], values[b], window, scale, softcap)
        torch.testing.assert_close(out[b, 0].double(), expected, rtol=1e-5, atol=1e-5)
    # Padding wrote into the scratch slot, not into a real or a free slot.
    torch.testing.assert_close(kp[rows, :, 0], new_k[-1, :, 0])
    torch.testing.assert_close(kp[real:rows, :, 0], garbage[real:rows, :, 0])


def test_batched_decode_equals_row_by_row() -> None:
    """The batched path and the row-by-row path agree on the same pools."""
    gen = torch.Generator().manual_seed(2)
    heads, kv_heads, dim, capacity = 4, 2, 8, 64
    lengths = [9, 30, 2]
    cache = SlotKVCache(num_slots=3, max_len=capacity, device=CPU, grow=False, scratch_slot=True)
    cache.layout = PackedLayout.build([(s, 0, n - 1) for s, n in enumerate(lengths)])
    total = sum(n - 1 for n in lengths)
    cache.update(
        torch.randn(1, kv_heads, total, dim, generator=gen),
        torch.randn(1, kv_heads, total, dim, generator=gen),
        0,
    )
    k_new = torch.randn(3, kv_heads, 1, dim, generator=gen)
    v_new = torch.randn(3, kv_heads, 1, dim, generator=gen)
    q = torch.randn(3, heads, 1, dim, generator=gen)
    outs = []
    for layout in (
        BatchLayout.build([0, 1, 2], lengths, 1, CPU),
        DecodeLayout(
            rows=3,
            kv_len=64,
            slot_index=torch.arange(3),
            write_positions=torch.tensor([n - 1 for n in lengths]),
        ),
    ):
        cache.layout = layout
        kp, vp = cache.update(k_new, v_new, 0)
        out, _ = ragged_attention(None, q, kp, vp, None, sliding_window=8, engine_layout=layout)  # type: ignore[arg-type]
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(
    "max_scores", [PACKED_ONE_CALL_MAX_SCORES, 0], ids=["one call", "by chunk"]
)
def test_packed_prefill_equals_one_sequence_at_a_time(
    max_scores: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Packed chunks attend, in one call a layer or chunk by chunk, as each would alone."""
    monkeypatch.setattr(kv_cache, "PACKED_ONE_CALL_MAX_SCORES", max_scores)
    gen = torch.Generator().manual_seed(3)
    heads, kv_heads, dim = 4, 2, 8
    chunks = [(2, 0, 6), (0, 4, 9), (1, 0, 1)]  # (slot, start, end); slot 0 has 4 earlier
    layout = PackedLayout.build(chunks)
    assert layout.offsets == (0, 6, 11) and layout.q_len == 12
    packed = SlotKVCache(num_slots=3, max_len=16, device=CPU, initial_capacity=16)
    single = SlotKVCache(num_slots=3, max_len=16, device=CPU, initial_capacity=16)
    earlier_k = torch.randn(1, kv_heads, 4, dim, generator=gen)
    earlier_v = torch.randn(1, kv_heads, 4, dim, generator=gen)
    for cache in (packed, single):
        cache.layout = PackedLayout.build([(0, 0, 4)])
        cache.update(earlier_k, earlier_v, 0)
    q = torch.randn(1, heads, 12, dim, generator=gen)
    k = torch.randn(1, kv_heads, 12, dim, generator=gen)
    v = torch.randn(1, kv_heads, 12, dim, generator=gen)
    packed.layout = layout
    kp, vp = packed.update(k, v, 0)
    got, _ = ragged_attention(None, q, kp, vp, None, sliding_window=3, engine_layout=layout)  # type: ignore[arg-type]
    for slot, start, end, off in layout.segments():
        n = end - start
        one = BatchLayout.build([slot], [end], n, CPU)
        single.layout = one
        ks, vs = single.update(k[:, :, off : off + n], v[:, :, off : off + n], 0)
        want, _ = ragged_attention(
            None, q[:, :, off : off + n], ks, vs, None, sliding_window=3, engine_layout=one
        )  # type: ignore[arg-type]
        torch.testing.assert_close(got[:, off : off + n], want)
    torch.testing.assert_close(packed.keys[0], single.keys[0])
    with pytest.raises(ValueError, match="one chunk per slot"):
        PackedLayout.build([(0, 0, 2), (0, 2, 4)])


def test_swap_slots_exchanges_every_pool() -> None:
    cache = SlotKVCache(num_slots=3, max_len=8, device=CPU, grow=False)
    cache.layout = PackedLayout.build([(0, 0, 2), (2, 0, 3)])
    k = torch.randn(1, 1, 5, 4)
    for layer in (0, 1):
        cache.update(k, k * 2, layer)
    before = {layer: cache.keys[layer].clone() for layer in (0, 1)}
    cache.swap_slots(0, 2)
    for layer in (0, 1):
        torch.testing.assert_close(cache.keys[layer][0], before[layer][2])
        torch.testing.assert_close(cache.keys[layer][2], before[layer][0])
        torch.testing.assert_close(cache.values[layer][0], 2 * before[layer][2])


@pytest.mark.parametrize(("heads", "kv_heads"), [(8, 1), (8, 2)])
@pytest.mark.parametrize("causal", [False, True])
def test_expanded_heads_attend_as_grouped_heads(heads: int, kv_heads: int, causal: bool) -> None:
    # `_attend` expands grouped heads where only that reaches a fused kernel (CUDA): each
    # query head must still read its own group's keys, as enable_gqa's grouping does.
    gen = torch.Generator().manual_seed(heads + kv_heads)
    q = torch.randn(1, heads, 24, 32, generator=gen)
    k = torch.randn(1, kv_heads, 24, 32, generator=gen)
    v = torch.randn(1, kv_heads, 24, 16, generator=gen)
    pos = torch.arange(24)
    mask = None if causal else (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - 5)
    grouped = F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=True
    )
    expanded = F.scaled_dot_product_attention(
        q, *kv_cache._heads_expanded(k, v, heads), attn_mask=mask, is_causal=causal
    )
    torch.testing.assert_close(expanded, grouped)
    assert kv_cache._keeps_grouped_heads(q, k, v, mask, causal)  # off CUDA: as they are


def _fused_backends() -> list[SDPBackend]:
    """SDPA's fused kernels: inside `sdpa_kernel` of these, a call that would fall to the
    math backend raises."""
    return [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("causal", [False, True])
def test_wide_grouped_heads_reach_a_fused_kernel_on_cuda(causal: bool) -> None:
    # Gemma 4's full-attention layers (8 query heads 512 wide over one KV head): `_attend`
    # runs them with the math backend turned off, so a call that would have fallen to it
    # (float32 GEMMs) raises; and it agrees with float32 attention to bf16 rounding.
    gen = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(1, 8, 256, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    k = torch.randn(1, 1, 256, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    v = torch.randn(1, 1, 256, 512, device="cuda", dtype=torch.bfloat16, generator=gen)
    pos = torch.arange(256, device="cuda")
    mask = None if causal else (pos[None, :] <= pos[:, None])
    with sdpa_kernel(_fused_backends()):
        out = kv_cache._attend(q, k, v, mask, causal, 512**-0.5, None)
    exact = F.scaled_dot_product_attention(
        q.float(), k.float(), v.float(), attn_mask=mask, is_causal=causal, scale=512**-0.5,
        enable_gqa=True,
    )  # fmt: skip
    torch.testing.assert_close(out.float(), exact, atol=2e-2, rtol=2e-2)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("lengths", [[(64, 64), (16, 64)], [(16, 64), (64, 64)]])
def test_each_length_of_grouped_heads_is_asked_for_on_its_own(
    lengths: list[tuple[int, int]],
) -> None:
    # Flash takes a square causal call with grouped heads and refuses one whose key is
    # longer than its queries: the answer for one must not be reused for the other, in
    # either order, or the second call falls to the math backend (here: raises).
    kv_cache._KEEPS_GROUPED.clear()
    gen = torch.Generator(device="cuda").manual_seed(7)
    for q_len, k_len in lengths:
        q = torch.randn(1, 8, q_len, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, 1, k_len, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, 1, k_len, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
        with sdpa_kernel(_fused_backends()):
            out = kv_cache._attend(q, k, v, None, True, 256**-0.5, None)
        assert out.shape == (1, 8, q_len, 256)
