"""Small source patches some engines need on some GPUs, and a strict way to apply them.

Each patch is a unified diff (`a/<path>` / `b/<path>`, paths relative to the installed
package's site-packages folder) written from what the seeds describe; `PATCHES` says which
pinned package version and which files (by sha256 of the upstream file) each one was
written against. Recipes name patches; the install step applies them with
`patch -p1 --forward -d <site-packages> -i <file>` (see engines/recipes).

`apply_unified_diff` is the strict applier the tests use: every hunk's context and removed
lines must appear exactly (no fuzz) in the file, so a patch that only "sort of" applies to
a changed upstream file is caught here rather than on a GPU instance.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

from pydantic import Field

from contract.errors import BenchError
from contract.frozen import FrozenModel

__all__ = [
    "PATCHES",
    "PATCH_DIR",
    "FilePatch",
    "Hunk",
    "PatchApplyError",
    "PatchInfo",
    "apply_to_tree",
    "apply_unified_diff",
    "parse_unified_diff",
    "patch_path",
]

PATCH_DIR = Path(__file__).resolve().parent


class PatchInfo(FrozenModel):
    """What one patch is for and what exactly it was written against."""

    name: str = Field(description="file stem in engines/patches/")
    package: str = Field(description="PyPI distribution the patched files belong to")
    version: str = Field(description="pinned version whose files the patch was written on")
    upstream_sha256: dict[str, str] = Field(
        description="site-packages-relative path -> sha256 of the unpatched upstream file"
    )
    why: str


PATCHES: dict[str, PatchInfo] = {
    p.name: p
    for p in (
        PatchInfo(
            name="vllm-triton-tile-clamp-sm75",
            package="vllm",
            version="0.33.0",
            upstream_sha256={
                "vllm/v1/attention/ops/triton_unified_attention.py": (
                    "c1cf2300c99f5dc1fb297d7e556620842ab53c64c5ecda4c6ba89fb8e16215da"
                ),
            },
            why="seed 001: vLLM picks Triton attention for Gemma 4's 256/512-wide heads and "
            "its KV tile asks for more than sm_75's 64 KiB of shared memory; clamp the tile",
        ),
        PatchInfo(
            name="sglang-marlin-sm75-via-vllm",
            package="sglang",
            version="0.5.23",
            upstream_sha256={
                "sglang/kernels/ops/gemm/gptq_marlin.py": (
                    "0541c20e8ad89299bfae0dfb1d409c3443afdcec1f942b64f16e97cb9ddbeb8b"
                ),
                "sglang/kernels/ops/quantization/gptq_marlin_repack.py": (
                    "f6b7ef8dc42a44eea1f594cca33e2848bed12ec7f28b1860de5f86ffb034071b"
                ),
                "sglang/srt/layers/quantization/marlin_utils.py": (
                    "468b7d842c77c8cd29ca8fb4211fe60d33b74838423462152025347800622cf4"
                ),
                "sglang/srt/layers/quantization/compressed_tensors/schemes/"
                "compressed_tensors_wNa16.py": (
                    "2da4f9871d098e4107737dbfa89994df5b8e7beae498263aab1168326477047d"
                ),
            },
            why="seed 001: SGLang 0.5.23 builds its Marlin kernels for sm_80+ only, so the "
            "W4A16 checkpoint does not load on a T4; send gptq_marlin_gemm and "
            "gptq_marlin_repack to vLLM 0.33's compiled Turing build below sm_80",
        ),
        PatchInfo(
            name="sglang-marlin-atomic-add-off",
            package="sglang",
            version="0.5.23",
            upstream_sha256={
                "sglang/srt/layers/quantization/marlin_utils.py": (
                    "468b7d842c77c8cd29ca8fb4211fe60d33b74838423462152025347800622cf4"
                ),
            },
            why="seed 001: SGLang 0.5.23 hard-codes Marlin's atomic-add reduction on; on "
            "float16 greedy text repeated on 4 of 6 prompts. Off unless "
            "SGLANG_MARLIN_USE_ATOMIC_ADD=1, as vLLM does",
        ),
    )
}


def patch_path(name: str) -> Path:
    """The .patch file of a named patch (KeyError naming the known ones if unknown)."""
    if name not in PATCHES:
        raise KeyError(f"unknown patch {name!r} (known: {', '.join(sorted(PATCHES))})")
    return PATCH_DIR / f"{name}.patch"


class PatchApplyError(BenchError, ValueError):
    """A hunk's context is not in the file exactly as the patch expects."""


@dataclass(frozen=True)
class Hunk:
    old_start: int
    old_lines: tuple[str, ...]  # context and removed lines, in order
    new_lines: tuple[str, ...]  # context and added lines, in order


@dataclass(frozen=True)
class FilePatch:
    path: str  # relative, without the a/ b/ prefix
    hunks: tuple[Hunk, ...]


_HUNK_RE = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")


