"""The slot cache and its attention: writes land in the right slot and position, and each
row's attention equals plain causal (and sliding-window) attention over its own tokens."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engines.pytorch.kv_cache import BatchLayout, SlotKVCache, ragged_attention

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
