"""llama.cpp's `llama-server`, built from the source PyPI's llama-cpp-python sdist vendors.

This module owns that build: the pinned sdist (version and sha256), the CMake flags
(CPU, or CUDA for one compute capability), the cache layout, the lock that keeps two
processes from building at once, the build log, and the build id the manifest records.

Cache layout, under `${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench}/llama.cpp/`:

    sdist/llama_cpp_python-<version>.tar.gz   the download, shared by every key
    <key>/src/                                 vendor/llama.cpp extracted from the sdist
    <key>/build/                               CMake's build tree (kept: a rerun resumes it)
    <key>/bin/llama-server                     the binary handed out
    <key>/build.log                            every step's output, with START/END lines
    <key>/build.json                           the stamp: written last, read by the fast path
    <key>/.lock                                flock, held while building

`LLAMA_SERVER_BIN` in the environment skips all of it and describes that binary instead.
`LLAMA_CPP_SOURCE_DIR` builds from an already extracted tree of the pinned commit instead of
downloading the sdist (for machines that reach no package registry).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.errors import BenchError
from contract.files import LockTimeout, locked, sha256_file, tail

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# Pinned so that a changed upload on the index (or a proxy) cannot change what we build.
LLAMA_CPP_PYTHON_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The llama.cpp commit that sdist vendors (its submodule HEAD; checked at extraction) and
# upstream's build number for it (release tag b11312). The sdist ships a depth-1 clone, so
# the number cannot be counted from the source: it is pinned beside the version.
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_BUILD_NUMBER = 11312
# What `llama-server --version` reports. Set explicitly: CMake's own git probe would find
# no history and report build 1, which reads like a real (and very old) build.
BUILD_INFO_FLAGS: tuple[str, ...] = (
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT[:9]}",
)

STAMP_NAME = "build.json"
# Left in every extracted tree, naming its commit; lets `LLAMA_CPP_SOURCE_DIR` reuse a tree
# on a machine that cannot download the sdist (the GPU check machine, an offline host).
SOURCE_COMMIT_FILE = ".bench-llama-cpp-commit"
SOURCE_DIR_ENV = "LLAMA_CPP_SOURCE_DIR"
LOG_NAME = "build.log"
BINARY_NAME = "llama-server"

DOWNLOAD_TIMEOUT_S = 900
CONFIGURE_TIMEOUT_S = 900
# A CUDA build for one architecture on a small machine can take most of an hour.
BUILD_TIMEOUT_S = 3 * 3600
LOCK_TIMEOUT_S = BUILD_TIMEOUT_S + CONFIGURE_TIMEOUT_S + DOWNLOAD_TIMEOUT_S
LOG_TAIL_LINES = 40

# Flags every build shares: only the server and what it links, nothing fetched at build
# time (the web UI would otherwise be downloaded from a model hub), a self-contained
# binary (static libraries), and code tuned for the CPU it is built on.
BASE_CMAKE_FLAGS: tuple[str, ...] = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DGGML_NATIVE=ON",
    "-DGGML_CCACHE=OFF",
    "-DLLAMA_BUILD_COMMON=ON",
    "-DLLAMA_BUILD_TOOLS=ON",
    "-DLLAMA_BUILD_SERVER=ON",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_BUILD_UI=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    # This llama.cpp dropped libcurl (LLAMA_CURL is deprecated); OpenSSL is what would
    # give it HTTPS model downloads, which a benchmark must never do.
    "-DLLAMA_OPENSSL=OFF",
)


class LlamaCppBuildError(BenchError, RuntimeError):
    """A step of the llama.cpp build failed; the message carries the build log's tail."""


