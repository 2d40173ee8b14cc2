"""Run AIPerf and guidellm against an OpenAI-compatible server and read back what they report.

The client-capacity benchmark (issue 2, "Benchmark") prints our load generator's figures beside
those of two popular clients driven the same way: chat completions, streaming, a closed loop
holding ``concurrency`` requests in flight, every reply forced to exactly ``output_tokens``,
no warm-up, the tool pinned to one CPU and its CPU time measured. This module does the
driving and the reading; it imports nothing from either tool.

Each tool lives in its own virtualenv under
``${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench}/tools/<name>-<version>/`` because both pull
heavy, mutually conflicting dependency trees (torch, transformers, pandas, zmq...) that must
never reach the project's own venv. `ensure_tool` creates it on first use (about 1.5 min each
on a 2-core machine) and reuses it afterwards.

Offline operation: neither tool can reach the Hugging Face hub here, and both need a
tokenizer to build prompts of a given token length. `ensure_tokenizer` writes a local
tokenizer folder (one token per UTF-8 byte, ids 0..255 == byte values; the same rule as
refserver/'s ``/tokenize``) that both load with plain
``AutoTokenizer.from_pretrained(<folder>)``. Quirks found on the way (details on
`run_aiperf` and `run_guidellm`):

- AIPerf 0.13 refuses a local tokenizer folder when ``HF_HUB_OFFLINE`` or
  ``TRANSFORMERS_OFFLINE`` is set (it then looks the name up in the hub cache only), and its
  ``--tokenizer builtin`` needs tiktoken's o200k file from the network; so AIPerf runs with
  both variables removed and the local folder, which never touches the network.
- guidellm 0.8.1 loads the folder fine with ``HF_HUB_OFFLINE=1``, which we set.

Usage::

    from benchmarks.thirdparty import run_aiperf, run_guidellm
    run = run_aiperf("http://127.0.0.1:8000", "ref", concurrency=64, input_tokens=128,
                     output_tokens=128, request_count=640, out_dir=Path("out/aiperf"), cpu=0)
    print(run.output_tok_s, run.achieved_concurrency(), run.cpu_s)

Smoke entry: ``python -m benchmarks.thirdparty --url http://127.0.0.1:8000 --concurrency 64``.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import itertools
import json
import logging
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import psutil

__all__ = [
    "TOOL_VERSIONS",
    "RequestRecord",
    "ToolName",
    "ToolRun",
    "cache_dir",
    "ensure_tokenizer",
    "ensure_tool",
    "run_aiperf",
    "run_guidellm",
    "tool_dir",
]

log = logging.getLogger(__name__)

ToolName = Literal["aiperf", "guidellm"]

#: Pinned versions: the issue compares against exactly these releases.
TOOL_VERSIONS: dict[str, str] = {"aiperf": "0.13.0", "guidellm": "0.8.1"}

#: Bumped when the tokenizer folder's content changes, so stale copies are rewritten.
_TOKENIZER_NAME = "tokenizer-bytes-v1"

#: How often the CPU sampler reads the tool's process tree (seconds).
_CPU_SAMPLE_S = 0.2


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclass
class RequestRecord:
    """One request as the tool exported it; times are wall clock (epoch seconds).

    Both tools stamp request start/end with the wall clock (AIPerf ``time.time_ns()``,
    guidellm ``time.time()``), so records from either tool share one time base;
    `ToolRun.epoch_minus_mono_s` converts to the monotonic clock the reference server logs.
    """

    ok: bool
    start_s: float
    end_s: float
    ttft_ms: float | None = None
    output_tokens: int | None = None
    #: The tool's per-request ITL (see `ToolRun.itl_definition`).
    itl_ms: float | None = None
    #: Arrival times (epoch s) of every content chunk, when the tool exports them
    #: (AIPerf: start + TTFT + cumulative inter-chunk gaps; guidellm: not exported).
    chunk_times_s: list[float] | None = None
    #: Time of the first and last token-bearing chunk (guidellm exports these two only).
    first_token_s: float | None = None
    last_token_s: float | None = None
    error: str | None = None
    #: The X-Request-ID header the tool sent (AIPerf does; the reference server logs it as
    #: ``request_id``), for matching records to the server's ground truth.
    x_request_id: str | None = None
    #: The ``id`` of the server's response chunks (guidellm keeps it; the reference server
    #: logs it as ``id``), the other way to match.
    response_id: str | None = None


@dataclass
class ToolRun:
    """What one tool run reported, where it came from, and what it cost.

    ``output_tok_s``, ``ttft_*``, ``itl_*`` and ``requests_*`` are copied from the tool's own
    summary file, untouched (sources on `run_aiperf` / `run_guidellm`); ``records`` are its
    per-request export; ``cpu_*`` and ``wall_s`` are measured here around the subprocess.
    """

    tool: str
    version: str
    argv: list[str]
    #: Environment variables set (value) or removed (None) for the tool process.
    env_changes: dict[str, str | None]
    returncode: int
    out_dir: Path
    concurrency: int
    output_tok_s: float | None = None
    ttft_p50_ms: float | None = None
    ttft_p99_ms: float | None = None
    itl_p50_ms: float | None = None
    itl_p99_ms: float | None = None
    itl_definition: str = ""
    requests_ok: int = 0
    requests_failed: int = 0
    #: guidellm only: requests cut off by the end of the run (neither ok nor errored).
    requests_incomplete: int = 0
    records: list[RequestRecord] = field(default_factory=list)
    #: user+sys CPU seconds of the whole process tree, start to exit (startup included),
    #: from getrusage(RUSAGE_CHILDREN) deltas.
    cpu_s: float = 0.0
    cpu_user_s: float = 0.0
    cpu_sys_s: float = 0.0
    #: CPU seconds of the process tree between the first request's start and the last
    #: request's end, interpolated from psutil samples every 0.2 s (startup excluded).
    cpu_window_s: float | None = None
    wall_s: float = 0.0
    #: time.time() - time.perf_counter() taken just before launch: epoch -> monotonic.
    epoch_minus_mono_s: float = 0.0
    #: Further figures the tool reports, by name (its own achieved concurrency etc.).
    extra: dict[str, float] = field(default_factory=dict)
    timed_out: bool = False
    log_path: Path | None = None

    def ok_records(self) -> list[RequestRecord]:
        """The successful requests."""
        return [r for r in self.records if r.ok]

    def ttfts_ms(self) -> list[float]:
        """Per-request TTFT (ms) of the successful requests, in the tool's own definition."""
        return [r.ttft_ms for r in self.ok_records() if r.ttft_ms is not None]

    def window(self) -> tuple[float, float] | None:
        """The load window (epoch s): first request start to last request start.

        After the last start the closed loop drains by design, so in-flight averages over
        the full span would charge the tool for the tail every tool has.
        """
        if not self.records:
            return None
        starts = [r.start_s for r in self.records]
        return min(starts), max(starts)

    def achieved_concurrency(self, window: tuple[float, float] | None = None) -> float | None:
        """Time-weighted mean of requests in flight (start..end) over ``window``.

        Default window: `window` (first start .. last start). Every exported request counts,
        failed ones too, since they occupied a slot while in flight.
        """
        win = window or self.window()
        if win is None or win[1] <= win[0]:
            return None
        a, b = win
        busy = sum(max(0.0, min(r.end_s, b) - max(r.start_s, a)) for r in self.records)
        return busy / (b - a)

    def span_s(self) -> float | None:
        """First request start to last request end (s), from the records."""
        if not self.records:
            return None
        return max(r.end_s for r in self.records) - min(r.start_s for r in self.records)

    def cpu_s_per_mtok(self, *, window: bool = False) -> float | None:
        """Client CPU seconds per million output tokens (successful requests).

        ``window=True`` uses `cpu_window_s` (startup excluded) instead of `cpu_s`.
        """
        tokens = sum(r.output_tokens or 0 for r in self.ok_records())
        cpu = self.cpu_window_s if window else self.cpu_s
        if not tokens or cpu is None:
            return None
        return cpu / tokens * 1e6

    def to_mono_ns(self, epoch_s: float) -> int:
        """Convert a record time to perf_counter_ns (the reference server's clock)."""
        return int((epoch_s - self.epoch_minus_mono_s) * 1e9)

    def summary(self) -> dict[str, Any]:
        """A flat dict for tables and JSON (records left out)."""
        ttfts = self.ttfts_ms()
        return {
            "tool": f"{self.tool} {self.version}",
            "concurrency": self.concurrency,
            "returncode": self.returncode,
            "ok": self.requests_ok,
            "failed": self.requests_failed,
            "incomplete": self.requests_incomplete,
            "records_ok": len(self.ok_records()),
            "records_failed": len(self.records) - len(self.ok_records()),
            "reported_output_tok_s": self.output_tok_s,
            "reported_ttft_p50_ms": self.ttft_p50_ms,
            "reported_ttft_p99_ms": self.ttft_p99_ms,
            "reported_itl_p50_ms": self.itl_p50_ms,
            "reported_itl_p99_ms": self.itl_p99_ms,
            "records_ttft_p50_ms": _percentile(ttfts, 50),
            "records_ttft_p99_ms": _percentile(ttfts, 99),
            "achieved_concurrency": self.achieved_concurrency(),
            "cpu_s": self.cpu_s,
            "cpu_window_s": self.cpu_window_s,
            "cpu_s_per_mtok": self.cpu_s_per_mtok(),
            "cpu_window_s_per_mtok": self.cpu_s_per_mtok(window=True),
            "wall_s": self.wall_s,
            "span_s": self.span_s(),
            **{f"tool_{k}": v for k, v in self.extra.items()},
        }