def parse_unified_diff(text: str) -> tuple[FilePatch, ...]:
    """Files and hunks of a unified diff whose paths carry `a/` and `b/` prefixes."""
    files: list[FilePatch] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.startswith("--- "):
            i += 1
            continue
        if i + 1 >= len(lines) or not lines[i + 1].startswith("+++ "):
            raise PatchApplyError(f"line {i + 1}: '---' without '+++'")
        new_name = lines[i + 1][4:].split("\t", 1)[0].strip()
        if not new_name.startswith("b/"):
            raise PatchApplyError(f"line {i + 2}: expected a 'b/' path, got {new_name!r}")
        i += 2
        hunks: list[Hunk] = []
        while i < len(lines) and lines[i].startswith("@@"):
            m = _HUNK_RE.match(lines[i])
            if m is None:
                raise PatchApplyError(f"line {i + 1}: bad hunk header {lines[i]!r}")
            old_count = int(m.group(2) or 1)
            new_count = int(m.group(4) or 1)
            i += 1
            old: list[str] = []
            new: list[str] = []
            while len(old) < old_count or len(new) < new_count:
                if i >= len(lines):
                    raise PatchApplyError("diff ends inside a hunk")
                body = lines[i]
                tag, rest = (body[:1], body[1:]) if body else (" ", "")
                if tag == " ":
                    old.append(rest)
                    new.append(rest)
                elif tag == "-":
                    old.append(rest)
                elif tag == "+":
                    new.append(rest)
                elif tag == "\\":
                    pass  # "\ No newline at end of file"
                else:
                    raise PatchApplyError(f"line {i + 1}: unexpected {body!r} inside a hunk")
                i += 1
            hunks.append(Hunk(int(m.group(1)), tuple(old), tuple(new)))
        files.append(FilePatch(new_name[2:], tuple(hunks)))
    if not files:
        raise PatchApplyError("no file in the diff")
    return tuple(files)


def _find(haystack: list[str], needle: tuple[str, ...], start: int) -> list[int]:
    n = len(needle)
    return [k for k in range(start, len(haystack) - n + 1) if tuple(haystack[k : k + n]) == needle]


def apply_unified_diff(original: str, patch: FilePatch) -> str:
    """Apply one file's hunks to its text, exactly: no fuzz, hunks found in order.

    A hunk may sit at another line number than its header says (an excerpt of the upstream
    file, or lines added above it), but its context must match exactly and only once after
    the previous hunk; anything else raises `PatchApplyError` naming the file and hunk.
    """
    lines = original.splitlines()
    trailing_newline = original.endswith("\n")
    out: list[str] = []
    cursor = 0
    for number, hunk in enumerate(patch.hunks, start=1):
        where = _find(lines, hunk.old_lines, cursor)
        if len(where) != 1:
            found = "not found" if not where else f"found {len(where)} times"
            raise PatchApplyError(
                f"{patch.path}: hunk #{number} (upstream line {hunk.old_start}): "
                f"its context is {found}"
            )
        at = where[0]
        out.extend(lines[cursor:at])
        out.extend(hunk.new_lines)
        cursor = at + len(hunk.old_lines)
    out.extend(lines[cursor:])
    return "\n".join(out) + ("\n" if trailing_newline else "")


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _reverse(patch: FilePatch) -> FilePatch:
    return FilePatch(
        patch.path, tuple(Hunk(h.old_start, h.new_lines, h.old_lines) for h in patch.hunks)
    )


def apply_to_tree(name: str, root: Path, *, check_upstream: bool = True) -> str:
    """Apply a named patch to the files under `root` (site-packages); idempotent.

    Returns 'applied' or 'already applied'. Every file is checked before any is written:
    a file that is neither the pinned upstream one (by sha256, when `check_upstream`) nor
    already patched raises `PatchApplyError` and nothing changes.
    """
    files = parse_unified_diff(patch_path(name).read_text())
    info = PATCHES[name]
    planned: dict[Path, str] = {}
    already = 0
    for fp in files:
        target = root / fp.path
        try:
            raw = target.read_bytes()
        except OSError as exc:
            raise PatchApplyError(f"{name}: cannot read {target}: {exc}") from exc
        text = raw.decode()
        try:
            apply_unified_diff(text, _reverse(fp))
            already += 1
            continue  # the patched text is there: this file is done
        except PatchApplyError:
            pass
        want = info.upstream_sha256.get(fp.path)
        if check_upstream and want is not None and _sha256(raw) != want:
            raise PatchApplyError(
                f"{name}: {target} is not {info.package} {info.version}'s file "
                f"(sha256 {_sha256(raw)[:12]}…, expected {want[:12]}…)"
            )
        planned[target] = apply_unified_diff(text, fp)
    for target, text in planned.items():
        tmp = target.with_name(f".{target.name}.patching")
        tmp.write_text(text)
        tmp.replace(target)
    return "already applied" if already == len(files) else "applied"


def _main(argv: list[str] | None = None) -> int:
    import argparse
    import logging

    parser = argparse.ArgumentParser(
        prog="python -m engines.patches", description="Apply an engine patch (idempotent)."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    apply = sub.add_parser("apply", help="apply a named patch under a site-packages folder")
    apply.add_argument("name", choices=sorted(PATCHES))
    apply.add_argument("site_packages", type=Path)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("engines.patches")
    try:
        outcome = apply_to_tree(args.name, args.site_packages)
    except PatchApplyError as exc:
        log.error("%s", exc)
        return 1
    log.info("%s: %s under %s", args.name, outcome, args.site_packages)
    return 0
