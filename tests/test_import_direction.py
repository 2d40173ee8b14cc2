"""The rooms keep their doors: who may import whom (shared/DESIGN.md, "Parts and their rooms").

contract <- engines <- agent; contract <- infra; cli may import anything. Checked on the
source with `ast`, so an import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"agent", "cli", "contract", "engines", "infra", "benchmarks", "tests"}
ALLOWED = {
    "contract": {"contract"},
    "engines": {"engines", "contract"},
    "agent": {"agent", "engines", "contract"},
    "infra": {"infra", "contract"},
}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found & OURS


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_package_imports_only_what_its_room_allows(package: str):
    offenders = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in (ROOT / package).rglob("*.py")
        if (bad := _imports(path) - ALLOWED[package])
    }
    assert offenders == {}


def test_app_py_reaches_the_agent_only_through_contract():
    app = ROOT / "app.py"
    if app.exists():
        assert _imports(app) <= {"infra", "contract"}