def _percentile(values: Sequence[float], q: float) -> float | None:
    """Linear-interpolation percentile (numpy's default), None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


# --------------------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------------------


def cache_dir() -> Path:
    """``$BENCH_CACHE_DIR`` or ``~/.cache/llm-serving-bench``."""
    env = os.environ.get("BENCH_CACHE_DIR")
    return Path(env).expanduser() if env else Path.home() / ".cache" / "llm-serving-bench"


def tool_dir(name: ToolName) -> Path:
    """The virtualenv folder of a tool (may not exist yet)."""
    return cache_dir() / "tools" / f"{name}-{TOOL_VERSIONS[name]}"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """Exclusive lock so two benchmark processes never build the same venv at once."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


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
    with _file_lock(venv.parent / f".{venv.name}.lock"):
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


# --------------------------------------------------------------------------------------
# Running a tool: CPU pinning, CPU accounting, time limit
# --------------------------------------------------------------------------------------


class _CpuSampler(threading.Thread):
    """Samples user+sys CPU of a process tree so CPU inside the load window can be cut out.

    Per live process, cpu_times() user+system plus children_user+children_system: a child's
    time moves from its own entry to its parent's children_* when it is reaped, so the sum
    stays continuous and nothing is counted twice.
    """

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.samples: list[tuple[float, float]] = []
        self._stop_event = threading.Event()

    def _read(self) -> float | None:
        try:
            root = psutil.Process(self.pid)
            procs = [root, *root.children(recursive=True)]
        except psutil.Error:
            return None
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system + t.children_user + t.children_system
        return total

    def run(self) -> None:
        while not self._stop_event.is_set():
            value = self._read()
            if value is not None:
                self.samples.append((time.time(), value))
            self._stop_event.wait(_CPU_SAMPLE_S)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=5)

    def cpu_between(self, a: float, b: float) -> float | None:
        """CPU seconds between epoch times a and b, linearly interpolated."""
        if len(self.samples) < 2 or b <= a:
            return None
        return self._at(b) - self._at(a)

    def _at(self, t: float) -> float:
        s = self.samples
        if t <= s[0][0]:
            return s[0][1]
        for (t0, v0), (t1, v1) in itertools.pairwise(s):
            if t0 <= t <= t1:
                return v0 + (v1 - v0) * ((t - t0) / (t1 - t0) if t1 > t0 else 0.0)
        return s[-1][1]


