"""guidellm: its command line, and its benchmarks.json read back into a `ToolRun`."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from benchmarks.thirdparty.records import RequestRecord, ToolRun
from benchmarks.thirdparty.runner import _run_tool

log = logging.getLogger(__name__)


GUIDELLM_ITL_DEFINITION = (
    "guidellm inter_token_latency_ms: per request (last_token_iteration - "
    "first_token_iteration) / (output_tokens - 1), output_tokens = usage.completion_tokens, "
    "i.e. vLLM's TPOT; p50/p99 over tokens (each request's value weighted by "
    "output_tokens - 1). guidellm exports no per-chunk times."
)


def guidellm_argv(
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
    """The exact ``guidellm run`` command line `run_guidellm` uses.

    guidellm 0.8's CLI takes ``kind=...,key=value`` strings (dots for nesting) per option.
    """
    backend = ",".join([
        "kind=openai_http",
        f"target={base_url}",
        f"model={model}",
        "request_format=/v1/chat/completions",
        "stream=true",
        # httpx over plain http would stay HTTP/1.1 anyway; said explicitly for the record.
        "http2=false",
        # guidellm itself adds max_completion_tokens=<output_tokens>, ignore_eos=true and
        # stop=null to each request; min_tokens is ours, as for AIPerf.
        f"extras.body.min_tokens={output_tokens}",
    ])  # fmt: skip
    argv = [
        str(exe), "run",
        "--backend", backend,
        # Warm-up/cool-down: profile defaults are none (warmup/cooldown unset).
        "--profile", f"kind=concurrent,streams={concurrency}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--data", f"kind=synthetic_text,prompt_tokens={input_tokens},output_tokens={output_tokens}",
        "--seed", "kind=static,value=42",
        "--output", f"kind=json,path={out_dir / 'benchmarks.json'}",
        "--disable-console-interactive",
    ]  # fmt: skip
    if request_count is not None:
        argv += ["--constraint", f"kind=max_requests,count={request_count}"]
    if duration_s is not None:
        argv += ["--constraint", f"kind=max_duration,seconds={duration_s:g}"]
    return argv


def run_guidellm(
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
    """Run ``guidellm run`` once (profile ``concurrent`` at ``concurrency`` streams), parse it.

    Bounds as `run_aiperf`. guidellm starts up slowly (~25 s of imports and worker spawning
    on one core) before the first request; ``wall_s`` and ``cpu_s`` include that,
    ``cpu_window_s`` does not.

    Sources, all in ``out_dir/benchmarks.json`` (``--output kind=json``), first benchmark:

    - ``metrics.output_tokens_per_second.total.mean`` -> ``output_tok_s`` (the console's
      "Output Tokens Per Sec", over all requests).
    - ``metrics.time_to_first_token_ms.successful.percentiles.p50/.p99`` -> ``ttft_*``
      (first chunk that produced a token).
    - ``metrics.inter_token_latency_ms.successful.percentiles.p50/.p99`` -> ``itl_*`` (see
      `GUIDELLM_ITL_DEFINITION`).
    - ``metrics.request_totals`` successful/errored/incomplete -> ``requests_*``.
    - ``extra``: ``request_concurrency_mean`` (``metrics.request_concurrency.total.mean``,
      guidellm's own in-flight average), ``duration_s``, ``worker_processes``
      (``scheduler_state.num_processes``), ``tpot_p50_ms`` (its TPOT includes the TTFT).
    - ``requests.successful/errored/incomplete[]`` -> ``records``: ``request_start_time``,
      ``request_end_time`` (wall clock), ``time_to_first_token_ms``, ``output_tokens``,
      ``inter_token_latency_ms``, ``info.timings.first_token_iteration`` /
      ``last_token_iteration`` (the only chunk times it keeps), ``info.error``,
      ``response_id`` (the server's chunk ``id``).

    Environment: ``HF_HUB_OFFLINE=1``, ``HF_HUB_DISABLE_TELEMETRY=1``.
    """
    env_changes: dict[str, str | None] = {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
        # Wide, plain console tables in the log instead of a terminal-sized rich layout.
        "COLUMNS": "200",
    }
    return _run_tool(
        "guidellm",
        guidellm_argv,
        lambda run, out: _parse_guidellm(run, out / "benchmarks.json"),
        env_changes=env_changes,
        startup_s=120,
        itl_definition=GUIDELLM_ITL_DEFINITION,
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


def _dist(metrics: dict[str, Any], metric: str, status: str, stat: str) -> float | None:
    """One statistic from a guidellm StatusDistributionSummary (``pNN`` or a plain key)."""
    d = (metrics.get(metric) or {}).get(status) or {}
    value = (d.get("percentiles") or {}).get(stat) if stat.startswith("p") else d.get(stat)
    return float(value) if isinstance(value, int | float) else None


def _parse_guidellm(run: ToolRun, path: Path) -> None:
    if not path.is_file():
        log.warning("guidellm wrote no %s", path)
        return
    report = json.loads(path.read_text())
    benchmarks = report.get("benchmarks") or []
    if not benchmarks:
        log.warning("guidellm report %s has no benchmark", path)
        return
    b = benchmarks[0]
    m = b.get("metrics") or {}
    run.output_tok_s = _dist(m, "output_tokens_per_second", "total", "mean")
    run.ttft_p50_ms = _dist(m, "time_to_first_token_ms", "successful", "p50")
    run.ttft_p99_ms = _dist(m, "time_to_first_token_ms", "successful", "p99")
    run.itl_p50_ms = _dist(m, "inter_token_latency_ms", "successful", "p50")
    run.itl_p99_ms = _dist(m, "inter_token_latency_ms", "successful", "p99")
    totals = m.get("request_totals") or {}
    run.requests_ok = int(totals.get("successful") or 0)
    run.requests_failed = int(totals.get("errored") or 0)
    run.requests_incomplete = int(totals.get("incomplete") or 0)
    for name, value in (
        ("request_concurrency_mean", _dist(m, "request_concurrency", "total", "mean")),
        ("tpot_p50_ms", _dist(m, "time_per_output_token_ms", "successful", "p50")),
        ("duration_s", b.get("duration")),
        ("worker_processes", (b.get("scheduler_state") or {}).get("num_processes")),
        # Its scheduler's own count, which can exceed request_totals (seen: 1280 vs 1272
        # flat out at 64 streams, all 1280 present in requests.successful).
        ("scheduler_successful", (b.get("scheduler_state") or {}).get("successful_requests")),
    ):
        if isinstance(value, int | float):
            run.extra[name] = float(value)
    requests = b.get("requests") or {}
    for status in ("successful", "errored", "incomplete"):
        for r in requests.get(status) or []:
            run.records.append(_guidellm_record(r, ok=status == "successful"))


def _guidellm_record(r: dict[str, Any], *, ok: bool) -> RequestRecord:
    info = r.get("info") or {}
    timings = info.get("timings") or {}
    start = r.get("request_start_time") or timings.get("request_start") or 0.0
    end = r.get("request_end_time") or timings.get("request_end") or start

    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, int | float) else None

    out = r.get("output_tokens")
    error = info.get("error")
    return RequestRecord(
        ok=ok,
        start_s=float(start),
        end_s=float(end),
        ttft_ms=num(r.get("time_to_first_token_ms")),
        output_tokens=int(out) if isinstance(out, int | float) else None,
        itl_ms=num(r.get("inter_token_latency_ms")),
        first_token_s=num(timings.get("first_token_iteration")),
        last_token_s=num(timings.get("last_token_iteration")),
        error=str(error) if error else (None if ok else "incomplete"),
        response_id=r.get("response_id"),
    )
