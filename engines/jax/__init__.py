"""The project's own JAX serving engine for Gemma 4 text models: the same OpenAI-compatible
HTTP layer as the PyTorch engine (`engines.serving`), over a JAX port of the decoder with
continuous batching over fixed slots and a ladder of shape buckets all compiled before the
server reports healthy.

Layout (each module says what it owns):
- `config`: the engine's settings and command line.
- `model`: Gemma 4's text decoder in jax.numpy/lax, its parameters and the slot KV cache.
- `decode_attention`: a decode step's attention as one Pallas kernel a layer (GPU).
- `runner`: loading, the bucket ladder and its compilation, the steps and token choice.
- `scheduler`: continuous batching on a dedicated thread.
- `server`: load, compile, serve (the HTTP layer is `engines.serving.server`).

Run: `python -m engines.jax --model random:tiny-gemma4 --device cpu --port 8200`.
"""