@dataclass
class _Proc:
    returncode: int
    wall_s: float
    cpu_user_s: float
    cpu_sys_s: float
    timed_out: bool
    sampler: _CpuSampler
    epoch_minus_mono_s: float


def _tool_env(changes: dict[str, str | None]) -> dict[str, str]:
    env = dict(os.environ)
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _run(
    argv: list[str],
    *,
    env_changes: dict[str, str | None],
    cpu: int | None,
    log_path: Path,
    timeout_s: float,
    cwd: Path,
) -> _Proc:
    """Run one tool process to completion, pinned, timed and CPU-accounted.

    CPU: getrusage(RUSAGE_CHILDREN) after minus before = every descendant that was waited
    for (the tools join their worker processes, so the whole tree is in). A child of this
    process that some other thread reaps meanwhile (say a server stopped mid-run) would be
    counted too, so callers start and stop their servers outside the tool run.
    """

    def pin() -> None:  # runs in the child between fork and exec; workers inherit it
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    env = _tool_env(env_changes)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    offset = time.time() - time.perf_counter()
    t0 = time.perf_counter()
    timed_out = False
    with log_path.open("wb") as logf:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=logf,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=cwd,
            preexec_fn=pin,  # only sched_setaffinity: safe between fork and exec
            start_new_session=True,  # own process group: a timeout kills every worker
        )
        sampler = _CpuSampler(proc.pid)
        sampler.start()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            log.warning("%s exceeded %.0f s; stopping its process group", argv[0], timeout_s)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        finally:
            sampler.stop()
    wall = time.perf_counter() - t0
    # Worker processes the tool failed to reap would escape RUSAGE_CHILDREN; end them.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return _Proc(
        returncode=proc.returncode,
        wall_s=wall,
        cpu_user_s=after.ru_utime - before.ru_utime,
        cpu_sys_s=after.ru_stime - before.ru_stime,
        timed_out=timed_out,
        sampler=sampler,
        epoch_minus_mono_s=offset,
    )


