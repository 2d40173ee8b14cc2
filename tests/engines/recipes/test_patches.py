"""The engine patches apply to the pinned versions' files.

Without network: each hunk applies exactly (no fuzz) to the copy of its upstream context
kept in tests/engines/recipes/upstream/<package>-<version>/<path>@L<a>-<b>.txt, and the
idempotent tree applier patches, re-runs and refuses a foreign file. Opt-in
(`-m optin`): the pinned wheels are downloaded from PyPI, each patched file's sha256 is
checked against the one the patch was written on, the kept contexts are checked to be
exact slices of it, and GNU `patch --dry-run` and the strict applier both apply it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from engines.patches import (
    PATCHES,
    FilePatch,
    PatchApplyError,
    apply_to_tree,
    apply_unified_diff,
    parse_unified_diff,
    patch_path,
)

UPSTREAM = Path(__file__).resolve().parent / "upstream"
_EXCERPT_RE = re.compile(r"^(?P<path>.+)@L(?P<a>\d+)-(?P<b>\d+)\.txt$")


def _excerpts(package: str, version: str, path: str) -> list[tuple[int, int, str]]:
    folder = UPSTREAM / f"{package}-{version}" / Path(path).parent
    out = []
    for f in sorted(folder.glob(f"{Path(path).name}@L*.txt")):
        m = _EXCERPT_RE.match(f.name)
        assert m, f
        out.append((int(m["a"]), int(m["b"]), f.read_text()))
    return out


def _one_hunk(fp: FilePatch, i: int) -> FilePatch:
    return FilePatch(fp.path, (fp.hunks[i],))


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_every_hunk_applies_exactly_to_its_kept_upstream_context(name: str):
    info = PATCHES[name]
    files = parse_unified_diff(patch_path(name).read_text())
    assert {fp.path for fp in files} == set(info.upstream_sha256)
    for fp in files:
        kept = _excerpts(info.package, info.version, fp.path)
        assert kept, f"no upstream context kept for {fp.path}"
        for i, hunk in enumerate(fp.hunks):
            homes = []
            for a, _b, text in kept:
                try:
                    patched = apply_unified_diff(text, _one_hunk(fp, i))
                except PatchApplyError:
                    continue
                homes.append(a)
                assert "\n".join(hunk.new_lines) in patched
            assert len(homes) == 1, f"{fp.path} hunk {i + 1}: applies to {len(homes)} contexts"
            # The kept context sits where the hunk header says (the excerpt starts 2 lines
            # above the hunk's first line).
            assert homes[0] + 2 == hunk.old_start or abs(homes[0] + 2 - hunk.old_start) <= 4


def test_strict_applier_refuses_changed_context():
    fp = parse_unified_diff(patch_path("sglang-marlin-atomic-add-off").read_text())[0]
    text = "\n".join(_excerpts("sglang", "0.5.23", fp.path)[-1][2].splitlines()) + "\n"
    with pytest.raises(PatchApplyError, match="hunk #1"):
        apply_unified_diff(text.replace("if not True:", "if not False:"), _one_hunk(fp, 1))


def _tree_from_excerpts(root: Path, name: str) -> None:
    """A site-packages look-alike whose files are the kept contexts, joined."""
    info = PATCHES[name]
    for path in info.upstream_sha256:
        parts = [text for _a, _b, text in _excerpts(info.package, info.version, path)]
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text("# ...\n".join(parts))


@pytest.mark.parametrize("name", sorted(PATCHES))
def test_tree_applier_is_idempotent_and_refuses_foreign_files(name: str, tmp_path: Path):
    _tree_from_excerpts(tmp_path, name)
    # The excerpts are not the whole upstream file, so the sha256 guard is off here; the
    # opt-in test runs it on the real files.
    assert apply_to_tree(name, tmp_path, check_upstream=False) == "applied"
    after = {p: p.read_text() for p in tmp_path.rglob("*.py")}
    assert apply_to_tree(name, tmp_path, check_upstream=False) == "already applied"
    assert {p: p.read_text() for p in tmp_path.rglob("*.py")} == after
    foreign = tmp_path / "foreign"
    _tree_from_excerpts(foreign, name)
    with pytest.raises(PatchApplyError, match="is not"):
        apply_to_tree(name, foreign, check_upstream=True)


def test_both_sglang_patches_apply_in_order(tmp_path: Path):
    _tree_from_excerpts(tmp_path, "sglang-marlin-sm75-via-vllm")
    _tree_from_excerpts(tmp_path / "x", "sglang-marlin-atomic-add-off")
    # marlin_utils.py carries hunks of both patches: give it every kept context.
    utils = "sglang/srt/layers/quantization/marlin_utils.py"
    parts = [text for _a, _b, text in _excerpts("sglang", "0.5.23", utils)]
    (tmp_path / utils).write_text("# ...\n".join(parts))
    for name in ("sglang-marlin-sm75-via-vllm", "sglang-marlin-atomic-add-off"):
        assert apply_to_tree(name, tmp_path, check_upstream=False) == "applied"
    text = (tmp_path / utils).read_text()
    assert "SGLANG_MARLIN_USE_ATOMIC_ADD" in text and "device_capability < 75" in text


# -- opt-in: the real files, from the pinned wheels on PyPI -------------------------


def _cache() -> Path:
    root = os.environ.get("BENCH_CACHE_DIR") or str(Path.home() / ".cache" / "llm-serving-bench")
    return Path(root) / "engines-check" / "wheels"


def _wheel(package: str, version: str) -> Path:
    """The pinned wheel, downloaded once into the cache (pip picks this interpreter's)."""
    folder = _cache() / f"{package}-{version}"
    found = sorted(folder.glob("*.whl"))
    if not found:
        folder.mkdir(parents=True, exist_ok=True)
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
             "-d", str(folder), f"{package}=={version}"],
            capture_output=True, text=True, timeout=1800, check=False,
        )  # fmt: skip
        if proc.returncode != 0:
            pytest.fail(f"pip download {package}=={version} failed:\n{proc.stderr[-2000:]}")
        found = sorted(folder.glob("*.whl"))
    return found[0]


@pytest.mark.optin
@pytest.mark.parametrize("name", sorted(PATCHES))
def test_patch_applies_to_the_pinned_wheel(name: str, tmp_path: Path):
    if shutil.which("patch") is None:
        pytest.skip("GNU patch is not installed")
    info = PATCHES[name]
    wheel = _wheel(info.package, info.version)
    with zipfile.ZipFile(wheel) as zf:
        for path in info.upstream_sha256:
            zf.extract(path, tmp_path)
    import hashlib

    for path, want in info.upstream_sha256.items():
        data = (tmp_path / path).read_bytes()
        assert hashlib.sha256(data).hexdigest() == want, f"{path} differs from the pinned file"
        lines = data.decode().splitlines()
        for a, b, text in _excerpts(info.package, info.version, path):
            assert lines[a - 1 : b] == text.splitlines(), f"kept context {path}@L{a}-{b} drifted"
    dry = subprocess.run(
        ["patch", "-p1", "--dry-run", "--batch", "-d", str(tmp_path), "-i", str(patch_path(name))],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert dry.returncode == 0, dry.stdout + dry.stderr
    assert "FAILED" not in dry.stdout and "fuzz" not in dry.stdout
    assert apply_to_tree(name, tmp_path) == "applied"
    assert apply_to_tree(name, tmp_path) == "already applied"
    for path in info.upstream_sha256:
        if path.endswith(".py"):
            compile((tmp_path / path).read_text(), path, "exec")
