"""Each tool in its own pinned virtualenv under the project cache, and the offline byte
tokenizer both tools load (`ensure_tool`, `ensure_tokenizer`)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.thirdparty.records import _TOKENIZER_NAME, TOOL_VERSIONS, ToolName
from contract.files import locked

log = logging.getLogger(__name__)


def cache_dir() -> Path:
    """``$BENCH_CACHE_DIR`` or ``~/.cache/llm-serving-bench``."""
    env = os.environ.get("BENCH_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-serving-bench"


def tool_dir(name: ToolName) -> Path:
    """The virtualenv folder of a tool (may not exist yet)."""
    return cache_dir() / "tools" / f"{name}-{TOOL_VERSIONS[name]}"


def _installed_version(venv: Path, dist: str) -> str | None:
    """The version of ``dist`` inside ``venv``, or None if absent or the venv is broken."""
    py = venv / "bin" / "python"
    if not py.exists():
        return None
    proc = subprocess.run(
        [str(py), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.stdout.strip() if proc.returncode == 0 else None


def _local_cpu_torch_wheel(venv: Path) -> Path | None:
    """A CPU-only torch wheel in pip's configured find-links folders, if this machine has one.

    guidellm requires ``torch`` (its data loader is torch's DataLoader) but no GPU; left to
    itself pip takes the CUDA build from PyPI, which drags ~4.5 GB of nvidia-* wheels and
    triton into the venv. A local ``+cpu`` wheel gives the same guidellm in ~1.5 GB.
    """
    proc = subprocess.run(
        [str(venv / "bin" / "python"), "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    )
    folders: list[Path] = []
    for line in proc.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip().endswith("find-links"):
            for item in value.strip().strip("'\"").split():
                if item.startswith("file://"):
                    item = item[len("file://") :]
                if "://" not in item:
                    folders.append(Path(item))
    tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    wheels = sorted(
        w
        for folder in folders
        if folder.is_dir()
        for w in folder.glob(f"torch-*+cpu-{tag}-{tag}-*linux*x86_64.whl")
    )
    return wheels[-1] if wheels else None


def ensure_tool(name: ToolName) -> Path:
    """Create (first call) or reuse the tool's own virtualenv; return its executable.

    The venv is ``tool_dir(name)``; it holds exactly ``<name>==<pinned version>``. A marker
    file written after a successful install makes reuse a stat() call; a venv without it
    (interrupted install) is checked with importlib.metadata and rebuilt if wrong.
    """
    if name not in TOOL_VERSIONS:
        raise ValueError(f"unknown tool {name!r}; expected one of {sorted(TOOL_VERSIONS)}")
    version = TOOL_VERSIONS[name]
    venv = tool_dir(name)
    exe = venv / "bin" / name
    marker = venv / ".bench-installed"
    spec = f"{name}=={version}"
    if marker.is_file() and marker.read_text().strip() == spec and exe.exists():
        return exe
    # Two benchmark processes never build the same venv at once.
    with locked(venv.parent / f".{venv.name}.lock"):
        if marker.is_file() and marker.read_text().strip() == spec and exe.exists():
            return exe
        if exe.exists() and _installed_version(venv, name) == version:
            marker.write_text(spec + "\n")
            return exe
        if venv.exists():
            log.info("removing incomplete %s venv at %s", name, venv)
            shutil.rmtree(venv)
        t0 = time.monotonic()
        log.info("installing %s into %s (first use; takes a minute or two)", spec, venv)
        # The base interpreter, not the project venv's, so the tool venv does not chain
        # to ours; sys._base_executable is the interpreter the project venv was made from.
        base_python = getattr(sys, "_base_executable", None) or sys.executable
        subprocess.run([base_python, "-m", "venv", str(venv)], check=True)
        pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check"]
        extra: list[str] = []
        if name == "guidellm":
            wheel = _local_cpu_torch_wheel(venv)
            if wheel is not None:
                log.info("guidellm: using local CPU torch wheel %s", wheel.name)
                extra.append(str(wheel))
        proc = subprocess.run([*pip, "--quiet", spec, *extra], check=False)
        if proc.returncode != 0 or not exe.exists():
            raise RuntimeError(f"pip install {spec} into {venv} failed (exit {proc.returncode})")
        marker.write_text(spec + "\n")
        log.info("installed %s in %.0f s", spec, time.monotonic() - t0)
    return exe


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character map, which a ByteLevel pre-tokenizer expects."""
    printable = [
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    ]
    chars = list(printable)
    n = 0
    for b in range(256):
        if b not in printable:
            printable.append(b)
            chars.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(printable, chars, strict=True)}


def ensure_tokenizer() -> Path:
    """Write (once) and return a local Hugging Face tokenizer folder: one token per byte.

    A ``tokenizers`` BPE model with the 256 byte symbols and no merges, so token id ==
    byte value and any text round-trips exactly; the same counting rule as the reference
    server's ``/tokenize`` (which adds 8 chat-template tokens to chat prompts on top).
    Both tools load it with ``AutoTokenizer.from_pretrained(<folder>)``, no network.
    """
    folder = cache_dir() / "tools" / _TOKENIZER_NAME
    if (folder / "tokenizer.json").is_file() and (folder / "tokenizer_config.json").is_file():
        return folder
    mapping = _bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [],
        "normalizer": None,
        "pre_tokenizer": {**byte_level, "use_regex": False},
        "post_processor": None,
        "decoder": {**byte_level, "use_regex": False},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": None,
            "end_of_word_suffix": None,
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {mapping[b]: b for b in range(256)},
            "merges": [],
        },
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "model_max_length": 1 << 30,
        "clean_up_tokenization_spaces": False,
    }
    tmp = folder.with_name(f"{folder.name}.tmp{os.getpid()}")
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / "tokenizer.json").write_text(json.dumps(tokenizer, ensure_ascii=False))
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    try:
        tmp.rename(folder)
    except OSError:
        # Another process won the race; its folder is identical.
        shutil.rmtree(tmp, ignore_errors=True)
    return folder
