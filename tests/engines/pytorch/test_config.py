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