@dataclass(frozen=True)
class LlamaCppBuild:
    """What exactly is serving: the manifest's build id for llama.cpp."""

    binary: Path
    sha256: str
    backend: str  # 'cpu', 'cuda-sm90', ...; 'external' for LLAMA_SERVER_BIN
    sdist_version: str | None  # llama-cpp-python version the source came from
    llama_cpp_commit: str | None  # full commit hash of the vendored llama.cpp
    build_number: int | None  # llama.cpp's bNNNN release number; None when unknown
    cmake_flags: tuple[str, ...]  # every -D flag the build was configured with
    cache_dir: Path | None
    version_text: str = ""  # first line of `llama-server --version`

    @property
    def build_id(self) -> str:
        """Short id in the seeds' `{ref}-sm{arch}` style, e.g. `b11312-0c1e57098-cpu`."""
        ref = (self.llama_cpp_commit or "unknown")[:9]
        if self.build_number:
            ref = f"b{self.build_number}-{ref}"
        return f"{ref}-{self.backend}"

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["binary"] = str(self.binary)
        d["cache_dir"] = str(self.cache_dir) if self.cache_dir else None
        d["cmake_flags"] = list(self.cmake_flags)
        d["build_id"] = self.build_id
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> LlamaCppBuild:
        return cls(
            binary=Path(d["binary"]),
            sha256=d["sha256"],
            backend=d["backend"],
            sdist_version=d.get("sdist_version"),
            llama_cpp_commit=d.get("llama_cpp_commit"),
            build_number=d.get("build_number"),
            cmake_flags=tuple(d.get("cmake_flags", ())),
            cache_dir=Path(d["cache_dir"]) if d.get("cache_dir") else None,
            version_text=d.get("version_text", ""),
        )


