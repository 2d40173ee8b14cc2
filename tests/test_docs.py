"""The repo explains itself: the README links the design document, nothing points outside
the repo for it, and the document's import table is the one the import test enforces."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.test_import_direction import ALLOWED

ROOT = Path(__file__).resolve().parent.parent
DESIGN = ROOT / "docs" / "DESIGN.md"


def test_the_readme_links_the_design_document():
    assert DESIGN.is_file()
    assert "](docs/DESIGN.md)" in (ROOT / "README.md").read_text()


def test_nothing_points_at_a_design_document_outside_the_repo():
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    outside = "shared/" + "DESIGN"  # split, so this file does not match itself
    pointing = [
        name
        for name in tracked
        if (ROOT / name).is_file()
        and name.endswith((".py", ".md", ".toml", ".sh"))
        and outside in (ROOT / name).read_text(errors="replace")
    ]
    assert pointing == []


def test_the_documented_imports_are_the_enforced_ones():
    rows = re.findall(r"^\| `(\w+)/`[^|]*\|[^|]*\| ([^|]+) \|$", DESIGN.read_text(), re.M)
    documented = {
        room: {room} | set(re.findall(r"`(\w+)`", allowed))
        for room, allowed in rows
        if allowed != "anything"  # cli/
    }
    enforced = {room: set(allowed) for room, allowed in ALLOWED.items()}
    assert documented == enforced
