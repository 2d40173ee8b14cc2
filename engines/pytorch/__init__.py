"""The project's own PyTorch serving engine: an OpenAI-compatible HTTP server over
transformers model classes, with continuous batching and a slot KV cache of its own. The
HTTP layer, protocol, tokenizer, detokenizer and metrics it shares with the JAX engine
live in `engines.serving`.

Layout (each module says what it owns):
- `config`: the engine's settings and command line.
- `model`: loading a model (random, local folder or hub id), dtype and device choice.
- `kv_cache`: the slot KV cache and its attention (row by row, batched, packed prefill).
- `runner`: one model step (prefill of one sequence, decode of a batch) on that cache.
- `graphs`: the CUDA fast path's batch and KV buckets, static inputs and CUDA graphs.
- `fused`: RMSNorm as one fused kernel (the CUDA decode step's largest kernel count).
- `sampling`: sampling parameters and the token choice (greedy, temperature/top-p/top-k).
- `scheduler`: continuous batching on a dedicated thread.
- `server`: loading, the runner and the scheduler behind the shared HTTP layer.
- `stepbench`: in-process timing and profile of model steps (no HTTP), with a roofline.

Run: `python -m engines.pytorch --model random:tiny --port 8100`.
"""
