"""The batch-1 decode attention kernel against the matrix-product form it replaces. Needs a
CUDA device (skipped elsewhere: on CPU the program keeps the products, which
`test_programs` checks against transformers)."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch import attention_kernel
from engines.pytorch.programs import _attend

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _hidden(kv_len: int, window: int | None) -> torch.Tensor:
    keys = torch.arange(kv_len, device="cuda")[None, :]
    position = kv_len - 1
    hidden = keys > position
    if window:
        hidden = hidden | (keys <= position - window)
    return hidden[:, None, None, :]


def _error(got: torch.Tensor, exact: torch.Tensor) -> float:
    return float((got.float() - exact).abs().max() / exact.abs().max())


@pytest.mark.parametrize(
    ("head_dim", "kv_len", "window"),
    [(256, 1, 512), (256, 130, 512), (256, 700, 512), (512, 640, None), (512, 3000, None)],
)
def test_kernel_matches_the_products_within_their_rounding(
    head_dim: int, kv_len: int, window: int | None
) -> None:
    gen = torch.Generator(device="cuda").manual_seed(kv_len)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    capacity = kv_len + 37
    q, k_pool, v_pool = (
        rand(1, 1, 8, head_dim),
        rand(3, 1, capacity, head_dim),
        rand(3, 1, capacity, head_dim),
    )
    hidden = _hidden(kv_len, window)
    keys, values = k_pool[:1, :, :kv_len], v_pool[:1, :, :kv_len]
    exact = _attend(q.float(), keys.float(), values.float(), hidden, 1.0, False)
    products = _attend(q, keys, values, hidden, 1.0, False)
    assert attention_kernel.use_kernel(q, k_pool)
    got = attention_kernel.decode_attention(q, k_pool, v_pool, hidden, 1.0)
    assert got.shape == products.shape and got.dtype == products.dtype
    assert _error(got, exact) <= max(2 * _error(products, exact), 1e-2)


def test_kernel_replays_in_a_cuda_graph_on_new_keys() -> None:
    gen = torch.Generator(device="cuda").manual_seed(1)
    q = torch.randn(1, 1, 8, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    k_pool = torch.randn(2, 1, 300, 256, device="cuda", dtype=torch.bfloat16, generator=gen)
    v_pool = torch.randn_like(k_pool)
    hidden = _hidden(200, 512)
    attention_kernel.decode_attention(q, k_pool, v_pool, hidden, 1.0)  # compile first
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention_kernel.decode_attention(q, k_pool, v_pool, hidden, 1.0)
    for scale in (1.0, -0.5):
        k_pool.mul_(scale)
        graph.replay()
        torch.cuda.synchronize()
        expected = attention_kernel.decode_attention(q, k_pool, v_pool, hidden, 1.0)
        assert torch.equal(out, expected)
