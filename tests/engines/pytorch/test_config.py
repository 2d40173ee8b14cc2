"""The engine's command line."""

from __future__ import annotations

import pytest

from engines.pytorch.config import EngineConfig, parse_args


def test_defaults_and_flags() -> None:
    cfg = parse_args(
        ["--model", "random:tiny", "--port", "8100", "--max-running", "64", "--dtype", "auto"]
    )
    assert cfg == EngineConfig(model="random:tiny", port=8100, max_running=64, dtype="auto")
    assert cfg.host == "127.0.0.1"
    assert cfg.batch_invariant_on("cpu") and not cfg.batch_invariant_on("cuda")
    assert parse_args(["--batch-invariant", "on"]).batch_invariant_on("cuda")


def test_bad_values_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--max-running", "0"])
    assert "--max-running" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--profile-dir", "p", "--profile-decode-steps", "0"])
    assert "--profile-decode-steps" in capsys.readouterr().err


def test_async_decode_is_on_and_profiling_off_unless_asked() -> None:
    cfg = parse_args([])
    assert cfg.async_decode == "on" and cfg.profile_dir is None
    cfg = parse_args(["--profile-dir", "prof", "--async-decode", "off"])
    assert cfg.profile_dir == "prof" and cfg.profile_decode_steps == 32
    assert cfg.async_decode == "off"


def test_fast_path_defaults_follow_the_device() -> None:
    cfg = parse_args([])
    assert not cfg.batched_decode_on("cpu") and cfg.batched_decode_on("cuda")
    assert not cfg.cuda_graphs_on("cpu") and cfg.cuda_graphs_on("cuda")
    assert not cfg.packed_prefill_on("cpu") and cfg.packed_prefill_on("cuda")
    # asking for invariance on CUDA brings back the row-by-row path and no graphs
    inv = parse_args(["--batch-invariant", "on"])
    assert not inv.batched_decode_on("cuda") and not inv.cuda_graphs_on("cuda")
    assert not inv.packed_prefill_on("cuda")
    fast = parse_args(["--decode-attention", "batched", "--cuda-graphs", "off"])
    assert fast.batched_decode_on("cpu") and not fast.cuda_graphs_on("cuda")
    assert parse_args(["--graph-warmup-len", "0"]).graph_warmup_len == 0


def test_decode_program_kernels_and_compile_default_to_cuda_only() -> None:
    cfg = parse_args([])
    assert not cfg.decode_program_on("cpu") and cfg.decode_program_on("cuda")
    assert not cfg.triton_gemv_on("cpu") and cfg.triton_gemv_on("cuda")
    assert cfg.compile_mode_for("cpu") is None and cfg.compile_mode_for("cuda") == "default"
    # without the program on CUDA (batch-invariant rows), no per-layer compile either
    inv = parse_args(["--batch-invariant", "on"])
    assert inv.compile_mode_for("cuda") is None and not inv.triton_gemv_on("cuda")
    off = parse_args(["--compile-mode", "none", "--gemv-kernel", "cublas"])
    assert off.compile_mode_for("cuda") is None and not off.triton_gemv_on("cuda")
    assert parse_args(["--compile-mode", "max-autotune-no-cudagraphs"]).compile_mode_for("cpu") == (
        "max-autotune-no-cudagraphs"
    )
    assert parse_args(["--attention-form", "reduction"]).attention_form == "reduction"
    assert parse_args([]).attention_form == "normed-kernel"  # at batch 1 on CUDA only