def _default_timeout(duration_s: float | None, startup_s: float) -> float:
    """A generous overall limit: every run here is bounded in time as well as requests."""
    if duration_s is not None:
        return startup_s + duration_s * 1.5 + 60
    return startup_s + 600


def _resolve_bounds(
    concurrency: int, request_count: int | None, duration_s: float | None
) -> tuple[int | None, float | None]:
    if concurrency < 1:
        raise ValueError("concurrency must be >= 1")
    if request_count is None and duration_s is None:
        # Unbounded runs are not allowed here; ten rounds of the loop by default.
        request_count = max(10 * concurrency, 32)
    return request_count, duration_s


def _run_tool(
    tool: str,
    argv_for: Callable[..., list[str]],
    parse: Callable[[ToolRun, Path], None],
    *,
    env_changes: dict[str, str | None],
    startup_s: float,
    itl_definition: str,
    base_url: str,
    model: str,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None,
    duration_s: float | None,
    out_dir: Path,
    cpu: int | None,
    timeout_s: float | None,
) -> ToolRun:
    """One bounded run of a third-party client: install it, build its command line with
    `argv_for`, run it pinned to `cpu` with its log in `out_dir`, then `parse` its output
    folder into the `ToolRun`."""
    request_count, duration_s = _resolve_bounds(concurrency, request_count, duration_s)
    exe = ensure_tool(tool)
    tokenizer = ensure_tokenizer()
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = argv_for(
        exe, base_url, model,
        concurrency=concurrency, input_tokens=input_tokens, output_tokens=output_tokens,
        request_count=request_count, duration_s=duration_s, out_dir=out_dir,
        tokenizer=tokenizer,
    )  # fmt: skip
    log_path = out_dir / f"{tool}.log"
    log.info("%s: %s", tool, " ".join(argv))
    proc = _run(
        argv,
        env_changes=env_changes,
        cpu=cpu,
        log_path=log_path,
        timeout_s=timeout_s or _default_timeout(duration_s, startup_s=startup_s),
        cwd=out_dir,
    )
    run = ToolRun(
        tool=tool,
        version=TOOL_VERSIONS[tool],
        argv=argv,
        env_changes=env_changes,
        returncode=proc.returncode,
        out_dir=out_dir,
        concurrency=concurrency,
        itl_definition=itl_definition,
    )
    parse(run, out_dir)
    return _finish(run, proc, log_path)


def _finish(run: ToolRun, proc: _Proc, log_path: Path) -> ToolRun:
    run.returncode = proc.returncode
    run.wall_s = proc.wall_s
    run.cpu_user_s = proc.cpu_user_s
    run.cpu_sys_s = proc.cpu_sys_s
    run.cpu_s = proc.cpu_user_s + proc.cpu_sys_s
    run.timed_out = proc.timed_out
    run.epoch_minus_mono_s = proc.epoch_minus_mono_s
    run.log_path = log_path
    if run.records:
        a = min(r.start_s for r in run.records)
        b = max(r.end_s for r in run.records)
        run.cpu_window_s = proc.sampler.cpu_between(a, b)
    if proc.returncode != 0:
        log.warning("%s exited %s; see %s", run.tool, proc.returncode, log_path)
    return run


# --------------------------------------------------------------------------------------
# AIPerf
# --------------------------------------------------------------------------------------

AIPERF_ITL_DEFINITION = (
    "AIPerf inter_token_latency: per request (request_latency - TTFT) / (output_tokens - 1) "
    "with output_tokens = usage.completion_tokens (--use-server-token-count), i.e. vLLM's "
    "TPOT; p50/p99 over requests. Raw chunk gaps are AIPerf's inter_chunk_latency "
    "(extra icl_p50_ms / icl_p99_ms, pooled over all gaps)."
)


