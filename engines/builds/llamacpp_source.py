"""Where llama.cpp's source comes from: the pinned llama-cpp-python sdist, checked and extracted.

The sdist (version and sha256 pinned) is downloaded with pip from the package index, the one
source a CPU box, CI and a GPU instance all reach; its vendored llama.cpp must be the pinned
commit. `LLAMA_CPP_SOURCE_DIR` builds from an already extracted tree of that commit instead
(a machine that reaches no package registry).
"""

from __future__ import annotations

import logging
import re
import shutil
import sys
import tarfile
import tempfile
from pathlib import Path

from contract.files import sha256_file
from engines.builds.llamacpp_steps import LlamaCppBuildError, StepLog

__all__ = [
    "LLAMA_CPP_BUILD_NUMBER",
    "LLAMA_CPP_COMMIT",
    "LLAMA_CPP_PYTHON_SDIST_SHA256",
    "LLAMA_CPP_PYTHON_VERSION",
    "SOURCE_COMMIT_FILE",
    "SOURCE_DIR_ENV",
    "download_sdist",
    "extract_vendor",
    "use_source_dir",
]

log = logging.getLogger(__name__)

LLAMA_CPP_PYTHON_VERSION = "0.3.36"
# Pinned so that a changed upload on the index (or a proxy) cannot change what we build.
LLAMA_CPP_PYTHON_SDIST_SHA256 = "832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e"
# The llama.cpp commit that sdist vendors (its submodule HEAD; checked at extraction) and
# upstream's build number for it (release tag b11312). The sdist ships a depth-1 clone, so
# the number cannot be counted from the source: it is pinned beside the version.
LLAMA_CPP_COMMIT = "0c1e57098bba43ac29e6e3b677cdceebdd22334f"
LLAMA_CPP_BUILD_NUMBER = 11312
# Left in every extracted tree, naming its commit; lets `LLAMA_CPP_SOURCE_DIR` reuse a tree
# on a machine that cannot download the sdist (the GPU check machine, an offline host).
SOURCE_COMMIT_FILE = ".bench-llama-cpp-commit"
SOURCE_DIR_ENV = "LLAMA_CPP_SOURCE_DIR"
DOWNLOAD_TIMEOUT_S = 900


def download_sdist(sdist_dir: Path, steps: StepLog) -> Path:
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


def extract_vendor(sdist: Path, src_dir: Path, steps: StepLog) -> None:
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


def use_source_dir(source_dir: Path, src_dir: Path, steps: StepLog) -> None:
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
