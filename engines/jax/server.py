"""The JAX engine behind the shared HTTP layer (`engines.serving.server`): load the model,
compile every bucket (progress in the log, the count in /metrics), then serve, so
/health answers 200 only when no request will wait for a compile."""

from __future__ import annotations

import logging

import jax.numpy as jnp
import transformers

from engines.jax.config import JaxEngineConfig
from engines.jax.model import cache_nbytes
from engines.jax.runner import JaxRunner, backend_versions, load
from engines.jax.scheduler import JaxScheduler
from engines.serving import server as http
from engines.serving.metrics import EngineMetrics
from engines.serving.requests import StepOutput
from engines.serving.server import ServedModel, ServingState

log = logging.getLogger(__name__)


def create_state(config: JaxEngineConfig) -> ServingState:
    """Load, compile every bucket, and build the scheduler (not started)."""
    loaded = load(
        config.model,
        dtype=config.dtype,
        device=config.device,
        seed=config.seed,
        max_model_len=config.max_model_len,
        served_name=config.served_model_name,
    )
    runner = JaxRunner(
        loaded,
        num_slots=config.max_running,
        prefill_buckets=config.prefill_buckets,
        kv_buckets=config.kv_buckets,
        batch_buckets=config.batch_buckets,
        decode_steps=config.decode_steps,
        decode_attention=config.decode_attention,
    )
    metrics = EngineMetrics(loaded.name, prefix="jax_engine")
    metrics.set_kv_cache_bytes(cache_nbytes(runner.cache))
    total = len(runner.programs())
    log.info(
        "compiling %d programs: prefill buckets %s and decode batch buckets %s (%d "
        "greedy steps a call, %s decode attention), each with KV buckets %s",
        total,
        runner.prefill_buckets,
        runner.batch_buckets,
        runner.steps,
        runner.attention,
        runner.kv_buckets,
    )

    def progress(done: int, total: int) -> None:
        log.info("compiled %d/%d buckets", done, total)
        metrics.set_gauge("compiled_buckets", "Shape buckets compiled (all before /health).", done)

    runner.compile_all(config.compile_threads, progress)
    log.info("compiled all %d buckets in %.1fs", runner.compiled, runner.compile_s)
    metrics.set_gauge("compile_seconds", "Time compiling the bucket ladder.", runner.compile_s)

    def not_started(batch: list[tuple[object, StepOutput]]) -> None:
        raise RuntimeError("scheduler outputs delivered before the server started")

    scheduler = JaxScheduler(
        runner, metrics=metrics, deliver=not_started, prefill_budget=config.prefill_budget
    )
    served = ServedModel(
        name=loaded.name,
        root=config.model,
        tokenizer=loaded.tokenizer,
        max_model_len=loaded.max_model_len,
        version={
            **backend_versions(),
            "transformers": transformers.__version__,
            "device": str(loaded.device),
            "dtype": jnp.dtype(loaded.dtype).name,
            "batch_invariant": True,
            "compiled_buckets": runner.compiled,
        },
    )
    return ServingState(model=served, scheduler=scheduler, metrics=metrics)


def serve(config: JaxEngineConfig) -> None:
    """Load and compile, then serve until interrupted."""
    state = create_state(config)
    http.serve(state, host=config.host, port=config.port, log_level=config.log_level)
