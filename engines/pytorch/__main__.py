"""`python -m engines.pytorch ...`: parse the command line, check it, set up logging, serve.

Inputs that cannot work (an unknown `random:` name or dtype, `--device cuda` on a build or
host without CUDA, a model path that does not exist or holds a format this engine does not
load, an `--int4-configs` file that does not exist) end with one line on stderr and exit
status 2, before anything loads.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from contract.errors import BenchError
from engines.pytorch.config import EngineConfig, parse_args

_PROG = "python -m engines.pytorch"
_LOADS = "Hugging Face folders (config.json + safetensors or .bin), hub ids and random:<name>"
_FORMATS = {".gguf": "GGUF", ".litertlm": "LiteRT-LM", ".onnx": "ONNX", ".tflite": "TFLite"}


class InputError(BenchError, ValueError):
    """A command-line value that cannot work: printed as one line."""


def _check_model(spec: str) -> None:
    if spec.startswith("random:"):
        return  # the registry names its models itself when loading
    path = Path(spec).expanduser()
    looks_like_path = spec.startswith((".", "/", "~")) or path.exists()
    if not looks_like_path:
        return  # a hub id: the hub's own error, made one line, if it cannot be had
    if not path.exists():
        raise InputError(f"--model {spec}: no such file or folder")
    files = [path] if path.is_file() else sorted(p for p in path.iterdir() if p.is_file())
    formats = sorted({_FORMATS[p.suffix.lower()] for p in files if p.suffix.lower() in _FORMATS})
    has_config = (path / "config.json").exists() if path.is_dir() else False
    has_weights = any(p.suffix in (".safetensors", ".bin") for p in files)
    if path.is_dir() and has_config and has_weights:
        return
    found = f"holds {', '.join(formats)}" if formats else "is not a model folder"
    what = "no config.json" if path.is_dir() and not has_config else "no weights"
    detail = "" if formats else f" ({what})"
    raise InputError(f"--model {spec}: {found}{detail}; this engine loads {_LOADS}")


def check_config(config: EngineConfig) -> None:
    """Refuse, with one line, the inputs that would fail only after imports and loading."""
    import torch

    from engines.pytorch.model import resolve_dtype

    if config.device.startswith("cuda") and not torch.cuda.is_available():
        why = (
            f"this PyTorch ({torch.__version__}) is a CPU build"
            if torch.version.cuda is None
            else "no CUDA device is visible"
        )
        raise InputError(f"--device {config.device}: {why}; use --device cpu or auto")
    if config.dtype != "auto":
        resolve_dtype(config.dtype, torch.device("cpu"))
    if config.int4_configs is not None and not Path(config.int4_configs).expanduser().is_file():
        raise InputError(f"--int4-configs {config.int4_configs}: no such file")
    _check_model(config.model)


def main() -> None:
    config = parse_args()
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    from safetensors import SafetensorError

    try:
        check_config(config)
        from engines.pytorch.server import serve

        serve(config)
    except (ValueError, OSError, SafetensorError) as exc:
        # Loading errors (a hub id that cannot be fetched, an unknown random: name, a
        # checkpoint transformers cannot read, a torn safetensors file) are inputs to fix,
        # not engine faults.
        torn = isinstance(exc, SafetensorError)
        what = f"--model {config.model}: unreadable safetensors: " if torn else ""
        sys.stderr.write(f"{_PROG}: {what}{' '.join(str(exc).split())[:500]}\n")
        raise SystemExit(2) from None


if __name__ == "__main__":
    main()
