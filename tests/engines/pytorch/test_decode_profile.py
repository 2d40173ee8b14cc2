"""`benchmarks.decode_profile`: a served step's kernels read back from the profiler's
trace (a trace written as the CUDA profiler writes one: graph launches on the host,
kernels joined to them by correlation id), and the script run as on the GPU machine, here
on the CPU against a tiny model (no graphs there: the unprofiled step time only)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import decode_profile
from engines.pytorch.profiling import TRACE_FILE


def _kernel(name: str, ts: float, dur: float, correlation: int) -> dict[str, Any]:
    return {
        "ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
        "args": {"correlation": correlation},
    }  # fmt: skip


def _launch(ts: float, correlation: int) -> dict[str, Any]:
    return {
        "ph": "X", "cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": ts, "dur": 5.0,
        "args": {"correlation": correlation},
    }  # fmt: skip


def test_each_graph_launch_is_a_step_with_its_kernels_by_kind() -> None:
    events = [_launch(0.0, 7), _launch(100.0, 9)]
    # Step 1: a product overlapping the next (dependent launch), a gap, attention.
    events += [
        _kernel("gemv_int4", 10.0, 10.0, 7),
        {**_kernel("gemv_int4", 15.0, 10.0, 7), "args": {"correlation": 7, "grid": [40, 1, 1]}},
        _kernel("attention_partial", 30.0, 4.0, 7),  # 5 us with no kernel before it
        _kernel("triton_per_fused_rms_norm_0", 34.0, 2.0, 7),
    ]
    events += [_kernel("gemv", 110.0, 3.0, 9), _kernel("other_thing", 113.0, 1.0, 9)]
    events += [_kernel("gemv", 200.0, 1.0, 99)]  # not launched by a graph: not a step
    steps = decode_profile.graph_steps({"traceEvents": events})
    assert len(steps) == 2
    first = steps[0]
    assert first.kernels == 4
    assert first.span_us == 26.0
    assert first.busy_us == 21.0
    assert first.uncovered_us == 5.0
    assert first.kernel_us == 26.0
    assert first.by_kind_us == {"products": 20.0, "attention": 4.0, "compiled (fused)": 2.0}
    assert first.by_kind_count["products"] == 2
    assert first.chain_by_kind_us == {"products": 15.0, "attention": 4.0, "compiled (fused)": 2.0}
    assert steps[1].by_kind_count == {"products": 1, "other": 1}
    summary = decode_profile.summarize({"traceEvents": events})
    assert summary["steps"] == 2 and summary["top_kernels"][0]["kernel"] == "gemv_int4"
    # Started early and waited: the second product costs the chain 5 us, told apart by grid.
    assert first.chain_by_kernel_us == {
        "gemv_int4": 10.0, "gemv_int4 grid [40, 1, 1]": 5.0, "attention_partial": 4.0,
        "triton_per_fused_rms_norm_0": 2.0,
    }  # fmt: skip
    assert summary["top_chain_kernels"][0]["kernel"] == "gemv_int4"


def test_a_trace_without_graph_launches_has_no_steps() -> None:
    assert decode_profile.summarize({"traceEvents": [_kernel("gemv", 0.0, 1.0, 3)]}) == {
        "steps": 0
    }


def test_the_script_profiles_a_server_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "out"
    cmd = [
        sys.executable, "-m", "benchmarks.decode_profile", str(out), "--model",
        "random:tiny-gemma4", "--variant", "cpu=--device cpu", "--steps", "2", "--requests", "2",
    ]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "decode-profile.json").read_text())["cpu"]
    assert "error" not in result, result
    assert result["requests"] == 2
    assert result["unprofiled_step_ms"] > 0
    assert result["profile"]["steps"] == 0  # no CUDA graphs on the CPU
    assert (out / "cpu" / "decode-profile.txt").exists()
    assert not (out / "cpu" / TRACE_FILE).exists()  # read back, then removed
    assert "| cpu |" in proc.stdout
