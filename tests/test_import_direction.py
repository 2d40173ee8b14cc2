"""The rooms keep their doors: who may import whom (docs/DESIGN.md, "Rooms").

The tree reads declare (infra/) -> launch (control/) -> run (agent/, engines/) -> report
(report/), each on contract/: contract <- engines <- agent <- report; contract <- infra;
contract <- control. The workstation's control plane drives what infra/ declares through the
stack's outputs, never by importing the constructs, and never loads CDK (so `bench launch`
needs no CDK toolchain). cli may import anything. Checked on the source with `ast`, so an
import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {
    "agent",
    "cli",
    "contract",
    "control",
    "engines",
    "infra",
    "report",
    "refserver",
    "benchmarks",
    "tests",
}
ALLOWED = {
    "contract": {"contract"},
    "engines": {"engines", "contract"},
    "agent": {"agent", "engines", "contract"},
    "infra": {"infra", "contract"},
    "control": {"control", "contract"},
    # Reports read the result formats and the definitions of every statistic (metrics,
    # paired comparison, telemetry fold), all in contract; nothing imports report but cli.
    "report": {"report", "contract"},
    # The scripted reference server (tests' and benchmarks' ground truth) stands alone.
    "refserver": {"refserver"},
}


def _modules(path: Path) -> set[str]:
    """Every absolute module name a file imports, dotted in full."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _imports(path: Path) -> set[str]:
    return {name.split(".")[0] for name in _modules(path)} & OURS


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


def test_the_control_plane_never_loads_cdk():
    cdk_in_control = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in (ROOT / "control").rglob("*.py")
        if (bad := {m for m in _modules(path) if m.split(".")[0] in {"aws_cdk", "constructs"}})
    }
    assert cdk_in_control == {}
