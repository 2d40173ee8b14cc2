"""What the project's own engines share: the OpenAI-compatible HTTP layer and everything
about a request that does not depend on how the model runs.

Layout (each module says what it owns):
- `requests`: the request, sampling parameters and per-token output records that pass
  between the HTTP layer and an engine's scheduler.
- `protocol`: the OpenAI request bodies (pydantic) and response shapes.
- `server`: the HTTP layer (Starlette on uvicorn) and the interface an engine plugs in with.
- `batching`: the model-independent half of both engines' schedulers: the thread, inbox
  and outbox, the batch's queues, and how a request ends.
- `tokenizer`: the byte-level tokenizer made in code (for `random:<name>` models).
- `random_models`: the configs of the `random:<name>` models.
- `detokenizer`: token ids to streamed text, with stop strings.
- `metrics`: Prometheus text exposition.

Engines: `engines.pytorch` (transformers model classes, CUDA graphs and kernels of its
own) and `engines.jax` (a JAX port of Gemma 4's decoder).
"""
