"""The PyTorch engine behind the shared HTTP layer (`engines.serving.server`): load the
model, build the runner and scheduler, and serve them."""

from __future__ import annotations

import logging
from pathlib import Path

import torch
import transformers

from engines.pytorch.config import EngineConfig
from engines.pytorch.profiling import DecodeProfiler
from engines.pytorch.scheduler import Scheduler, StepOutput
from engines.serving import server as http
from engines.serving.metrics import EngineMetrics
from engines.serving.server import ServedModel, ServingState

log = logging.getLogger(__name__)


def create_state(config: EngineConfig) -> ServingState:
    """Load the model and build the runner and scheduler (not started) for `config`."""
    from engines.pytorch.model import load_model
    from engines.pytorch.runner import ModelRunner

    if config.threads > 0:
        torch.set_num_threads(config.threads)
    table = None if config.int4_configs is None else Path(config.int4_configs).expanduser()
    loaded = load_model(
        config.model,
        dtype=config.dtype,
        device=config.device,
        seed=config.seed,
        max_model_len=config.max_model_len,
        served_name=config.served_model_name,
        quantize=config.quantize,
        int4_configs=table,
    )
    device_type = loaded.device.type
    runner = ModelRunner(
        loaded,
        num_slots=config.max_running,
        batch_invariant=config.batch_invariant_on(device_type),
        batched_decode=config.batched_decode_on(device_type),
        cuda_graphs=config.cuda_graphs_on(device_type),
        packed_prefill=config.packed_prefill_on(device_type),
        fused_norms=config.fused_norms_on(device_type),
        compile_mode=config.compile_mode_for(device_type),
        compile_without_program=config.compile_mode != "auto",
        decode_program=config.decode_program_on(device_type),
        triton_gemv=config.triton_gemv_on(device_type),
        attention_form=config.attention_form,
        dependent_launch=config.dependent_launch == "auto",
    )
    if runner.graphs is not None and config.graph_warmup_len > 0:
        # Before /health answers: the first requests should not wait for captures.
        count = runner.warmup_graphs(config.graph_warmup_len)
        log.info("captured %d decode graphs in %.1fs", count, runner.graphs.capture_s)
    metrics = EngineMetrics(loaded.name, prefix="pytorch_engine")

    def not_started(batch: list[tuple[object, StepOutput]]) -> None:
        raise RuntimeError("scheduler outputs delivered before the server started")

    scheduler = Scheduler(
        runner,
        max_running=config.max_running,
        metrics=metrics,
        deliver=not_started,
        prefill_chunk=config.prefill_chunk,
        prefill_budget=config.prefill_budget,
        async_decode=config.async_decode == "on",
        profiler=DecodeProfiler(
            Path(config.profile_dir), config.profile_decode_steps, loaded.device
        )
        if config.profile_dir
        else None,
    )
    served = ServedModel(
        name=loaded.name,
        root=config.model,
        tokenizer=loaded.tokenizer,
        max_model_len=loaded.max_model_len,
        version={
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "device": str(loaded.device),
            "dtype": str(loaded.dtype).removeprefix("torch."),
            "batch_invariant": runner.invariant is not None,
            "quantization": None if loaded.quantization is None else loaded.quantization.summary(),
        },
    )
    return ServingState(model=served, scheduler=scheduler, metrics=metrics)




def serve(config: EngineConfig) -> None:
    """Load, then serve until interrupted."""
    state = create_state(config)
    http.serve(state, host=config.host, port=config.port, log_level=config.log_level)
