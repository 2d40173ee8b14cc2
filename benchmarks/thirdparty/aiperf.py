"""AIPerf: its command line, and its JSON export read back into a `ToolRun`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from benchmarks.thirdparty.records import RequestRecord, ToolRun
from benchmarks.thirdparty.runner import _run_tool

log = logging.getLogger(__name__)


AIPERF_ITL_DEFINITION = (
    "AIPerf inter_token_latency: per request (request_latency - TTFT) / (output_tokens - 1) "
    "with output_tokens = usage.completion_tokens (--use-server-token-count), i.e. vLLM's "
    "TPOT; p50/p99 over requests. Raw chunk gaps are AIPerf's inter_chunk_latency "
    "(extra icl_p50_ms / icl_p99_ms, pooled over all gaps)."
)


def aiperf_argv(
    exe: Path,
    base_url: str,
    model: str,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None,
    duration_s: float | None,
    out_dir: Path,
    tokenizer: Path,
) -> list[str]:
    """The exact ``aiperf profile`` command line `run_aiperf` uses."""
    argv = [
        str(exe), "profile",
        "--model", model,
        "--url", base_url,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", str(tokenizer),
        "--concurrency", str(concurrency),
        "--isl", str(input_tokens), "--isl-stddev", "0",
        "--osl", str(output_tokens), "--osl-stddev", "0",
        # AIPerf sends max_completion_tokens=--osl itself; these two make vLLM-style servers
        # generate all of them (the reference server always sends exactly max tokens).
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", f"min_tokens:{output_tokens}",
        # Count output tokens from usage: the local byte tokenizer is not the model's.
        "--use-server-token-count",
        # Unique prompts: the default pool of 100 repeats prompts past 100 requests.
        "--num-dataset-entries", str(request_count or max(100, 20 * concurrency)),
        "--random-seed", "42",
        "--artifact-dir", str(out_dir),
        "--export-level", "records",
        "--ui-type", "none",
        # Off: a /metrics scrape of the server and DCGM probes on localhost:9400/9401.
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]  # fmt: skip
    if request_count is not None:
        argv += ["--request-count", str(request_count)]
    if duration_s is not None:
        # Requests still streaming at the end get 30 s to finish and are then counted.
        argv += ["--benchmark-duration", f"{duration_s:g}", "--benchmark-grace-period", "30"]
    # No --warmup-* flag: AIPerf has no warm-up phase unless one is asked for.
    return argv


def run_aiperf(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None = None,
    duration_s: float | None = None,
    out_dir: Path,
    cpu: int | None,
    timeout_s: float | None = None,
) -> ToolRun:
    """Run ``aiperf profile`` once (closed loop at ``concurrency`` streams) and parse it.

    Bounds: ``request_count`` and/or ``duration_s`` (default ten rounds of the loop), plus an
    overall ``timeout_s`` after which the tool's process group is killed.

    Sources, all under ``out_dir`` (``--artifact-dir``):

    - ``profile_export_aiperf.json`` (summary): ``output_tok_s`` =
      ``output_token_throughput.avg`` (total output tokens / (last response - first
      request)); ``ttft_p50/p99_ms`` = ``time_to_first_token.p50/.p99`` (first non-empty
      content chunk; the role-only chunk does not count); ``itl_p50/p99_ms`` =
      ``inter_token_latency.p50/.p99`` (see `AIPERF_ITL_DEFINITION`); ``extra``:
      ``effective_concurrency`` (.avg, AIPerf's own in-flight average),
      ``benchmark_duration_s``, ``icl_p50_ms``/``icl_p99_ms`` (``inter_chunk_latency``),
      ``credit_to_start_p50_ms`` (scheduler issue -> request send), ``request_count``.
    - ``profile_export.jsonl`` (one line per request): ``metadata.request_start_ns`` /
      ``request_end_ns`` (wall clock) -> ``start_s``/``end_s``;
      ``metrics.time_to_first_token``, ``inter_token_latency``, ``output_sequence_length``;
      ``metrics.inter_chunk_latency`` (list, ms) -> ``chunk_times_s`` = start + TTFT +
      cumulative gaps; ``metadata.x_request_id`` (also sent as the X-Request-ID header);
      a line with an ``error`` object is a failed request.
      ``requests_ok``/``requests_failed`` are counted from these lines.
    - ``aiperf.log`` (stdout+stderr, ours) and ``logs/aiperf.log`` (the tool's).

    Environment: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are removed (AIPerf 0.13
    only loads a local tokenizer folder when they are unset); ``HF_HUB_DISABLE_TELEMETRY=1``.
    """
    env_changes: dict[str, str | None] = {
        "HF_HUB_OFFLINE": None,
        "TRANSFORMERS_OFFLINE": None,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return _run_tool(
        "aiperf",
        aiperf_argv,
        _parse_aiperf,
        env_changes=env_changes,
        startup_s=60,
        itl_definition=AIPERF_ITL_DEFINITION,
        base_url=base_url,
        model=model,
        concurrency=concurrency,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_count=request_count,
        duration_s=duration_s,
        out_dir=out_dir,
        cpu=cpu,
        timeout_s=timeout_s,
    )


def _stat(d: dict[str, Any], metric: str, stat: str) -> float | None:
    value = (d.get(metric) or {}).get(stat)
    return float(value) if isinstance(value, int | float) else None


def _parse_aiperf(run: ToolRun, out_dir: Path) -> None:
    summary_path = out_dir / "profile_export_aiperf.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        run.output_tok_s = _stat(s, "output_token_throughput", "avg")
        run.ttft_p50_ms = _stat(s, "time_to_first_token", "p50")
        run.ttft_p99_ms = _stat(s, "time_to_first_token", "p99")
        run.itl_p50_ms = _stat(s, "inter_token_latency", "p50")
        run.itl_p99_ms = _stat(s, "inter_token_latency", "p99")
        for name, metric, stat in (
            ("effective_concurrency", "effective_concurrency", "avg"),
            ("benchmark_duration_s", "benchmark_duration", "avg"),
            ("icl_p50_ms", "inter_chunk_latency", "p50"),
            ("icl_p99_ms", "inter_chunk_latency", "p99"),
            ("credit_to_start_p50_ms", "credit_to_start_latency", "p50"),
            ("request_count", "request_count", "avg"),
            ("error_request_count", "error_request_count", "avg"),
        ):
            value = _stat(s, metric, stat)
            if value is not None:
                run.extra[name] = value
    else:
        log.warning("aiperf wrote no %s", summary_path)
    records_path = out_dir / "profile_export.jsonl"
    if not records_path.is_file():
        log.warning("aiperf wrote no %s", records_path)
        return
    with records_path.open() as fh:
        for line in fh:
            if line.strip():
                run.records.append(_aiperf_record(json.loads(line)))
    run.requests_ok = sum(r.ok for r in run.records)
    run.requests_failed = sum(not r.ok for r in run.records)


def _aiperf_record(d: dict[str, Any]) -> RequestRecord:
    meta = d.get("metadata") or {}
    metrics = d.get("metrics") or {}

    def value(name: str) -> Any:
        return (metrics.get(name) or {}).get("value")

    start = meta.get("request_start_ns") or meta.get("credit_issued_ns") or 0
    end = meta.get("request_end_ns") or start
    start_s, end_s = start / 1e9, end / 1e9
    error = d.get("error")
    ttft = value("time_to_first_token")
    gaps = value("inter_chunk_latency")
    chunk_times: list[float] | None = None
    if isinstance(ttft, int | float):
        chunk_times = [start_s + ttft / 1e3]
        if isinstance(gaps, list):
            for gap in gaps:
                chunk_times.append(chunk_times[-1] + float(gap) / 1e3)
    osl = value("output_sequence_length")
    itl = value("inter_token_latency")
    return RequestRecord(
        ok=error is None,
        start_s=start_s,
        end_s=end_s,
        ttft_ms=float(ttft) if isinstance(ttft, int | float) else None,
        output_tokens=int(osl) if isinstance(osl, int | float) else None,
        itl_ms=float(itl) if isinstance(itl, int | float) else None,
        chunk_times_s=chunk_times,
        first_token_s=chunk_times[0] if chunk_times else None,
        last_token_s=chunk_times[-1] if chunk_times else None,
        error=json.dumps(error) if error is not None else None,
        x_request_id=meta.get("x_request_id"),
    )
