"""Scripted reference streaming server: the ground truth our client's metrics are checked against.

This module owns a small OpenAI-compatible HTTP/1.1 server written directly on asyncio's
Protocol API (no web framework), whose every response is scripted: each completion sends
exactly ``max_tokens`` tokens on a schedule fixed by a *pace* (time to first token, gap
between chunks, tokens per chunk, where usage goes, reasoning and role chunks), and every
chunk's write time is recorded. Tests and the client-capacity benchmark compare what a
load generator measured against those records.

What it speaks
- HTTP/1.1 keep-alive (many requests per connection, served in order), ``Content-Length``
  request bodies, streamed responses with ``Transfer-Encoding: chunked`` (one SSE event per
  HTTP chunk, as uvicorn/vLLM and llama.cpp send them), plain JSON with ``Content-Length``.
- ``POST /v1/chat/completions`` and ``POST /v1/completions`` (``stream``,
  ``stream_options.include_usage``, ``max_tokens`` / ``max_completion_tokens``), ``GET
  /health``, ``GET /v1/models``, ``POST /tokenize`` and ``POST /detokenize`` (byte-level),
  ``GET /ground_truth`` and ``POST /ground_truth/reset``.

Token accounting (the rules tests rely on)
- A token on the way out is the fixed piece ``"tok "``; a chunk carries ``tokens_per_chunk``
  of them, so ``usage.completion_tokens == max_tokens`` always (reasoning tokens included).
- Tokenizer: one token per UTF-8 byte. Completions: ``prompt_tokens`` = UTF-8 bytes of the
  prompt. Chat: the message contents joined with ``"\\n"``, as UTF-8 bytes, plus
  ``CHAT_TEMPLATE_OVERHEAD`` (8) tokens, which ``/tokenize`` with ``messages`` returns as
  ids 256..263 (4 before the text, 4 after).
- ``max_completion_tokens`` wins over ``max_tokens``; absent both, ``DEFAULT_MAX_TOKENS``.
  ``prompt_tokens + max_tokens > max_model_len`` is a 400 phrased as vLLM phrases it.

Pace (CLI flags; per request, an optional body field ``"x_pace": {...}`` overrides them)
- ``ttft_ms``: request parsed -> first token chunk. ``itl_ms``: gap between token chunks.
  Chunk ``i`` (0-based, token chunks only) is due at ``t_recv + ttft + i * itl``: absolute
  deadlines, so lateness never accumulates. A chunk is never sent before its deadline; the
  event loop's 1 ms timer granularity makes it up to about 1 ms late.
- ``itl_ms = 0`` is flat out: after the first token everything is due at once and goes out
  ``flat_batch`` chunks per socket write (default 16; all of them stamped with that write's
  time), yielding to the other streams after each write. One write per chunk
  (``flat_batch=1``) caps the server's chunk rate at many streams on a small machine,
  because every loopback send() has its cost; batches raise it several times
  (``python -m benchmarks.reference_server_rate`` measures it).
- ``tokens_per_chunk`` (speculative decoding look-alike), ``usage_mode``: ``separate`` (a
  ``choices: []`` chunk before ``[DONE]``, only when ``include_usage`` is asked, as vLLM),
  ``in_last_chunk`` (usage on the finish_reason chunk, always, as old llama.cpp), ``none``.
- ``reasoning_tokens`` K (chat only): the first K tokens go out as
  ``delta.reasoning_content``; chunks never mix the two kinds.
- ``role_chunk`` (chat only): a ``{"role":"assistant","content":""}`` chunk right away, in
  the same write as the response headers.
- ``finish_on_last_token``: ``finish_reason`` rides on the last token chunk (vLLM) instead
  of a separate empty-delta chunk (OpenAI, llama.cpp).

Faults, triggered by a marker in the prompt text (``FAULT:<name>``): ``500``, ``429``,
``400`` (JSON error ``{"error": {"message", "type", "code"}}``), ``context`` (400 with
vLLM's context-length message), ``nostream`` (a plain JSON completion although a stream was
asked), ``badsse`` (a malformed ``data:`` line after ``fault_after`` token chunks, then the
stream goes on), ``disconnect`` (connection closed after ``fault_after`` token chunks),
``stall`` (nothing more after ``fault_after`` token chunks; the connection stays open until
the client leaves or ``stall_s`` passes).

Ground truth: per completion request ``id`` (also the chunks' ``id`` and the
``x-request-id`` response header), the client's ``x-request-id`` header if any, the first 96
characters of the prompt (the nonce, for matching), ``t_recv_ns`` (``time.perf_counter_ns()``
once the request's bytes are all in and its HTTP head is parsed, before the JSON body is
decoded; CLOCK_MONOTONIC on Linux, shared by all processes) and per chunk ``(t_write_ns,
tokens, kind)``, ``t_write_ns`` taken just before ``transport.write``. Kinds: ``role``,
``reasoning``, ``content``, ``finish``, ``usage``, ``done``, ``badsse``, ``body`` (whole
non-streamed response), ``error``; the bare response head is ``t_headers_ns``, not a chunk.
``outcome`` is ``ok``, the fault's name, ``error``, ``disconnect``, ``stall``,
``client_closed`` or ``server_stopped``. Finished requests are served at ``GET
/ground_truth`` (header ``x-ground-truth-dropped`` counts records dropped past
``--gt-max-chunks``) and appended as JSONL to ``--log`` (buffered; flushed every
``LOG_FLUSH_RECORDS`` records, at exit and on SIGTERM/SIGINT).

Run: ``python -m refserver --port 0 --ttft-ms 50 --itl-ms 7``; it prints
``READY <port>`` once listening. In tests: ``with reference_server(ttft_ms=50) as srv: ...``.
"""

from refserver.harness import ReferenceServer, reference_server
from refserver.truth import (
    CHAT_TEMPLATE_OVERHEAD,
    DEFAULT_MAX_TOKENS,
    GroundTruthChunk,
    GroundTruthRequest,
    Pace,
)

__all__ = [
    "CHAT_TEMPLATE_OVERHEAD",
    "DEFAULT_MAX_TOKENS",
    "GroundTruthChunk",
    "GroundTruthRequest",
    "Pace",
    "ReferenceServer",
    "reference_server",
]