def aiperf_argv(
    exe: Path,
    base_url: str,
    model: str,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None,
    duration_s: float | None,
    out_dir: Path,
    tokenizer: Path,
) -> list[str]:
    """The exact ``aiperf profile`` command line `run_aiperf` uses."""
    argv = [
        str(exe), "profile",
        "--model", model,
        "--url", base_url,
        "--endpoint-type", "chat",
        "--streaming",
        "--tokenizer", str(tokenizer),
        "--concurrency", str(concurrency),
        "--isl", str(input_tokens), "--isl-stddev", "0",
        "--osl", str(output_tokens), "--osl-stddev", "0",
        # AIPerf sends max_completion_tokens=--osl itself; these two make vLLM-style servers
        # generate all of them (the reference server always sends exactly max tokens).
        "--extra-inputs", "ignore_eos:true",
        "--extra-inputs", f"min_tokens:{output_tokens}",
        # Count output tokens from usage: the local byte tokenizer is not the model's.
        "--use-server-token-count",
        # Unique prompts: the default pool of 100 repeats prompts past 100 requests.
        "--num-dataset-entries", str(request_count or max(100, 20 * concurrency)),
        "--random-seed", "42",
        "--artifact-dir", str(out_dir),
        "--export-level", "records",
        "--ui-type", "none",
        # Off: a /metrics scrape of the server and DCGM probes on localhost:9400/9401.
        "--no-server-metrics",
        "--no-gpu-telemetry",
    ]  # fmt: skip
    if request_count is not None:
        argv += ["--request-count", str(request_count)]
    if duration_s is not None:
        # Requests still streaming at the end get 30 s to finish and are then counted.
        argv += ["--benchmark-duration", f"{duration_s:g}", "--benchmark-grace-period", "30"]
    # No --warmup-* flag: AIPerf has no warm-up phase unless one is asked for.
    return argv


def run_aiperf(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None = None,
    duration_s: float | None = None,
    out_dir: Path,
    cpu: int | None,
    timeout_s: float | None = None,
) -> ToolRun:
    """Run ``aiperf profile`` once (closed loop at ``concurrency`` streams) and parse it.

    Bounds: ``request_count`` and/or ``duration_s`` (default ten rounds of the loop), plus an
    overall ``timeout_s`` after which the tool's process group is killed.

    Sources, all under ``out_dir`` (``--artifact-dir``):

    - ``profile_export_aiperf.json`` (summary): ``output_tok_s`` =
      ``output_token_throughput.avg`` (total output tokens / (last response - first
      request)); ``ttft_p50/p99_ms`` = ``time_to_first_token.p50/.p99`` (first non-empty
      content chunk; the role-only chunk does not count); ``itl_p50/p99_ms`` =
      ``inter_token_latency.p50/.p99`` (see `AIPERF_ITL_DEFINITION`); ``extra``:
      ``effective_concurrency`` (.avg, AIPerf's own in-flight average),
      ``benchmark_duration_s``, ``icl_p50_ms``/``icl_p99_ms`` (``inter_chunk_latency``),
      ``credit_to_start_p50_ms`` (scheduler issue -> request send), ``request_count``.
    - ``profile_export.jsonl`` (one line per request): ``metadata.request_start_ns`` /
      ``request_end_ns`` (wall clock) -> ``start_s``/``end_s``;
      ``metrics.time_to_first_token``, ``inter_token_latency``, ``output_sequence_length``;
      ``metrics.inter_chunk_latency`` (list, ms) -> ``chunk_times_s`` = start + TTFT +
      cumulative gaps; ``metadata.x_request_id`` (also sent as the X-Request-ID header);
      a line with an ``error`` object is a failed request.
      ``requests_ok``/``requests_failed`` are counted from these lines.
    - ``aiperf.log`` (stdout+stderr, ours) and ``logs/aiperf.log`` (the tool's).

    Environment: ``HF_HUB_OFFLINE`` and ``TRANSFORMERS_OFFLINE`` are removed (AIPerf 0.13
    only loads a local tokenizer folder when they are unset); ``HF_HUB_DISABLE_TELEMETRY=1``.
    """
    env_changes: dict[str, str | None] = {
        "HF_HUB_OFFLINE": None,
        "TRANSFORMERS_OFFLINE": None,
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
    }
    return _run_tool(
        "aiperf",
        aiperf_argv,
        _parse_aiperf,
        env_changes=env_changes,
        startup_s=60,
        itl_definition=AIPERF_ITL_DEFINITION,
        base_url=base_url,
        model=model,
        concurrency=concurrency,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_count=request_count,
        duration_s=duration_s,
        out_dir=out_dir,
        cpu=cpu,
        timeout_s=timeout_s,
    )


def _stat(d: dict[str, Any], metric: str, stat: str) -> float | None:
    value = (d.get(metric) or {}).get(stat)
    return float(value) if isinstance(value, int | float) else None


