"""Prometheus exposition of the engine's metrics."""

from __future__ import annotations

from engines.serving.metrics import EngineMetrics


def test_render_counters_gauges_and_cumulative_histograms() -> None:
    m = EngineMetrics("random:tiny")
    m.set_queues(running=3, waiting=2)
    m.add_prompt_tokens(10)
    m.observe_step("decode", 0.004, rows=3, new_tokens=3)
    m.observe_step("decode", 0.02, rows=1, new_tokens=1)
    m.observe_step("prefill", 0.03, rows=1, new_tokens=1)
    m.request_finished("length")
    text = m.render()
    lines = set(text.splitlines())
    assert 'pytorch_engine_requests_running{model_name="random:tiny"} 3.0' in lines
    assert 'pytorch_engine_requests_waiting{model_name="random:tiny"} 2.0' in lines
    assert 'pytorch_engine_generation_tokens_total{model_name="random:tiny"} 5.0' in lines
    assert 'pytorch_engine_prompt_tokens_total{model_name="random:tiny"} 10.0' in lines
    finished = (
        'pytorch_engine_requests_finished_total{finished_reason="length",model_name="%s"} 1.0'
    )
    assert finished % "random:tiny" in lines
    bucket = (
        'pytorch_engine_step_seconds_bucket{le="%s",model_name="random:tiny",phase="decode"} %d'
    )
    assert bucket % ("0.005", 1) in lines
    assert bucket % ("0.025", 2) in lines
    assert bucket % ("+Inf", 2) in lines
    assert 'pytorch_engine_step_seconds_count{model_name="random:tiny",phase="decode"} 2' in lines
    assert 'pytorch_engine_decode_batch_size_bucket{le="2.0",model_name="random:tiny"} 1' in lines
    assert "# TYPE pytorch_engine_step_seconds histogram" in lines
    assert text.endswith("\n")


def test_each_engine_names_its_prefix_and_adds_gauges_of_its_own() -> None:
    m = EngineMetrics("random:tiny-gemma4", prefix="jax_engine")
    m.set_gauge("compiled_buckets", "Shape buckets compiled.", 3)
    m.set_gauge("compiled_buckets", "Shape buckets compiled.", 4)
    lines = m.render().splitlines()
    assert 'jax_engine_compiled_buckets{model_name="random:tiny-gemma4"} 4.0' in lines
    assert "# TYPE jax_engine_compiled_buckets gauge" in lines
    assert not any(line.startswith(("pytorch_engine", "# TYPE pytorch")) for line in lines)
