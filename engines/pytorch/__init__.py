"""The project's own PyTorch serving engine: an OpenAI-compatible HTTP server over
transformers model classes, with continuous batching and a slot KV cache of its own.

Layout (each module says what it owns):
- `config`: the engine's settings and command line.
- `tokenizer`: the byte-level tokenizer made in code (for `random:<name>` models).
- `model`: loading a model (random, local folder or hub id), dtype and device choice.
- `kv_cache`: the slot KV cache and its attention (row by row, batched, packed prefill).
- `runner`: one model step (prefill of one sequence, decode of a batch) on that cache.
- `graphs`: the CUDA fast path's batch and KV buckets, static inputs and CUDA graphs.
- `fused`: RMSNorm as one fused kernel (the CUDA decode step's largest kernel count).
- `sampling`: sampling parameters and the token choice (greedy, temperature/top-p/top-k).
- `detokenizer`: token ids to streamed text, with stop strings.
- `scheduler`: continuous batching on a dedicated thread.
- `metrics`: Prometheus text exposition.
- `protocol`: the OpenAI request bodies (pydantic) and response shapes.
- `server`: the HTTP layer (Starlette on uvicorn).
- `stepbench`: in-process timing and profile of model steps (no HTTP), with a roofline.

Run: `python -m engines.pytorch --model random:tiny --port 8100`.
"""
