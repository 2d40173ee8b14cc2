"""The JAX port's pieces in process: the spec it reads from a Gemma 4 config (which layers
own a cache, which reuse one, the double-wide MLP), the ring's positions, the bucket
ladder, several greedy steps in one call against one step a call, and a clear refusal of
models it does not port."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from engines.jax import model as gemma
from engines.jax.runner import JaxRunner, ladder, load
from engines.serving.random_models import RANDOM_MODELS
from engines.serving.tokenizer import build_byte_tokenizer


def test_spec_of_tiny_gemma4_shares_kv_and_widens_the_shared_mlp() -> None:
    config = RANDOM_MODELS["tiny-gemma4"].build_config(build_byte_tokenizer())
    spec = gemma.spec_from_config(config)
    sliding = [lay.sliding for lay in spec.layers]
    assert sliding == [True, True, False, True, False]
    assert [lay.writes_cache for lay in spec.layers] == [True, True, True, False, False]
    # the shared layers read the last earlier layer of their type
    assert [lay.cache_index for lay in spec.layers] == [0, 1, 2, 1, 2]
    assert [lay.head_dim for lay in spec.layers] == [16, 16, 32, 16, 32]
    assert [lay.intermediate for lay in spec.layers] == [128, 128, 128, 256, 256]
    # proportional RoPE on full layers: a quarter of the angles rotate, the rest do not
    assert np.count_nonzero(spec.rope_full) == 4 and len(spec.rope_full) == 16


def test_ring_positions_hold_the_window() -> None:
    # after writing position 21 into a ring of 8: entries hold 16..21 and 14, 15
    assert gemma.ring_positions(jnp.asarray(21), 8).tolist() == [16, 17, 18, 19, 20, 21, 14, 15]
    # nothing written before position 0
    assert (np.asarray(gemma.ring_positions(jnp.asarray(-1), 8)) < 0).all()
    assert gemma.ring_positions(jnp.asarray(2), 8).tolist()[:3] == [0, 1, 2]


def test_ladder_and_programs() -> None:
    assert ladder(4096, 1024) == [1024, 2048, 4096]
    assert ladder(3000, 1024) == [1024, 2048, 3000]
    loaded = load(
        "random:tiny-gemma4", dtype="float32", device="cpu", seed=0, max_model_len=512,
        served_name=None,
    )
    runner = JaxRunner(loaded, num_slots=2, prefill_buckets=[16, 64], kv_buckets=[32, 128])
    assert runner.kv_buckets == [32, 128, 512]
    assert ("prefill", 64, 32) not in runner.programs()  # a prompt bucket needs KV >= it
    # 8 is more than the slots; 1 row is padded to 2, which XLA compiles as GEMMs
    assert runner.batch_buckets == [2]
    assert len(runner.programs()) == 3 + 3 + 2


def test_greedy_steps_in_one_call_equal_one_step_a_call() -> None:
    loaded = load(
        "random:tiny-gemma4", dtype="float32", device="cpu", seed=0, max_model_len=128,
        served_name=None,
    )
    runner = JaxRunner(
        loaded, num_slots=4, prefill_buckets=[32], kv_buckets=[64], batch_buckets=[4],
        decode_steps=4,
    )
    assert ("steps", 4, 64) in runner.programs()
    runner.compile_all(threads=1)
    prompts = {1: list(range(40, 70)), 3: list(range(80, 91))}  # 30 wraps the 16-ring

    def first_tokens() -> tuple[list[int], list[int], list[int]]:
        slots, tokens, positions = [], [], []
        for slot, ids in prompts.items():
            logits = runner.prefill(slot, ids, 0)
            slots.append(slot)
            tokens.append(int(np.argmax(np.asarray(logits))))
            positions.append(len(ids))
        return slots, tokens, positions

    # one call of 4 steps; slot 3 bans token 65 at its first 2 steps, both ban 66 always
    slots, tokens, positions = first_tokens()
    always, until, left = [[66], [66]], [[66], [65, 66]], [0, 2]
    together = runner.decode_greedy(slots, tokens, positions, always, until, left)
    assert together.shape == (4, 2)
    # the same 4 steps one call each, from the same prefill
    slots, tokens, positions = first_tokens()
    alone = []
    for step in range(4):
        bans = [[66], [65, 66] if step < 2 else [66]]
        _, chosen = runner.decode(slots, tokens, positions, bans)
        alone.append(chosen.tolist())
        tokens = chosen.tolist()
        positions = [p + 1 for p in positions]
    assert together.tolist() == alone
    assert 66 not in together


def test_other_architectures_are_refused_in_one_line() -> None:
    config = RANDOM_MODELS["tiny"].build_config(build_byte_tokenizer())
    with pytest.raises(ValueError, match="serves Gemma 4 text models; this config is 'llama'"):
        gemma.spec_from_config(config)


def test_cli_refuses_a_bad_model_in_one_line() -> None:
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[3]
    argv = [sys.executable, "-m", "engines.jax", "--model", "random:nope", "--device", "cpu"]
    done = subprocess.run(
        argv,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(root)},
    )
    assert done.returncode != 0
    lines = [line for line in done.stderr.splitlines() if "error" in line]
    assert lines == [
        "engines.jax: error: --model: unknown random model random:nope; known: "
        "random:tiny, random:tiny-gemma4, random:gemma-4-e2b"
    ], done.stderr
    assert "Traceback" not in done.stderr
