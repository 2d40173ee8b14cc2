"""llama.cpp's `llama-server`, built from the source PyPI's llama-cpp-python sdist vendors.

This module owns that build: the CMake flags (CPU, or CUDA for one compute capability), the
cache layout, the lock that keeps two processes from building at once, and the build id the
manifest records. The pinned source is `llamacpp_source`'s; how each step runs and logs is
`llamacpp_steps`'s. `python -m engines.builds.llamacpp --copy-log FILE` (the recipe's install
step) leaves a copy of the build log in the engine's install folder, built, reused or failed.

Cache layout, under `${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench}/llama.cpp/`:

    sdist/llama_cpp_python-<version>.tar.gz   the download, shared by every key
    <key>/src/                                 vendor/llama.cpp extracted from the sdist
    <key>/build/                               CMake's build tree (kept: a rerun resumes it)
    <key>/bin/llama-server                     the binary handed out
    <key>/build.log                            every step's output, with START/END lines
    <key>/build.json                           the stamp: written last, read by the fast path
    <key>/.lock                                flock, held while building

`LLAMA_SERVER_BIN` in the environment skips all of it and describes that binary instead (its
build log is the one beside it when it is a binary of this cache).
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
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from contract.files import sha256_file
from engines.builds.llamacpp_source import (
    DOWNLOAD_TIMEOUT_S,
    LLAMA_CPP_BUILD_NUMBER,
    LLAMA_CPP_COMMIT,
    LLAMA_CPP_PYTHON_SDIST_SHA256,
    LLAMA_CPP_PYTHON_VERSION,
    SOURCE_DIR_ENV,
    download_sdist,
    extract_vendor,
    use_source_dir,
)
from engines.builds.llamacpp_steps import (
    LlamaCppBuildError,
    StepLog,
    copy_log,
    file_lock,
)

__all__ = [
    "LLAMA_CPP_BUILD_NUMBER",
    "LLAMA_CPP_COMMIT",
    "LLAMA_CPP_PYTHON_SDIST_SHA256",
    "LLAMA_CPP_PYTHON_VERSION",
    "LlamaCppBuild",
    "LlamaCppBuildError",
    "cache_key",
    "cmake_flags_for",
    "default_cache_root",
    "ensure_llama_server",
    "normalize_cuda_arch",
    "parse_version_text",
    "sha256_file",
]

log = logging.getLogger(__name__)

# What `llama-server --version` reports. Set explicitly: CMake's own git probe would find
# no history and report build 1, which reads like a real (and very old) build.
BUILD_INFO_FLAGS: tuple[str, ...] = (
    f"-DLLAMA_BUILD_NUMBER={LLAMA_CPP_BUILD_NUMBER}",
    f"-DLLAMA_BUILD_COMMIT={LLAMA_CPP_COMMIT[:9]}",
)

STAMP_NAME = "build.json"
LOG_NAME = "build.log"
BINARY_NAME = "llama-server"

CONFIGURE_TIMEOUT_S = 900
# A CUDA build for one architecture on a small machine can take most of an hour.
BUILD_TIMEOUT_S = 3 * 3600
LOCK_TIMEOUT_S = BUILD_TIMEOUT_S + CONFIGURE_TIMEOUT_S + DOWNLOAD_TIMEOUT_S

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

    root, key_dir, flags, backend = _cache_slot(cuda_arch, cache_root)
    cached = _load_stamp(key_dir, flags)
    if cached is not None:
        return cached

    key_dir.mkdir(parents=True, exist_ok=True)
    with file_lock(key_dir / ".lock", LOCK_TIMEOUT_S):
        # Another process may have finished the build while this one waited.
        cached = _load_stamp(key_dir, flags)
        if cached is not None:
            return cached
        return _build(key_dir, root / "sdist", flags, backend, jobs)


def _cache_slot(
    cuda_arch: str | None, cache_root: Path | None
) -> tuple[Path, Path, tuple[str, ...], str]:
    """The cache root, the key's folder, every CMake flag and the backend of one build."""
    backend_flags, backend = cmake_flags_for(cuda_arch)
    root = (cache_root or default_cache_root()) / "llama.cpp"
    # The key leaves out the build-info flags (they follow from the version); the stamp
    # compares every flag, so a change there rebuilds in place, incrementally.
    key_dir = root / cache_key(LLAMA_CPP_PYTHON_VERSION, backend_flags, backend)
    return root, key_dir, (*backend_flags, *BUILD_INFO_FLAGS), backend


def build_log_path(*, cache_root: Path | None = None, cuda_arch: str | None = None) -> Path | None:
    """The log of the build `ensure_llama_server` returns (or failed to make) for these
    arguments; for `LLAMA_SERVER_BIN`, the log beside it when it is a binary of this cache."""
    override = os.environ.get("LLAMA_SERVER_BIN")
    if override:
        beside = Path(override).resolve().parent.parent / LOG_NAME
        return beside if beside.is_file() else None
    return _cache_slot(cuda_arch, cache_root)[1] / LOG_NAME


def _build(
    key_dir: Path, sdist_dir: Path, flags: tuple[str, ...], backend: str, jobs: int
) -> LlamaCppBuild:
    log_path = key_dir / LOG_NAME
    log_path.write_text("")  # one log per build attempt; the previous one is superseded
    (key_dir / STAMP_NAME).unlink(missing_ok=True)
    steps = StepLog(log_path)
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
            use_source_dir(Path(source_dir), src_dir, steps)
        else:
            sdist = download_sdist(sdist_dir, steps)
            extract_vendor(sdist, src_dir, steps)

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
    parser.add_argument(
        "--copy-log",
        type=Path,
        default=None,
        help="also copy the build log here, built, reused or failed (an engine's install folder)",
    )
    parser.add_argument("--json", action="store_true", help="print the whole build record as JSON")
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    # A stop (the installer ends this step's group) unwinds, so the compilers' group ends too.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        build = ensure_llama_server(
            cache_root=args.cache_root, jobs=args.jobs, cuda_arch=args.cuda_arch
        )
    except (LlamaCppBuildError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)  # noqa: T201 (CLI output)
        return 1
    finally:
        if args.copy_log is not None:
            _copy_build_log(args.copy_log, args.cache_root, args.cuda_arch)
    if args.link_into is not None:
        args.link_into.mkdir(parents=True, exist_ok=True)
        link = args.link_into / BINARY_NAME
        link.unlink(missing_ok=True)
        link.symlink_to(build.binary)
    print(json.dumps(build.to_dict(), indent=2) if args.json else build.binary)  # noqa: T201
    return 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _copy_build_log(dest: Path, cache_root: Path | None, cuda_arch: str | None) -> None:
    target = f"CUDA {cuda_arch}" if cuda_arch else "CPU"
    try:
        source = build_log_path(cache_root=cache_root, cuda_arch=cuda_arch)
    except ValueError:  # a bad --cuda-arch, already reported
        source = None
    copy_log(source, dest, note=f"llama-server {LLAMA_CPP_PYTHON_VERSION} build for {target}")


if __name__ == "__main__":
    raise SystemExit(_main())
