"""`python -m engines.pytorch` with inputs that cannot work: one line, exit status 2."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[3]


def engine(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "engines.pytorch", "--port", "1", *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1"},
        check=False,
    )


def gguf_folder(tmp_path: Path) -> str:
    (tmp_path / "model.gguf").write_bytes(b"GGUF")
    return str(tmp_path)


def torn_folder(tmp_path: Path) -> str:
    """A model folder whose weights file was cut short (an interrupted copy)."""
    from engines.pytorch.model import load_model

    loaded = load_model("random:tiny", device="cpu")
    loaded.model.save_pretrained(tmp_path / "m")
    loaded.tokenizer.save_pretrained(tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:4])
    return str(tmp_path / "m")


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--model", "random:nope"], "unknown random model random:nope; known: random:tiny"),
        (["--dtype", "bogus"], "--dtype: unknown dtype 'bogus'"),
        (["--model", "/no/such/model"], "--model /no/such/model: no such file or folder"),
        (["--int4-configs", "/no/such/table.json"], "--int4-configs /no/such/table.json: no such"),
        (["--model", "GGUF_DIR"], "holds GGUF; this engine loads Hugging Face folders"),
        (["--model", "TORN_DIR"], "/m: unreadable safetensors: "),
        (["--model", "org/not-in-the-cache"], "python -m engines.pytorch: "),
        pytest.param(
            ["--device", "cuda"],
            "--device cuda: ",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is here"),
        ),
    ],
)
def test_bad_inputs_are_one_line(tmp_path: Path, args: list[str], expected: str):
    folders = {"GGUF_DIR": gguf_folder, "TORN_DIR": torn_folder}
    args = [folders[a](tmp_path) if a in folders else a for a in args]
    result = engine(*args)
    assert result.returncode == 2, result.stderr[-2000:]
    assert "Traceback" not in result.stderr
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("python -m engines.pytorch: "), lines
    assert expected in lines[0]
