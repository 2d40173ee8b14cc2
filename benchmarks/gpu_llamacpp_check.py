"""llama.cpp on a real NVIDIA GPU, end to end through the project's own parts.

Builds llama-server with CUDA for this GPU's compute capability (engines.builds.llamacpp,
from the same pinned source as the CPU build), renders the llama.cpp recipe for this GPU,
serves the tiny generated model under the supervisor with the telemetry sampler running,
records the health and first-completion times, runs the probe and a short sweep, stops
the server and checks the port and GPU memory are released. Prints one JSON summary.

    LLAMA_CPP_SOURCE_DIR=/path/to/extracted/tree python -m benchmarks.gpu_llamacpp_check OUT
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path

from agent.jobfolder import JobFolder
from agent.loadgen.client import ChatRequest, OpenAIClient
from agent.loadgen.probe import run_probe
from agent.loadgen.sweep import run_sweep
from agent.supervisor import EngineServer, free_port
from agent.telemetry import TelemetrySampler
from contract.suite import ProbeSettings, Shape, SweepSettings
from engines.builds.llamacpp import ensure_llama_server
from engines.models.tiny_gguf import write_tiny_gguf
from engines.recipes import get_recipe, render

log = logging.getLogger(__name__)


def _gpu_cc() -> tuple[int, int]:
    import pynvml

    pynvml.nvmlInit()
    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return tuple(pynvml.nvmlDeviceGetCudaComputeCapability(handle))  # type: ignore[return-value]


def _gpu_memory_used_mib() -> float:
    import pynvml

    handle = pynvml.nvmlDeviceGetHandleByIndex(0)
    return pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20


async def _first_completion(url: str, request) -> float:
    started = time.monotonic()
    async with OpenAIClient(url, settings=request, max_connections=1) as client:
        await client.server_info()
        for _ in range(240):
            record = await client.send(
                ChatRequest(prompt="Say hello.", max_tokens=8, label="ready", request_id="ready")
            )
            if record.ok:
                return time.monotonic() - started
            await asyncio.sleep(0.5)
    raise TimeoutError("no good completion in 120 s")


def main(out: Path) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    out.mkdir(parents=True, exist_ok=True)
    major, minor = _gpu_cc()
    started = time.monotonic()
    build = ensure_llama_server(cuda_arch=f"{major}{minor}", jobs=16)
    build_s = time.monotonic() - started
    model = write_tiny_gguf(out / "tiny.gguf")
    port = free_port()
    # The tiny model's 16-wide heads have no CUDA flash-attention kernel: let llama.cpp
    # decide rather than force it on as the recipe does for real models.
    served = render(
        get_recipe("llamacpp"),
        "llama",
        (major, minor),
        model,
        port,
        binary=build.binary,
        settings={"flash_attn": "auto"},
    )
    request = served.request_settings()
    sampler = TelemetrySampler(out / "telemetry.csv")
    sampler.start()
    memory_before = _gpu_memory_used_mib()
    result: dict[str, object] = {
        "build": build.to_dict(),
        "build_s": build_s,
        "argv": list(served.argv),
        "variant": served.variant,
    }
    with EngineServer(
        served.engine, served.argv, log_path=out / "server.log", port=port, env=served.env
    ) as server:
        sampler.track_process(server.pid)
        result["health_s"] = server.wait_healthy(served.health_url, 120)
        result["first_completion_s"] = asyncio.run(_first_completion(served.base_url, request))
        result["memory_serving_mib"] = _gpu_memory_used_mib() - memory_before

        async def measure():
            probe_settings = ProbeSettings(output_tokens=256, repeats=3, at_once=4, request=request)
            sweep_settings = SweepSettings(
                shapes=(
                    Shape(input_tokens=512, output_tokens=128),
                    Shape(input_tokens=128, output_tokens=512),
                ),
                levels=(1, 8, 64),
                repeats=2,
                request=request,
            )
            async with OpenAIClient(served.base_url, settings=request, max_connections=64) as c:
                sampler.set_job("probe")
                probe = await run_probe(c, probe_settings, JobFolder(out / "probe"))
                sampler.set_job("sweep")
                sweep = await run_sweep(c, sweep_settings, JobFolder(out / "sweep"))
                sampler.set_job(None)
            return probe, sweep

        probe, sweep = asyncio.run(measure())
    result["memory_after_stop_mib"] = _gpu_memory_used_mib() - memory_before
    sampler.stop()
    tokens = sum(w.output_tokens for c in sweep.cells for w in c.repeats)
    result["telemetry_sweep"] = sampler.summary("sweep", tokens).to_dict()
    result["probe"] = probe.model_dump(mode="json", exclude={"settings", "prompts"})
    result["sweep"] = {
        f"{c.shape}/c{c.concurrency}": [
            c.status,
            c.aggregate_output_tok_s_median,
            c.ttft_ms_p50_median,
        ]
        for c in sweep.cells
    }
    (out / "result.json").write_text(json.dumps(result, indent=2, default=str))
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(Path(sys.argv[1] if len(sys.argv) > 1 else "gpu-llamacpp")))
