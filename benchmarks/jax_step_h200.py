"""What sets the JAX engine's batch-1 decode step on a GPU, measured in process (no HTTP):
the engine's own compiled decode program for `random:gemma-4-e2b` at batch 1 and KV 1024,
timed three ways over the same steps:

- `synced`: the host reads each step's greedy token before queueing the next (what the
  scheduler does);
- `chained`: each step is fed the previous step's token on the device and the host waits
  only at the end (the device's own pace, host dispatch hidden if it is faster);
- `dispatch`: a program that takes the same arguments (every weight and the cache) and
  does nothing with them: the host's cost of handing ~630 arrays to a call.

    python -m benchmarks.jax_step_h200 OUT_DIR [MODEL]   (MODEL: random:tiny-gemma4 for a
                                                          dry run on CPU)
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from engines.jax.runner import JaxRunner, load

STEPS = 100


def main() -> int:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    loaded = load(
        sys.argv[2] if len(sys.argv) > 2 else "random:gemma-4-e2b",
        dtype="bfloat16",
        device="auto", seed=0, max_model_len=1024,
        served_name=None,
    )
    runner = JaxRunner(loaded, num_slots=1, prefill_buckets=[128], kv_buckets=[1024],
                       batch_buckets=[1])
    program = runner.compile_program("decode", 1, 1024)
    result: dict[str, float | int | str] = {"load_compile_s": time.monotonic() - t0}
    params, bias = loaded.params, runner.bias
    leaves = len(jax.tree_util.tree_leaves((params, runner.cache)))
    result["argument_arrays"] = leaves
    tokens = np.array([65], np.int32)
    positions = np.array([600], np.int32)
    slots = np.array([0], np.int32)
    banned = np.full((1, 8), loaded.spec.vocab_size, np.int32)
    cache = runner.cache
    for _ in range(5):
        cache, _, greedy = program(params, cache, tokens, positions, slots, bias, banned)
    np.asarray(greedy)
    t = time.perf_counter()
    for _ in range(STEPS):
        cache, _, greedy = program(params, cache, tokens, positions, slots, bias, banned)
        np.asarray(greedy)
    result["synced_ms"] = 1e3 * (time.perf_counter() - t) / STEPS
    token_dev = jnp.asarray(tokens)
    t = time.perf_counter()
    for _ in range(STEPS):
        cache, _, greedy = program(params, cache, token_dev, positions, slots, bias, banned)
        token_dev = greedy.astype(jnp.int32)
    jax.block_until_ready(token_dev)
    result["chained_ms"] = 1e3 * (time.perf_counter() - t) / STEPS

    def nothing(p: object, c: object, x: jax.Array) -> jax.Array:
        return x + 1

    idle = jax.jit(nothing).lower(params, cache, token_dev).compile()
    for _ in range(5):
        y = idle(params, cache, token_dev)
    jax.block_until_ready(y)
    t = time.perf_counter()
    for _ in range(STEPS):
        y = idle(params, cache, token_dev)
    jax.block_until_ready(y)
    result["dispatch_ms"] = 1e3 * (time.perf_counter() - t) / STEPS
    hlo = program.as_text() or ""
    result["hlo_fusions"] = hlo.count("kind=k")
    result["hlo_custom_calls"] = hlo.count("custom-call(")
    result["jax"] = jax.__version__
    (out / "step.json").write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
