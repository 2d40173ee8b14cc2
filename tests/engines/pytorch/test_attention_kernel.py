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


@pytest.mark.parametrize(
    ("head_dim", "kv_len", "window", "writes_kv"),
    [
        (256, 700, 512, True),
        (512, 640, None, True),
        (256, 130, 512, False),
        (512, 3000, None, True),
    ],
)
def test_the_normed_kernel_matches_the_torch_form_within_its_rounding(
    head_dim: int, kv_len: int, window: int | None, writes_kv: bool
) -> None:
    """From the raw q/k/v row: the output, and the new key and value rows it writes."""
    from engines.pytorch.programs import _normed_attention

    gen = torch.Generator(device="cuda").manual_seed(kv_len)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)

    heads, capacity, position = 8, kv_len + 37, kv_len - 1
    qkv = rand(1, (heads + (2 if writes_kv else 0)) * head_dim) * 2
    # Norm weights of a quarter keep the logits' spread near 1 (scale 1, as Gemma 4's). At
    # full weights it is about 22 at head_dim 512: the softmax is then near an argmax that
    # one rounding of q flips, and the torch form and the kernel (which rounds q once
    # where torch.rms_norm and the rotary round twice) each lose that lottery at times.
    n_q, n_k = rand(head_dim) / 4, rand(head_dim) / 4
    angles = torch.rand(1, head_dim // 2, device="cuda", generator=gen) * 6
    cos = torch.cat([angles.cos()] * 2, dim=-1).to(torch.bfloat16)
    sin = torch.cat([angles.sin()] * 2, dim=-1).to(torch.bfloat16)
    positions = torch.tensor([position], device="cuda")
    k_pool, v_pool = rand(3, 1, capacity, head_dim), rand(3, 1, capacity, head_dim)
    hidden = _hidden(kv_len, window)
    slots = torch.tensor([0], device="cuda")
    forms = {}
    for dtype in (torch.float32, torch.bfloat16):
        pools = (k_pool.to(dtype).clone(), v_pool.to(dtype).clone())  # the torch form writes
        attn = _normed_attention(
            qkv.to(dtype), n_q.to(dtype), n_k.to(dtype), *pools, cos.to(dtype), sin.to(dtype),
            hidden, slots, positions, heads, head_dim, writes_kv, 1.0, 1e-6, "matmul",
        )  # fmt: skip
        forms[dtype] = (attn, *pools)
    exact, (products, k_want, v_want) = forms[torch.float32][0], forms[torch.bfloat16]
    assert attention_kernel.use_normed_kernel(qkv, k_pool, v_pool)
    if writes_kv:  # the kernel attends to the row it makes, never to the pools' stale one
        k_pool[0, :, position] = float("nan")
        v_pool[0, :, position] = float("nan")
    got = attention_kernel.decode_attention_normed(
        qkv, n_q, n_k, cos, sin, positions, k_pool, v_pool, hidden, heads, writes_kv, 1.0, 1e-6
    )
    assert got.shape == products.shape and got.dtype == products.dtype
    assert _error(got, exact) <= max(2 * _error(products, exact), 1e-2)
    if writes_kv:
        for pool, want in ((k_pool, k_want), (v_pool, v_want)):
            assert _error(pool[0, :, position], want[0, :, position].float()) <= 1e-2
            assert torch.equal(pool[1:], want[1:])


def test_the_normed_kernel_serves_a_graphed_step_as_the_separate_one_does() -> None:
    """tiny-gemma4 (sliding and full layers, layers that read an earlier layer's KV) at batch
    1 through CUDA graphs, 24 steps: the normed kernel's logits stay as near the float32
    model's as those of the torch norms and rotary before the plain kernel. The bf16 forms
    drift apart over the steps (each about 0.15 of the largest logit from float32 by the
    24th on an H200), so each is held to float32, not to the other."""
    from engines.pytorch.model import load_model
    from engines.pytorch.runner import ModelRunner

    prompt = [257, *range(40, 70)]  # past tiny-gemma4's 16-token sliding window

    def decode(form: str, dtype: str = "bfloat16") -> torch.Tensor:
        runner = ModelRunner(
            load_model("random:tiny-gemma4", device="cuda", seed=0, dtype=dtype),
            num_slots=2, batch_invariant=False, batched_decode=True, cuda_graphs=True,
            fused_norms=True, decode_program=True, triton_gemv=True, attention_form=form,
        )  # fmt: skip
        runner.prefill(0, prompt)
        steps = [
            runner.decode([0], [60 + k], [len(prompt) + k]).clone() for k in range(24)
        ]  # the same tokens in both: the forms may round a greedy choice apart
        return torch.cat(steps).float()

    normed, separate, exact = decode("normed-kernel"), decode("kernel"), decode("matmul", "float32")
    shown = torch.isfinite(exact)
    for form in (normed, separate):
        assert torch.equal(shown, torch.isfinite(form))
    assert _error(normed[shown], exact[shown]) <= 1.5 * _error(separate[shown], exact[shown])