def _parse_aiperf(run: ToolRun, out_dir: Path) -> None:
    summary_path = out_dir / "profile_export_aiperf.json"
    if summary_path.is_file():
        s = json.loads(summary_path.read_text())
        run.output_tok_s = _stat(s, "output_token_throughput", "avg")
        run.ttft_p50_ms = _stat(s, "time_to_first_token", "p50")
        run.ttft_p99_ms = _stat(s, "time_to_first_token", "p99")
        run.itl_p50_ms = _stat(s, "inter_token_latency", "p50")
        run.itl_p99_ms = _stat(s, "inter_token_latency", "p99")
        for name, metric, stat in (
            ("effective_concurrency", "effective_concurrency", "avg"),
            ("benchmark_duration_s", "benchmark_duration", "avg"),
            ("icl_p50_ms", "inter_chunk_latency", "p50"),
            ("icl_p99_ms", "inter_chunk_latency", "p99"),
            ("credit_to_start_p50_ms", "credit_to_start_latency", "p50"),
            ("request_count", "request_count", "avg"),
            ("error_request_count", "error_request_count", "avg"),
        ):
            value = _stat(s, metric, stat)
            if value is not None:
                run.extra[name] = value
    else:
        log.warning("aiperf wrote no %s", summary_path)
    records_path = out_dir / "profile_export.jsonl"
    if not records_path.is_file():
        log.warning("aiperf wrote no %s", records_path)
        return
    with records_path.open() as fh:
        for line in fh:
            if line.strip():
                run.records.append(_aiperf_record(json.loads(line)))
    run.requests_ok = sum(r.ok for r in run.records)
    run.requests_failed = sum(not r.ok for r in run.records)


def _aiperf_record(d: dict[str, Any]) -> RequestRecord:
    meta = d.get("metadata") or {}
    metrics = d.get("metrics") or {}

    def value(name: str) -> Any:
        return (metrics.get(name) or {}).get("value")

    start = meta.get("request_start_ns") or meta.get("credit_issued_ns") or 0
    end = meta.get("request_end_ns") or start
    start_s, end_s = start / 1e9, end / 1e9
    error = d.get("error")
    ttft = value("time_to_first_token")
    gaps = value("inter_chunk_latency")
    chunk_times: list[float] | None = None
    if isinstance(ttft, int | float):
        chunk_times = [start_s + ttft / 1e3]
        if isinstance(gaps, list):
            for gap in gaps:
                chunk_times.append(chunk_times[-1] + float(gap) / 1e3)
    osl = value("output_sequence_length")
    itl = value("inter_token_latency")
    return RequestRecord(
        ok=error is None,
        start_s=start_s,
        end_s=end_s,
        ttft_ms=float(ttft) if isinstance(ttft, int | float) else None,
        output_tokens=int(osl) if isinstance(osl, int | float) else None,
        itl_ms=float(itl) if isinstance(itl, int | float) else None,
        chunk_times_s=chunk_times,
        first_token_s=chunk_times[0] if chunk_times else None,
        last_token_s=chunk_times[-1] if chunk_times else None,
        error=json.dumps(error) if error is not None else None,
        x_request_id=meta.get("x_request_id"),
    )


# --------------------------------------------------------------------------------------
# guidellm
# --------------------------------------------------------------------------------------

GUIDELLM_ITL_DEFINITION = (
    "guidellm inter_token_latency_ms: per request (last_token_iteration - "
    "first_token_iteration) / (output_tokens - 1), output_tokens = usage.completion_tokens, "
    "i.e. vLLM's TPOT; p50/p99 over tokens (each request's value weighted by "
    "output_tokens - 1). guidellm exports no per-chunk times."
)


def guidellm_argv(
    exe: Path,
    base_url: str,
    model: str,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None,
    duration_s: float | None,
    out_dir: Path,
    tokenizer: Path,
) -> list[str]:
    """The exact ``guidellm run`` command line `run_guidellm` uses.

    guidellm 0.8's CLI takes ``kind=...,key=value`` strings (dots for nesting) per option.
    """
    backend = ",".join([
        "kind=openai_http",
        f"target={base_url}",
        f"model={model}",
        "request_format=/v1/chat/completions",
        "stream=true",
        # httpx over plain http would stay HTTP/1.1 anyway; said explicitly for the record.
        "http2=false",
        # guidellm itself adds max_completion_tokens=<output_tokens>, ignore_eos=true and
        # stop=null to each request; min_tokens is ours, as for AIPerf.
        f"extras.body.min_tokens={output_tokens}",
    ])  # fmt: skip
    argv = [
        str(exe), "run",
        "--backend", backend,
        # Warm-up/cool-down: profile defaults are none (warmup/cooldown unset).
        "--profile", f"kind=concurrent,streams={concurrency}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer}",
        "--data", f"kind=synthetic_text,prompt_tokens={input_tokens},output_tokens={output_tokens}",
        "--seed", "kind=static,value=42",
        "--output", f"kind=json,path={out_dir / 'benchmarks.json'}",
        "--disable-console-interactive",
    ]  # fmt: skip
    if request_count is not None:
        argv += ["--constraint", f"kind=max_requests,count={request_count}"]
    if duration_s is not None:
        argv += ["--constraint", f"kind=max_duration,seconds={duration_s:g}"]
    return argv


