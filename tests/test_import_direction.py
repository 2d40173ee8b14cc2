"""The rooms keep their doors: who may import whom (shared/DESIGN.md, "Parts and their rooms").

contract <- engines <- agent <- report; contract <- infra; cli may import anything. Inside
infra, the workstation's control plane (infra/control/) sits beside the constructs it drives
but apart from them: it never imports CDK, and no construct imports it. Checked on the source
with `ast`, so an import inside a function counts too.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
OURS = {"agent", "cli", "contract", "engines", "infra", "report", "benchmarks", "tests"}
ALLOWED = {
    "contract": {"contract"},
    "engines": {"engines", "contract"},
    "agent": {"agent", "engines", "contract"},
    "infra": {"infra", "contract"},
    # Reports read the result formats (contract) and reuse the agent's definitions of a
    # statistic (metrics, paired comparison, telemetry fold); nothing imports report but cli.
    "report": {"report", "contract", "agent"},
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


def test_the_control_plane_and_the_constructs_keep_apart():
    control = ROOT / "infra" / "control"
    assert control.is_dir()
    cdk_in_control = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in control.rglob("*.py")
        if (bad := {m for m in _modules(path) if m.split(".")[0] in {"aws_cdk", "constructs"}})
    }
    assert cdk_in_control == {}
    control_in_constructs = {
        str(path.relative_to(ROOT)): sorted(bad)
        for path in [*(ROOT / "infra").rglob("*.py"), ROOT / "app.py"]
        if path.exists()
        and control not in path.parents
        and (bad := {m for m in _modules(path) if m.startswith("infra.control")})
    }
    assert control_in_constructs == {}
