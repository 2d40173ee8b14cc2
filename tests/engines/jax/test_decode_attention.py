"""The Pallas decode-attention kernel (in Pallas's interpreter on this CPU) against the
XLA path it replaces: the same outputs for rows that see none, some, or all of their
cache, over split and unsplit KV lengths; and the same greedy text through the runner."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from engines.jax import decode_attention as kernel
from engines.jax import model as gemma
from engines.jax.runner import JaxRunner, load, resolve_attention


def _reference(
    q: jax.Array, ck: jax.Array, cv: jax.Array, slots: jax.Array, visible: jax.Array, length: int
) -> jax.Array:
    keys, values = ck[slots, :length], cv[slots, :length]
    mask = jnp.arange(length)[None, :] < visible[:, None]
    return gemma._attend(q[:, None], keys, values, mask[:, None])[:, 0]


@pytest.mark.parametrize(
    ("rows", "heads", "kv_heads", "d", "cache_len", "length"),
    [
        (2, 8, 1, 32, 64, 64),  # splits of the length (few rows)
        (4, 4, 2, 16, 48, 16),  # a ring of 16 in a longer array; two KV heads
        (64, 4, 1, 16, 32, 32),  # enough rows: one split
    ],
)
@pytest.mark.parametrize("min_query_rows", [16, 1])  # padded to the tensor cores, or not
def test_kernel_matches_the_xla_path(
    rows: int, heads: int, kv_heads: int, d: int, cache_len: int, length: int,
    min_query_rows: int, monkeypatch: pytest.MonkeyPatch,
) -> None:  # fmt: skip
    monkeypatch.setattr(kernel, "MIN_QUERY_ROWS", min_query_rows)
    rng = np.random.default_rng(rows + d)
    num_slots = rows + 3
    q = jnp.asarray(rng.standard_normal((rows, heads, d)), jnp.float32)
    shape = (num_slots, cache_len, kv_heads, d)
    ck = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    cv = jnp.asarray(rng.standard_normal(shape), jnp.float32)
    slots = rng.permutation(num_slots)[:rows].astype(np.int32)
    visible = rng.integers(1, length + 1, rows).astype(np.int32)
    visible[0] = 0  # a padding row: its slot is past the last
    slots[0] = num_slots
    visible[-1] = length
    assert kernel.supported(length, d, heads // kv_heads)
    got = kernel.decode_attention(
        q, ck, cv, jnp.asarray(slots), jnp.asarray(visible), length=length, interpret=True
    )
    clamped = jnp.minimum(jnp.asarray(slots), num_slots - 1)
    want = _reference(q, ck, cv, clamped, jnp.asarray(visible), length)
    assert got.shape == (rows, heads * d)
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=2e-5, atol=2e-5)
    assert not np.asarray(got[0]).any()


def test_what_the_kernel_does_not_take() -> None:
    assert not kernel.supported(24, 16, 4)  # no power-of-two block of 16 or more tiles 24
    assert not kernel.supported(64, 24, 4)  # head size not a power of two
    assert not kernel.supported(64, 16, 24)  # 24 query heads a KV head: no power-of-two tile


def test_the_runner_decodes_the_same_greedy_text_either_way() -> None:
    loaded = load(
        "random:tiny-gemma4", dtype="float32", device="cpu", seed=0, max_model_len=64,
        served_name=None,
    )  # fmt: skip
    prompt = [(7 * i) % 200 + 10 for i in range(20)]  # past the window of 16: the ring wraps
    texts = []
    for attention in ("xla", "pallas"):
        runner = JaxRunner(
            loaded, num_slots=4, prefill_buckets=[32], kv_buckets=[64],
            batch_buckets=[1], decode_steps=4, decode_attention=attention,
        )  # fmt: skip
        with jax.default_device(loaded.device):
            runner.compile_all(threads=2)
            logits = runner.prefill(1, prompt, 0)
            token = int(np.argmax(np.asarray(logits)))
            out = [token]
            for step in range(3):
                at = len(prompt) + 4 * step
                tokens = runner.decode_greedy([1], [out[-1]], [at], [[]], [[]], [0])
                out += [int(t) for t in tokens[:, 0]]
        texts.append(out)
    assert runner.attention == "pallas-interpret"
    assert texts[0] == texts[1]


class _Device:
    """What `resolve_attention` reads of a `jax.Device` (no GPU here)."""

    def __init__(self, platform: str, compute_capability: str = "") -> None:
        self.platform = platform
        self.compute_capability = compute_capability


@pytest.mark.parametrize(
    ("spec", "device", "resolved"),
    [
        ("auto", _Device("gpu", "9.0"), "pallas"),
        ("auto", _Device("gpu", "7.5"), "xla"),  # Turing: 64 KB of shared memory a block
        ("auto", _Device("cpu"), "xla"),
        ("pallas", _Device("cpu"), "pallas-interpret"),
        ("xla", _Device("gpu", "9.0"), "xla"),
    ],
)
def test_auto_attention_is_the_kernel_on_sm80_and_newer(
    spec: str, device: _Device, resolved: str
) -> None:
    assert resolve_attention(spec, device) == resolved


def test_an_unknown_attention_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="--decode-attention: 'flash'"):
        resolve_attention("flash", _Device("cpu"))
