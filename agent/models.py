"""Turning a spec's model reference into what an engine loads.

- `generated:tiny-llama`: the project's tiny random-weight GGUF, written locally (no download)
- `random:<name>`: passed through; our PyTorch engine builds it in code
- `org/repo:file`: one file of a Hugging Face repo (e.g. a GGUF), downloaded with the
  token from the engine environment (never logged, never in an argument list) into the work
  dir's model cache. The download runs in a child process of its own process group, so a
  spot notice or SIGTERM (`should_stop`) ends it within a second (the job fails as
  interrupted; the relaunched shard downloads again).
- anything else (`org/repo`, a local path): passed through; the engine loads it itself
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from contract.errors import BenchError
from contract.processes import end_process_group
from engines.models.tiny_gguf import write_tiny_gguf

__all__ = ["ModelResolveError", "resolve_model"]

log = logging.getLogger(__name__)

_GENERATED = {"tiny-llama": write_tiny_gguf}
# A multi-GB checkpoint over a slow link; past this the download is a failure, not a wait.
DOWNLOAD_TIMEOUT_S = 3 * 3600.0
_POLL_S = 0.5
_PATH_MARK = "bench-model-path: "
_ERROR_MARK = "bench-model-error: "


class ModelResolveError(BenchError, RuntimeError):
    pass


def resolve_model(
    reference: str,
    cache_dir: Path,
    env: Mapping[str, str],
    *,
    should_stop: Callable[[], bool] = lambda: False,
) -> str:
    """What the engine loads for `reference`; a hub file is downloaded (see the module doc).

    Raises `ModelResolveError` for an unknown reference, a failed download, or a download
    stopped because `should_stop` turned true.
    """
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
    log.info("downloading %s from %s", filename, repo)
    return _download(reference, repo, filename, cache_dir / "hf", env, should_stop)


def _download(
    reference: str,
    repo: str,
    filename: str,
    hf_cache: Path,
    env: Mapping[str, str],
    should_stop: Callable[[], bool],
) -> str:
    child_env = {**os.environ, "HF_HUB_DISABLE_PROGRESS_BARS": "1"}
    if env.get("HF_TOKEN"):
        child_env["HF_TOKEN"] = env["HF_TOKEN"]
    started = time.monotonic()
    with tempfile.TemporaryFile() as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "agent.models", repo, filename, str(hf_cache)],
            env=child_env,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own group: a stop ends it and nothing else
        )
        try:
            while True:
                try:
                    process.wait(timeout=_POLL_S)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if should_stop():
                    raise ModelResolveError(
                        f"{reference}: download interrupted (the machine is being taken away)"
                    )
                if time.monotonic() - started > DOWNLOAD_TIMEOUT_S:
                    raise ModelResolveError(
                        f"{reference}: download took over {DOWNLOAD_TIMEOUT_S:.0f} s"
                    )
        finally:
            end_process_group(process)
        output.seek(0)
        lines = output.read().decode(errors="replace").splitlines()
    for line in reversed(lines):
        if line.startswith(_PATH_MARK) and process.returncode == 0:
            return line.removeprefix(_PATH_MARK)
        if line.startswith(_ERROR_MARK):
            raise ModelResolveError(f"{reference}: {line.removeprefix(_ERROR_MARK)}")
    raise ModelResolveError(f"{reference}: download failed: exit code {process.returncode}")


def _download_main(argv: list[str]) -> int:
    """The child: one hub file into the cache; prints its path or the failure's kind.

    Only the exception's type is printed: a hub error's text can carry request headers.
    """
    repo, filename, hf_cache = argv
    try:
        from huggingface_hub import hf_hub_download
    except ImportError:
        print(f"{_ERROR_MARK}huggingface_hub is needed to download it", flush=True)  # noqa: T201
        return 1
    try:
        path = hf_hub_download(
            repo, filename, cache_dir=hf_cache, token=os.environ.get("HF_TOKEN") or None
        )
    except Exception as exc:  # any hub failure is this one model's failure
        print(f"{_ERROR_MARK}download failed: {type(exc).__name__}", flush=True)  # noqa: T201
        return 1
    print(f"{_PATH_MARK}{path}", flush=True)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(_download_main(sys.argv[1:]))