def default_cache_root() -> Path:
    env = os.environ.get("BENCH_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "llm-serving-bench"


def normalize_cuda_arch(cuda_arch: str) -> str:
    """'sm_90', '9.0', '90' -> '90'; '90a' stays (Hopper's arch-specific features)."""
    arch = cuda_arch.strip().lower().removeprefix("sm_").removeprefix("sm").replace(".", "")
    if not re.fullmatch(r"\d{2,3}[a-z]?", arch):
        raise ValueError(
            f"cuda_arch: expected a compute capability like '90' or '8.9', got {cuda_arch!r}"
        )
    return arch


def cmake_flags_for(cuda_arch: str | None) -> tuple[tuple[str, ...], str]:
    """The CMake flags and the backend name for a CPU build or a CUDA build for one arch."""
    if cuda_arch is None:
        return (*BASE_CMAKE_FLAGS, "-DGGML_CUDA=OFF"), "cpu"
    arch = normalize_cuda_arch(cuda_arch)
    flags = [*BASE_CMAKE_FLAGS, "-DGGML_CUDA=ON", f"-DCMAKE_CUDA_ARCHITECTURES={arch}"]
    nvcc = _find_nvcc()
    if nvcc is not None:
        # Deep Learning AMIs ship nvcc outside PATH; CMake would not find it alone.
        flags.append(f"-DCMAKE_CUDA_COMPILER={nvcc}")
    return tuple(flags), f"cuda-sm{arch}"


def _find_nvcc() -> str | None:
    found = shutil.which("nvcc")
    if found:
        return found
    candidates = [
        Path("/usr/local/cuda/bin/nvcc"),
        *sorted(Path("/usr/local").glob("cuda-*/bin/nvcc")),
    ]
    for cand in candidates:
        if cand.is_file() and os.access(cand, os.X_OK):
            return str(cand)
    return None


def _cpu_signature() -> str:
    """What GGML_NATIVE tunes for: a binary built for one CPU may not run on another."""
    flags = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = " ".join(sorted(line.split(":", 1)[1].split()))
                break
    return f"{platform.machine()}|{flags or platform.processor()}"


def cache_key(version: str, flags: tuple[str, ...], backend: str) -> str:
    h = hashlib.sha256()
    for part in (version, LLAMA_CPP_PYTHON_SDIST_SHA256, backend, *flags, _cpu_signature()):
        h.update(part.encode())
        h.update(b"\0")
    return f"{version}-{backend}-{h.hexdigest()[:12]}"




def _log_tail(path: Path) -> str:
    return tail(path, LOG_TAIL_LINES, unreadable="(no log)")


class _StepLog:
    """START/END lines with time stamps, to the logger and to the build log file."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path

    def _write(self, line: str) -> None:
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        with self.log_path.open("a") as f:
            f.write(f"[{stamp}] {line}\n")
        log.info("%s", line)

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        self._write(f"START {name}")
        t0 = time.monotonic()
        try:
            yield
        except BaseException:
            self._write(f"FAIL {name} {time.monotonic() - t0:.1f}s")
            raise
        self._write(f"END {name} {time.monotonic() - t0:.1f}s")

    def run(self, name: str, argv: list[str], *, timeout_s: float, cwd: Path | None = None) -> None:
        """Run one command with its output appended to the build log; raise with the tail."""
        with self.log_path.open("a") as out:
            out.write(f"$ {' '.join(argv)}\n")
            out.flush()
            try:
                proc = subprocess.run(
                    argv,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    cwd=cwd,
                    timeout=timeout_s,
                    check=False,
                    stdin=subprocess.DEVNULL,
                )
            except subprocess.TimeoutExpired as e:
                raise LlamaCppBuildError(
                    f"llama.cpp build step {name!r} timed out after {timeout_s:.0f}s; "
                    f"last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
                ) from e
            except OSError as e:
                raise LlamaCppBuildError(
                    f"llama.cpp build step {name!r}: cannot run {argv[0]}: {e}"
                ) from e
        if proc.returncode != 0:
            raise LlamaCppBuildError(
                f"llama.cpp build step {name!r} failed (exit {proc.returncode}); "
                f"last lines of {self.log_path}:\n{_log_tail(self.log_path)}"
            )


@contextlib.contextmanager
def _file_lock(path: Path, timeout_s: float) -> Iterator[None]:
    """An exclusive lock, waited for at most timeout_s (another process may be building)."""

    def waiting() -> None:
        log.info("waiting for another process building in %s", path.parent)

    try:
        with locked(path, timeout_s, on_wait=waiting):
            yield
    except LockTimeout:
        raise LlamaCppBuildError(
            f"llama.cpp build lock {path} still held after {timeout_s:.0f}s"
        ) from None


def _read_version_text(binary: Path) -> str:
    """The first 'version:' line `llama-server --version` prints (on stderr)."""
    try:
        proc = subprocess.run(
            [str(binary), "--version"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
            stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LlamaCppBuildError(f"llama-server at {binary} does not run: {e}") from e
    text = (proc.stdout + proc.stderr).strip()
    for line in text.splitlines():
        if line.startswith("version:"):
            return line.strip()
    raise LlamaCppBuildError(
        f"llama-server at {binary} --version printed no version line:\n{text[-2000:]}"
    )


def _load_stamp(key_dir: Path, flags: tuple[str, ...]) -> LlamaCppBuild | None:
    stamp = key_dir / STAMP_NAME
    try:
        build = LlamaCppBuild.from_dict(json.loads(stamp.read_text()))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if build.cmake_flags != flags or not build.binary.is_file():
        return None
    # The hash check is what makes the cache trustworthy (a half-copied or replaced
    # binary is rebuilt); it costs tens of milliseconds.
    if sha256_file(build.binary) != build.sha256:
        log.warning("llama-server at %s does not match its stamp; rebuilding", build.binary)
        return None
    return build


def _download_sdist(sdist_dir: Path, steps: _StepLog) -> Path:
    sdist = sdist_dir / f"llama_cpp_python-{LLAMA_CPP_PYTHON_VERSION}.tar.gz"
    if sdist.is_file() and sha256_file(sdist) == LLAMA_CPP_PYTHON_SDIST_SHA256:
        return sdist
    sdist_dir.mkdir(parents=True, exist_ok=True)
    with steps.step("download-sdist"), tempfile.TemporaryDirectory(dir=sdist_dir) as tmp:
        steps.run(
            "download-sdist",
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--no-binary",
                ":all:",
                "--disable-pip-version-check",
                "-d",
                tmp,
                f"llama-cpp-python=={LLAMA_CPP_PYTHON_VERSION}",
            ],
            timeout_s=DOWNLOAD_TIMEOUT_S,
        )
        got = sorted(Path(tmp).glob("llama_cpp_python-*.tar.gz"))
        if not got:
            raise LlamaCppBuildError(f"pip download left no llama_cpp_python sdist in {tmp}")
        digest = sha256_file(got[0])
        if digest != LLAMA_CPP_PYTHON_SDIST_SHA256:
            raise LlamaCppBuildError(
                f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} sdist sha256 {digest} "
                f"!= pinned {LLAMA_CPP_PYTHON_SDIST_SHA256}"
            )
        got[0].replace(sdist)
    return sdist


def _extract_vendor(sdist: Path, src_dir: Path, steps: _StepLog) -> None:
    """Extract vendor/llama.cpp and check that it is the pinned commit.

    The sdist carries the submodule's git HEAD (not its history); the CHANGELOG's entry
    for the release names the commit too, as a fallback. File times come from the
    archive, so re-extracting does not make an existing build tree out of date.
    """
    with steps.step("extract"):
        if src_dir.exists():
            shutil.rmtree(src_dir)
        src_dir.mkdir(parents=True)
        commit: str | None = None
        with tarfile.open(sdist, "r:gz") as tar:
            members = tar.getmembers()
            top = members[0].name.split("/", 1)[0]
            vendor_prefix = f"{top}/vendor/llama.cpp/"
            gitdir = f"{top}/.git/modules/vendor/llama.cpp/"
            wanted = []
            for m in members:
                if m.name.startswith(vendor_prefix):
                    m.name = m.name[len(vendor_prefix) :]
                    if m.name and m.name != ".git":
                        wanted.append(m)
                elif m.name == gitdir + "HEAD":
                    fobj = tar.extractfile(m)
                    if fobj is not None:
                        commit = fobj.read().decode().strip() or None
            if not wanted:
                raise LlamaCppBuildError(f"{sdist} has no vendor/llama.cpp")
            tar.extractall(src_dir, members=wanted, filter="data")
        if commit is None or not re.fullmatch(r"[0-9a-f]{40}", commit):
            commit = _commit_from_changelog(sdist)
        if commit is None or not LLAMA_CPP_COMMIT.startswith(commit):
            raise LlamaCppBuildError(
                f"llama-cpp-python {LLAMA_CPP_PYTHON_VERSION} vendors llama.cpp {commit}, "
                f"not the pinned {LLAMA_CPP_COMMIT}"
            )
        (src_dir / SOURCE_COMMIT_FILE).write_text(LLAMA_CPP_COMMIT + "\n")
        log.info("vendored llama.cpp commit %s (b%d)", LLAMA_CPP_COMMIT, LLAMA_CPP_BUILD_NUMBER)


def _use_source_dir(source_dir: Path, src_dir: Path, steps: _StepLog) -> None:
    """Build from an already extracted tree (a machine with no registry access).

    The tree must be the pinned commit: `_extract_vendor` leaves SOURCE_COMMIT_FILE in
    every tree it extracts, and a tree without it, or with another commit, is refused.
    """
    with steps.step("use-source-dir"):
        marker = source_dir / SOURCE_COMMIT_FILE
        commit = marker.read_text().strip() if marker.is_file() else None
        if commit != LLAMA_CPP_COMMIT:
            raise LlamaCppBuildError(
                f"{source_dir} holds llama.cpp {commit or 'of unknown commit'}, "
                f"not the pinned {LLAMA_CPP_COMMIT}"
            )
        if src_dir.exists():
            shutil.rmtree(src_dir)
        shutil.copytree(source_dir, src_dir, symlinks=True)


def _commit_from_changelog(sdist: Path) -> str | None:
    """Fallback: the sdist's CHANGELOG names the llama.cpp commit of each release."""
    with tarfile.open(sdist, "r:gz") as tar:
        for m in tar.getmembers():
            if m.name.endswith("/CHANGELOG.md") and m.name.count("/") == 1:
                fobj = tar.extractfile(m)
                text = fobj.read().decode(errors="replace") if fobj else ""
                after = text.split(f"## [{LLAMA_CPP_PYTHON_VERSION}]", 1)[-1]
                section = after.split("\n## [", 1)[0]
                found = re.search(r"llama\.cpp@([0-9a-f]{7,40})", section)
                return found.group(1) if found else None
    return None


def parse_version_text(text: str) -> tuple[str | None, int | None]:
    """Commit and build number from a `--version` line.

    Recent builds print 'version: 0.5.0-dev (build 9123, commit 0c1e57098)'; older ones
    'version: 9123 (0c1e57098)'. Build numbers 0 and 1 mean "unknown" (no git history).
    """
    m = re.search(r"\(build (\d+), commit ([0-9a-zA-Z]+)\)", text) or re.search(
        r"version:\s*(\d+)\s*\(([0-9a-f]+)\)", text
    )
    if m is None:
        return None, None
    commit = m.group(2) if re.fullmatch(r"[0-9a-f]{7,40}", m.group(2)) else None
    number = int(m.group(1))
    return commit, number if number > 1 else None


def _describe_external(binary: Path) -> LlamaCppBuild:
    if not binary.is_file() or not os.access(binary, os.X_OK):
        raise LlamaCppBuildError(f"LLAMA_SERVER_BIN={binary} is not an executable file")
    version_text = _read_version_text(binary)
    commit, build_number = parse_version_text(version_text)
    return LlamaCppBuild(
        binary=binary.resolve(),
        sha256=sha256_file(binary),
        backend="external",
        sdist_version=None,
        llama_cpp_commit=commit,
        build_number=build_number,
        cmake_flags=(),
        cache_dir=None,
        version_text=version_text,
    )


def ensure_llama_server(
    *, cache_root: Path | None = None, jobs: int = 2, cuda_arch: str | None = None
) -> LlamaCppBuild:
    """Return a built llama-server, building it once per version, flags and CPU.

    Idempotent and safe to call from several processes: a valid stamp returns at once;
    otherwise one process builds under a file lock while the others wait for it.
    """
    override = os.environ.get("LLAMA_SERVER_BIN")
    if override:
        log.info("LLAMA_SERVER_BIN set: using %s", override)
        return _describe_external(Path(override))

    backend_flags, backend = cmake_flags_for(cuda_arch)
    root = (cache_root or default_cache_root()) / "llama.cpp"
    # The key leaves out the build-info flags (they follow from the version); the stamp
    # compares every flag, so a change there rebuilds in place, incrementally.
    key_dir = root / cache_key(LLAMA_CPP_PYTHON_VERSION, backend_flags, backend)
    flags = (*backend_flags, *BUILD_INFO_FLAGS)

    cached = _load_stamp(key_dir, flags)
    if cached is not None:
        return cached

    key_dir.mkdir(parents=True, exist_ok=True)
    with _file_lock(key_dir / ".lock", LOCK_TIMEOUT_S):
        # Another process may have finished the build while this one waited.
        cached = _load_stamp(key_dir, flags)
        if cached is not None:
            return cached
        return _build(key_dir, root / "sdist", flags, backend, jobs)


def _build(
    key_dir: Path, sdist_dir: Path, flags: tuple[str, ...], backend: str, jobs: int
) -> LlamaCppBuild:
    log_path = key_dir / LOG_NAME
    log_path.write_text("")  # one log per build attempt; the previous one is superseded
    (key_dir / STAMP_NAME).unlink(missing_ok=True)
    steps = _StepLog(log_path)
    src_dir, build_dir, bin_dir = key_dir / "src", key_dir / "build", key_dir / "bin"
    log.info(
        "building llama-server %s (%s) in %s; log %s",
        LLAMA_CPP_PYTHON_VERSION,
        backend,
        key_dir,
        log_path,
    )

    t0 = time.monotonic()
    with steps.step(f"llama-server-build {backend}"):
        source_dir = os.environ.get(SOURCE_DIR_ENV)
        if source_dir:
            _use_source_dir(Path(source_dir), src_dir, steps)
        else:
            sdist = _download_sdist(sdist_dir, steps)
            _extract_vendor(sdist, src_dir, steps)

        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        configure = ["cmake", "-S", str(src_dir), "-B", str(build_dir), *generator, *flags]
        with steps.step("configure"):
            # A build tree left by an interrupted or older build is reused: the compile
            # takes many minutes on a small machine and resumes where it stopped. If
            # that tree does not configure (another generator, say), start it afresh.
            try:
                steps.run("configure", configure, timeout_s=CONFIGURE_TIMEOUT_S)
            except LlamaCppBuildError:
                if not build_dir.exists():
                    raise
                log.warning("existing build tree %s did not configure; starting afresh", build_dir)
                shutil.rmtree(build_dir)
                steps.run("configure", configure, timeout_s=CONFIGURE_TIMEOUT_S)
        with steps.step("build"):
            steps.run(
                "build",
                [
                    "cmake",
                    "--build",
                    str(build_dir),
                    "--target",
                    BINARY_NAME,
                    "--config",
                    "Release",
                    "-j",
                    str(max(1, jobs)),
                ],
                timeout_s=BUILD_TIMEOUT_S,
            )

        with steps.step("install"):
            built = build_dir / "bin" / BINARY_NAME
            if not built.is_file():
                raise LlamaCppBuildError(f"build finished but {built} is missing; log {log_path}")
            bin_dir.mkdir(exist_ok=True)
            binary = bin_dir / BINARY_NAME
            tmp = bin_dir / f".{BINARY_NAME}.tmp"
            shutil.copy2(built, tmp)
            tmp.replace(binary)  # atomic: a reader never sees a half-copied binary
            version_text = _read_version_text(binary)
            build = LlamaCppBuild(
                binary=binary,
                sha256=sha256_file(binary),
                backend=backend,
                sdist_version=LLAMA_CPP_PYTHON_VERSION,
                llama_cpp_commit=LLAMA_CPP_COMMIT,
                build_number=LLAMA_CPP_BUILD_NUMBER,
                cmake_flags=flags,
                cache_dir=key_dir,
                version_text=version_text,
            )
            stamp_tmp = key_dir / f".{STAMP_NAME}.tmp"
            stamp_tmp.write_text(json.dumps(build.to_dict(), indent=2) + "\n")
            stamp_tmp.replace(key_dir / STAMP_NAME)
    log.info("llama-server ready after %.1fs: %s (%s)", time.monotonic() - t0, binary, version_text)
    return build


def _main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m engines.builds.llamacpp",
        description="Build (once, cached) llama.cpp's llama-server from PyPI's llama-cpp-python "
        "sdist and print the binary's path.",
    )
    parser.add_argument(
        "--cuda-arch",
        default=None,
        help="CUDA compute capability, e.g. 90 or 8.9 (default: CPU build)",
    )
    parser.add_argument(
        "--jobs", "-j", type=int, default=os.cpu_count() or 2,
        help="parallel compile jobs (default: every core; a GPU instance bills by the minute)"
    )
    parser.add_argument(
        "--cache-root",
        type=Path,
        default=None,
        help="cache root (default ${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench})",
    )
    parser.add_argument(
        "--link-into",
        type=Path,
        default=None,
        help="also link the binary into this folder (a campaign's engine bin dir on PATH)",
    )
    parser.add_argument("--json", action="store_true", help="print the whole build record as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        build = ensure_llama_server(
            cache_root=args.cache_root, jobs=args.jobs, cuda_arch=args.cuda_arch
        )
    except (LlamaCppBuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201 (CLI output)
        return 1
    if args.link_into is not None:
        args.link_into.mkdir(parents=True, exist_ok=True)
        link = args.link_into / BINARY_NAME
        link.unlink(missing_ok=True)
        link.symlink_to(build.binary)
    print(json.dumps(build.to_dict(), indent=2) if args.json else build.binary)  # noqa: T201
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
