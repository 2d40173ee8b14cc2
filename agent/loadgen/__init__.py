"""The load generator: streaming OpenAI-compatible client, prompts, probe and sweep.

Hot path (`transport.FastTransport`, `sse.StreamRecorder`): raw asyncio + httptools, one
keep-alive connection per stream, every read stamped with perf_counter_ns before parsing.
Everything off the hot path (tokenize, models, health) uses httpx.
"""