def run_guidellm(
    base_url: str,
    model: str,
    *,
    concurrency: int,
    input_tokens: int,
    output_tokens: int,
    request_count: int | None = None,
    duration_s: float | None = None,
    out_dir: Path,
    cpu: int | None,
    timeout_s: float | None = None,
) -> ToolRun:
    """Run ``guidellm run`` once (profile ``concurrent`` at ``concurrency`` streams), parse it.

    Bounds as `run_aiperf`. guidellm starts up slowly (~25 s of imports and worker spawning
    on one core) before the first request; ``wall_s`` and ``cpu_s`` include that,
    ``cpu_window_s`` does not.

    Sources, all in ``out_dir/benchmarks.json`` (``--output kind=json``), first benchmark:

    - ``metrics.output_tokens_per_second.total.mean`` -> ``output_tok_s`` (the console's
      "Output Tokens Per Sec", over all requests).
    - ``metrics.time_to_first_token_ms.successful.percentiles.p50/.p99`` -> ``ttft_*``
      (first chunk that produced a token).
    - ``metrics.inter_token_latency_ms.successful.percentiles.p50/.p99`` -> ``itl_*`` (see
      `GUIDELLM_ITL_DEFINITION`).
    - ``metrics.request_totals`` successful/errored/incomplete -> ``requests_*``.
    - ``extra``: ``request_concurrency_mean`` (``metrics.request_concurrency.total.mean``,
      guidellm's own in-flight average), ``duration_s``, ``worker_processes``
      (``scheduler_state.num_processes``), ``tpot_p50_ms`` (its TPOT includes the TTFT).
    - ``requests.successful/errored/incomplete[]`` -> ``records``: ``request_start_time``,
      ``request_end_time`` (wall clock), ``time_to_first_token_ms``, ``output_tokens``,
      ``inter_token_latency_ms``, ``info.timings.first_token_iteration`` /
      ``last_token_iteration`` (the only chunk times it keeps), ``info.error``,
      ``response_id`` (the server's chunk ``id``).

    Environment: ``HF_HUB_OFFLINE=1``, ``HF_HUB_DISABLE_TELEMETRY=1``.
    """
    env_changes: dict[str, str | None] = {
        "HF_HUB_OFFLINE": "1",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "PYTHONUNBUFFERED": "1",
        # Wide, plain console tables in the log instead of a terminal-sized rich layout.
        "COLUMNS": "200",
    }
    return _run_tool(
        "guidellm",
        guidellm_argv,
        lambda run, out: _parse_guidellm(run, out / "benchmarks.json"),
        env_changes=env_changes,
        startup_s=120,
        itl_definition=GUIDELLM_ITL_DEFINITION,
        base_url=base_url,
        model=model,
        concurrency=concurrency,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_count=request_count,
        duration_s=duration_s,
        out_dir=out_dir,
        cpu=cpu,
        timeout_s=timeout_s,
    )


def _dist(metrics: dict[str, Any], metric: str, status: str, stat: str) -> float | None:
    """One statistic from a guidellm StatusDistributionSummary (``pNN`` or a plain key)."""
    d = (metrics.get(metric) or {}).get(status) or {}
    value = (d.get("percentiles") or {}).get(stat) if stat.startswith("p") else d.get(stat)
    return float(value) if isinstance(value, int | float) else None


