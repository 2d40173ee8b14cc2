"""contract.layout: the shared names, and stdlib-only imports so both sides can load it.

(Which package may import which is tests/test_import_direction.py's job.)
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from contract import layout
from tests.fixtures.cdk_synth import PROJECT_ROOT


def imported_modules(path: Path) -> set[str]:
    """Top-level module names a file imports (absolute imports)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_prefixes_and_names() -> None:
    assert layout.CAMPAIGNS_PREFIX == "campaigns/"
    assert layout.RESULTS_PREFIX == "results/"
    assert layout.STATUS_PARAMETER_PREFIX == "/bench/"
    assert layout.TAG_CAMPAIGN == "bench:campaign"
    assert layout.TAG_SHARD == "bench:shard"
    assert layout.campaign_prefix("c1") == "campaigns/c1/"
    assert layout.results_prefix("c1") == "results/c1/"
    assert layout.results_prefix("c1", "s-0") == "results/c1/s-0/"
    assert layout.status_parameter_name("c1", "s-0") == "/bench/c1/s-0"


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "with space", "-leading", "x" * 129])
def test_names_that_cannot_be_a_path_segment_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="campaign"):
        layout.status_parameter_name(bad, "s0")
    with pytest.raises(ValueError, match="shard"):
        layout.results_prefix("c1", bad)


def test_layout_is_stdlib_only() -> None:
    imports = imported_modules(PROJECT_ROOT / "contract" / "layout.py")
    assert imports <= set(sys.stdlib_module_names) | {"__future__"}
