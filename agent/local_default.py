"""The embedded default: a small real campaign on this machine, no GPU and no cloud needed.

llama.cpp's server (built once from source, cached) serves a tiny random-weight model the
project generates, the health and first-completion times are recorded, then the probe and
a short load sweep run against it. Results land in `<out>/<campaign>/jobs/<job>/` as the
results contract lays them out. The full campaign runner (issue 5) replaces the job list
here with the shipped local campaign spec; the job folders stay the same.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from agent.loadgen.client import ChatRequest, OpenAIClient
from agent.loadgen.probe import run_probe
from agent.loadgen.sweep import run_sweep
from agent.results import ResultWriter
from agent.supervisor import EngineServer, free_port
from contract.results import DONE_FILE, ProbeSummary, SweepSummary
from contract.suite import ProbeSettings, RequestSettings, Shape, SweepSettings
from engines.builds.llamacpp import ensure_llama_server
from engines.local import LOCAL_LLAMACPP, LOCAL_LLAMACPP_EXTRA_BODY, local_llamacpp_argv
from engines.models.tiny_gguf import write_tiny_gguf

__all__ = ["LocalRun", "run_local_default"]

log = logging.getLogger(__name__)

CAMPAIGN = "local-default"
HEALTH_TIMEOUT_S = 120.0
FIRST_COMPLETION_TIMEOUT_S = 120.0

REQUEST = RequestSettings(extra_body=LOCAL_LLAMACPP_EXTRA_BODY)
PROBE = ProbeSettings(output_tokens=128, repeats=3, at_once=4, request=REQUEST)
SWEEP = SweepSettings(
    shapes=(Shape(input_tokens=256, output_tokens=64), Shape(input_tokens=64, output_tokens=256)),
    levels=(1, 2, 4, 8),
    repeats=3,
    request=REQUEST,
)


@dataclass(frozen=True)
class LocalRun:
    campaign_dir: Path
    engine: str
    build_id: str
    health_s: float
    first_completion_s: float
    probe: ProbeSummary
    sweep: SweepSummary


async def _first_completion(url: str, deadline_s: float) -> float:
    """Seconds until a real completion answers with content (health 200 is not enough)."""
    started = time.monotonic()
    async with OpenAIClient(url, max_connections=1) as client:
        while True:
            await client.server_info()
            record = await client.send(
                ChatRequest(prompt="Say hello.", max_tokens=8, label="ready", request_id="ready")
            )
            if record.ok:
                return time.monotonic() - started
            if time.monotonic() - started > deadline_s:
                raise TimeoutError(f"no good completion within {deadline_s:.0f} s: {record.error}")
            await asyncio.sleep(0.5)


def run_local_default(out_root: Path) -> LocalRun:
    """Build (once), serve, probe, sweep, stop; every job folder complete on return."""
    campaign_dir = out_root / CAMPAIGN / datetime.now().strftime("%Y%m%d-%H%M%S")
    jobs = campaign_dir / "jobs"
    build = ensure_llama_server()
    model = write_tiny_gguf(campaign_dir / "models" / "tiny-random-llama.gguf")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    engine = LOCAL_LLAMACPP
    log.info("START serve %s (%s) on %s", engine, build.build_id, url)
    server_log = jobs / f"{engine}-probe" / "server.log"
    server_log.parent.mkdir(parents=True, exist_ok=True)
    with EngineServer(
        engine, local_llamacpp_argv(build.binary, model, port), log_path=server_log, port=port
    ) as server:
        health_s = server.wait_healthy(f"{url}/health", HEALTH_TIMEOUT_S)
        first_s = asyncio.run(_first_completion(url, FIRST_COMPLETION_TIMEOUT_S))
        log.info("ready: health %.2f s, first completion %.2f s later", health_s, first_s)

        probe_writer = ResultWriter(jobs / f"{engine}-probe")
        log.info("START probe")
        probe = asyncio.run(_probe(url, probe_writer))
        (probe_writer.job_dir / DONE_FILE).touch()
        log.info("END probe")

        sweep_writer = ResultWriter(jobs / f"{engine}-sweep")
        log.info("START sweep")
        sweep = asyncio.run(_sweep(url, sweep_writer))
        (sweep_writer.job_dir / DONE_FILE).touch()
        log.info("END sweep")
    log.info("END serve %s", engine)
    return LocalRun(
        campaign_dir=campaign_dir,
        engine=engine,
        build_id=build.build_id,
        health_s=health_s,
        first_completion_s=first_s,
        probe=probe,
        sweep=sweep,
    )


async def _probe(url: str, writer: ResultWriter) -> ProbeSummary:
    async with OpenAIClient(url, settings=PROBE.request, max_connections=PROBE.at_once) as c:
        return await run_probe(c, PROBE, writer)


async def _sweep(url: str, writer: ResultWriter) -> SweepSummary:
    async with OpenAIClient(url, settings=SWEEP.request, max_connections=max(SWEEP.levels)) as c:
        return await run_sweep(c, SWEEP, writer)
