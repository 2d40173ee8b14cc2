"""Turning a spec's model reference into what an engine loads.

- `generated:tiny-llama`: the project's tiny random-weight GGUF, written locally (no download)
- `random:<name>`: passed through; our PyTorch engine builds it in code
- `org/repo:file`: one file of a Hugging Face repo (e.g. a GGUF), downloaded with the
  token from the engine environment (never logged) into the work dir's model cache
- anything else (`org/repo`, a local path): passed through; the engine loads it itself
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from contract.errors import BenchError
from engines.models.tiny_gguf import write_tiny_gguf

__all__ = ["ModelResolveError", "resolve_model"]

log = logging.getLogger(__name__)

_GENERATED = {"tiny-llama": write_tiny_gguf}


class ModelResolveError(BenchError, RuntimeError):
    pass


def resolve_model(reference: str, cache_dir: Path, env: Mapping[str, str]) -> str:
    if reference.startswith("generated:"):
        name = reference.removeprefix("generated:")
        writer = _GENERATED.get(name)
        if writer is None:
            raise ModelResolveError(
                f"unknown generated model {name!r} (known: {', '.join(sorted(_GENERATED))})"
            )
        path = cache_dir / f"{name}.gguf"
        if not path.exists():
            writer(path)
        return str(path)
    if reference.startswith("random:") or ":" not in reference or Path(reference).exists():
        return reference
    repo, filename = reference.rsplit(":", 1)
    try:
        from huggingface_hub import hf_hub_download
    except ImportError as exc:
        raise ModelResolveError(f"{reference}: huggingface_hub is needed to download it") from exc
    log.info("downloading %s from %s", filename, repo)
    try:
        return hf_hub_download(
            repo, filename, cache_dir=str(cache_dir / "hf"), token=env.get("HF_TOKEN") or None
        )
    except Exception as exc:  # any hub failure is this one model's failure
        raise ModelResolveError(f"{reference}: download failed: {type(exc).__name__}") from exc