def _parse_guidellm(run: ToolRun, path: Path) -> None:
    if not path.is_file():
        log.warning("guidellm wrote no %s", path)
        return
    report = json.loads(path.read_text())
    benchmarks = report.get("benchmarks") or []
    if not benchmarks:
        log.warning("guidellm report %s has no benchmark", path)
        return
    b = benchmarks[0]
    m = b.get("metrics") or {}
    run.output_tok_s = _dist(m, "output_tokens_per_second", "total", "mean")
    run.ttft_p50_ms = _dist(m, "time_to_first_token_ms", "successful", "p50")
    run.ttft_p99_ms = _dist(m, "time_to_first_token_ms", "successful", "p99")
    run.itl_p50_ms = _dist(m, "inter_token_latency_ms", "successful", "p50")
    run.itl_p99_ms = _dist(m, "inter_token_latency_ms", "successful", "p99")
    totals = m.get("request_totals") or {}
    run.requests_ok = int(totals.get("successful") or 0)
    run.requests_failed = int(totals.get("errored") or 0)
    run.requests_incomplete = int(totals.get("incomplete") or 0)
    for name, value in (
        ("request_concurrency_mean", _dist(m, "request_concurrency", "total", "mean")),
        ("tpot_p50_ms", _dist(m, "time_per_output_token_ms", "successful", "p50")),
        ("duration_s", b.get("duration")),
        ("worker_processes", (b.get("scheduler_state") or {}).get("num_processes")),
        # Its scheduler's own count, which can exceed request_totals (seen: 1280 vs 1272
        # flat out at 64 streams, all 1280 present in requests.successful).
        ("scheduler_successful", (b.get("scheduler_state") or {}).get("successful_requests")),
    ):
        if isinstance(value, int | float):
            run.extra[name] = float(value)
    requests = b.get("requests") or {}
    for status in ("successful", "errored", "incomplete"):
        for r in requests.get(status) or []:
            run.records.append(_guidellm_record(r, ok=status == "successful"))


def _guidellm_record(r: dict[str, Any], *, ok: bool) -> RequestRecord:
    info = r.get("info") or {}
    timings = info.get("timings") or {}
    start = r.get("request_start_time") or timings.get("request_start") or 0.0
    end = r.get("request_end_time") or timings.get("request_end") or start

    def num(v: Any) -> float | None:
        return float(v) if isinstance(v, int | float) else None

    out = r.get("output_tokens")
    error = info.get("error")
    return RequestRecord(
        ok=ok,
        start_s=float(start),
        end_s=float(end),
        ttft_ms=num(r.get("time_to_first_token_ms")),
        output_tokens=int(out) if isinstance(out, int | float) else None,
        itl_ms=num(r.get("inter_token_latency_ms")),
        first_token_s=num(timings.get("first_token_iteration")),
        last_token_s=num(timings.get("last_token_iteration")),
        error=str(error) if error else (None if ok else "incomplete"),
        response_id=r.get("response_id"),
    )


# --------------------------------------------------------------------------------------
# Smoke entry
# --------------------------------------------------------------------------------------


def _first_model(base_url: str) -> str:
    import httpx  # the project venv has it; imported here so the module loads without it

    resp = httpx.get(base_url.rstrip("/") + "/v1/models", timeout=10)
    resp.raise_for_status()
    return str(resp.json()["data"][0]["id"])


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return str(value)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the chosen tools once against ``--url`` and print a short summary each."""
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.thirdparty",
        description="Drive AIPerf and/or guidellm against an OpenAI-compatible server.",
    )
    p.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--model", default=None, help="model name (default: first of /v1/models)")
    p.add_argument("--tool", choices=["aiperf", "guidellm", "both"], default="both")
    p.add_argument("--concurrency", type=int, default=64, help="streams kept in flight")
    p.add_argument("--input-tokens", type=int, default=128)
    p.add_argument("--output-tokens", type=int, default=128)
    p.add_argument("--requests", type=int, default=None, help="requests per run")
    p.add_argument("--duration", type=float, default=None, help="seconds per run")
    p.add_argument("--cpu", type=int, default=0, help="CPU to pin the tool to (-1: none)")
    p.add_argument("--out", type=Path, default=Path("results/thirdparty"), help="output root")
    p.add_argument("--json", action="store_true", help="print the summaries as JSON")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    model = args.model or _first_model(args.url)
    tools: list[ToolName] = ["aiperf", "guidellm"] if args.tool == "both" else [args.tool]
    runners = {"aiperf": run_aiperf, "guidellm": run_guidellm}
    stamp = time.strftime("%Y%m%d-%H%M%S")
    rc = 0
    for tool in tools:
        run = runners[tool](
            args.url,
            model,
            concurrency=args.concurrency,
            input_tokens=args.input_tokens,
            output_tokens=args.output_tokens,
            request_count=args.requests,
            duration_s=args.duration,
            out_dir=args.out / f"{stamp}-{tool}-c{args.concurrency}",
            cpu=None if args.cpu < 0 else args.cpu,
        )
        summary = run.summary()
        if args.json:
            print(json.dumps(summary))
        else:
            print(f"\n== {summary['tool']} at {args.concurrency} streams ({run.out_dir})")
            print("   " + " ".join(run.argv))
            for key, value in summary.items():
                if key != "tool":
                    print(f"   {key:28s} {_fmt(value)}")
        if run.returncode != 0 or run.requests_ok == 0:
            rc = 1
    return rc


if __name__ == "__main__":
    sys.exit(main())
