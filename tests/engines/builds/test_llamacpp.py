"""llama.cpp's llama-server build: cached (a second call is fast and returns the same
binary), described exactly (commit, flags, sha256), and locked and logged as it builds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines.builds import llamacpp
from engines.builds.llamacpp import (
    LlamaCppBuild,
    LlamaCppBuildError,
    cache_key,
    cmake_flags_for,
    ensure_llama_server,
    normalize_cuda_arch,
    parse_version_text,
    sha256_file,
)
from engines.builds.llamacpp_source import SOURCE_DIR_ENV
from engines.builds.llamacpp_steps import StepLog, copy_log, file_lock
from tests.fixtures.processes import gone


@pytest.mark.slow
def test_second_call_is_cached_fast_and_identical(llama_server_build: LlamaCppBuild) -> None:
    if os.environ.get("LLAMA_SERVER_BIN"):
        pytest.skip("LLAMA_SERVER_BIN overrides the cached build")
    first = llama_server_build
    t0 = time.monotonic()
    second = ensure_llama_server()
    elapsed = time.monotonic() - t0

    assert elapsed < 2.0, f"cached call took {elapsed:.2f}s"
    assert second == first
    assert second.sha256 == sha256_file(second.binary)
    assert second.backend == "cpu"
    assert second.sdist_version == llamacpp.LLAMA_CPP_PYTHON_VERSION
    assert second.cache_dir is not None
    assert (second.cache_dir / llamacpp.STAMP_NAME).is_file()
    log_text = (second.cache_dir / llamacpp.LOG_NAME).read_text()
    for step in ("configure", "build", "install"):
        assert re.search(rf"^\[[^]]+\] START {step}$", log_text, re.M), step
        assert re.search(rf"^\[[^]]+\] END {step} [0-9.]+s$", log_text, re.M), step


@pytest.mark.slow
def test_build_records_the_vendored_commit(llama_server_build: LlamaCppBuild) -> None:
    if os.environ.get("LLAMA_SERVER_BIN"):
        pytest.skip("LLAMA_SERVER_BIN overrides the cached build")
    build = llama_server_build
    assert build.llama_cpp_commit is not None
    assert re.fullmatch(r"[0-9a-f]{7,40}", build.llama_cpp_commit)
    # The binary itself says which commit it is.
    assert build.llama_cpp_commit[:9] in build.version_text
    out = subprocess.run(
        [str(build.binary), "--version"], capture_output=True, text=True, timeout=60, check=True
    )
    assert build.llama_cpp_commit[:9] in out.stdout + out.stderr
    assert build.llama_cpp_commit == llamacpp.LLAMA_CPP_COMMIT
    assert build.build_number == llamacpp.LLAMA_CPP_BUILD_NUMBER
    assert f"build {build.build_number}," in build.version_text
    assert build.build_id == f"b{build.build_number}-{build.llama_cpp_commit[:9]}-cpu"
    assert set(llamacpp.BUILD_INFO_FLAGS) <= set(build.cmake_flags)


@pytest.mark.slow
def test_llama_server_bin_overrides(
    llama_server_build: LlamaCppBuild, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(llama_server_build.binary))
    ext = ensure_llama_server()
    assert ext.backend == "external"
    assert ext.binary == llama_server_build.binary.resolve()
    assert ext.sha256 == llama_server_build.sha256
    assert ext.llama_cpp_commit == (llama_server_build.llama_cpp_commit or "")[:9]
    assert ext.build_number == llama_server_build.build_number


def test_llama_server_bin_must_be_executable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LLAMA_SERVER_BIN", str(tmp_path / "missing"))
    with pytest.raises(LlamaCppBuildError, match="not an executable"):
        ensure_llama_server()


def test_cache_key_covers_version_and_flags() -> None:
    cpu_flags, cpu = cmake_flags_for(None)
    cuda_flags, cuda = cmake_flags_for("sm_90")
    assert cpu == "cpu" and cuda == "cuda-sm90"
    assert "-DGGML_CUDA=OFF" in cpu_flags
    assert {"-DGGML_CUDA=ON", "-DCMAKE_CUDA_ARCHITECTURES=90"} <= set(cuda_flags)
    # Nothing fetched at build time, nothing beyond the server.
    for flag in (
        "-DLLAMA_BUILD_TESTS=OFF",
        "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_USE_PREBUILT_UI=OFF",
        "-DLLAMA_OPENSSL=OFF",
    ):
        assert flag in cpu_flags
    keys = {
        cache_key("0.3.36", cpu_flags, cpu),
        cache_key("0.3.36", cuda_flags, cuda),
        cache_key("0.3.35", cpu_flags, cpu),
        cache_key("0.3.36", (*cpu_flags, "-DEXTRA=1"), cpu),
    }
    assert len(keys) == 4
    assert cache_key("0.3.36", cpu_flags, cpu) == cache_key("0.3.36", cpu_flags, cpu)
    assert cache_key("0.3.36", cpu_flags, cpu).startswith("0.3.36-cpu-")


@pytest.mark.parametrize(
    ("given", "want"),
    [("90", "90"), ("sm_90", "90"), ("8.9", "89"), ("sm90a", "90a"), (" 75 ", "75")],
)
def test_normalize_cuda_arch(given: str, want: str) -> None:
    assert normalize_cuda_arch(given) == want


@pytest.mark.parametrize("bad", ["", "hopper", "9", "sm_9000"])
def test_normalize_cuda_arch_rejects(bad: str) -> None:
    with pytest.raises(ValueError, match="cuda_arch"):
        normalize_cuda_arch(bad)


def test_parse_version_text() -> None:
    assert parse_version_text("version: 0.5.0-dev (build 0, commit 0c1e57098)") == (
        "0c1e57098",
        None,
    )
    assert parse_version_text("version: 7182 (7182ef71e)") == ("7182ef71e", 7182)
    assert parse_version_text("version: 0.5.0-dev (build 1, commit unknown)") == (None, None)
    assert parse_version_text("nonsense") == (None, None)


def test_failed_step_raises_with_log_tail(tmp_path: Path) -> None:
    steps = StepLog(tmp_path / "build.log")
    script = "import sys; print('compiling...'); print('error: boom at line 7'); sys.exit(3)"
    with pytest.raises(LlamaCppBuildError) as err, steps.step("build"):
        steps.run("build", [sys.executable, "-c", script], timeout_s=60)
    assert "exit 3" in str(err.value)
    assert "error: boom at line 7" in str(err.value)
    log_text = (tmp_path / "build.log").read_text()
    assert "START build" in log_text and "FAIL build" in log_text


def test_lock_keeps_a_second_builder_waiting(tmp_path: Path) -> None:
    lock = tmp_path / ".lock"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import fcntl, sys, time\n"
            f"f = open({str(lock)!r}, 'a+')\n"
            "fcntl.flock(f, fcntl.LOCK_EX)\n"
            "print('locked', flush=True)\n"
            "time.sleep(30)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
        t0 = time.monotonic()
        with pytest.raises(LlamaCppBuildError, match="still held"), file_lock(lock, 1.5):
            pass
        assert 1.4 < time.monotonic() - t0 < 5
    finally:
        holder.kill()
        holder.wait(timeout=10)
    with file_lock(lock, 5):  # released with its holder
        pass


def test_a_step_that_times_out_ends_its_whole_process_group(tmp_path: Path) -> None:
    # cmake --build's compilers are its children: a timeout (or any exception in the
    # builder) must end them too, not only the command it started.
    pid_file = tmp_path / "compiler.pid"
    steps = StepLog(tmp_path / "build.log")
    script = f"sleep 300 & echo $! > {pid_file}; wait"
    with pytest.raises(LlamaCppBuildError, match="timed out"):
        steps.run("build", ["bash", "-c", script], timeout_s=2)
    assert gone(int(pid_file.read_text()))


def test_the_build_log_is_copied_to_the_install_folder_even_when_the_build_fails(
    tmp_path: Path,
) -> None:
    # An offline source tree of another commit: the build fails at its first step.
    (tmp_path / "tree").mkdir()
    copied = tmp_path / "engines" / "llamacpp" / "build.log"
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_SERVER_BIN"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "engines.builds.llamacpp",
            "--cache-root",
            str(tmp_path / "cache"),
            "--copy-log",
            str(copied),
        ],
        env={**env, SOURCE_DIR_ENV: str(tmp_path / "tree")},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and "not the pinned" in result.stderr
    text = copied.read_text()
    assert text.startswith("# llama-server 0.3.36 build for CPU\n# build log ")
    assert "START use-source-dir" in text and "FAIL use-source-dir" in text


def test_a_huge_build_log_is_copied_as_its_head_and_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The head keeps what the build was asked to do (its configure step), the tail how it
    ended; the middle (thousands of compile lines, or of compiler warnings) is left out."""
    from engines.builds import llamacpp_steps

    monkeypatch.setattr(llamacpp_steps, "LOG_COPY_MAX_BYTES", 160)
    monkeypatch.setattr(llamacpp_steps, "LOG_COPY_HEAD_BYTES", 70)
    source = tmp_path / "build.log"
    steps = "START configure\ncmake -S src -B build\nEND configure\n"
    source.write_text(steps + "".join(f"[{i:03d}/500] Building CUDA object\n" for i in range(500)))
    copy_log(source, tmp_path / "copy.log")
    lines = (tmp_path / "copy.log").read_text().splitlines()
    assert lines[1].endswith(" bytes of its middle left out)")
    assert lines[2:5] == steps.splitlines()
    assert lines[-1] == "[499/500] Building CUDA object"
    marks = [line for line in lines[2:] if line.startswith("#")]
    assert len(marks) == 1 and marks[0].endswith(" bytes left out here)")
    kept = [line for line in lines if line.startswith("[")]
    assert 1 <= len(kept) < 5 and all(line.endswith("object") for line in kept)
    copy_log(None, tmp_path / "none.log", note="llama-server external")
    assert (tmp_path / "none.log").read_text() == (
        "# llama-server external\n# no build log: the binary was not built here\n"
    )


@pytest.mark.slow
def test_the_recipes_install_step_leaves_the_build_log_in_the_engines_folder(
    llama_server_build: LlamaCppBuild, tmp_path: Path
) -> None:
    from agent.installer import install_engine
    from engines.recipes.llamacpp import RECIPE

    installed = install_engine(RECIPE, "cpu", tmp_path)
    text = (installed.folder / "build.log").read_text()
    assert text.startswith("# llama-server 0.3.36 build for CPU\n")
    if llama_server_build.cache_dir is not None:  # built here, not LLAMA_SERVER_BIN's
        assert "START configure" in text and "END build" in text
    assert (installed.bin_dir / "llama-server").resolve() == llama_server_build.binary.resolve()
