"""Expected failures share one root (contract.errors.BenchError); anything else is a bug.

Every error class the project defines derives from BenchError, so `bench` can print it as
one line with exit status 2; an exception outside that tree shows its traceback and a line
saying it is a bug, with exit status 1.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import cli.local_run
from cli.main import main
from contract.errors import BenchError
from contract.spec import SpecError

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("agent", "cli", "contract", "control", "engines", "infra", "report")
BUILTIN_ERRORS = {
    "Exception",
    "ValueError",
    "RuntimeError",
    "OSError",
    "ConnectionError",
    "KeyError",
    "LookupError",
    "TypeError",
}


def _error_classes() -> dict[str, list[str]]:
    """Public classes built directly on a builtin exception, with their base names."""
    found: dict[str, list[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
                if not isinstance(node, ast.ClassDef) or node.name.startswith("_"):
                    continue
                bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
                if set(bases) & BUILTIN_ERRORS:
                    found[f"{path.relative_to(ROOT)}:{node.name}"] = bases
    return found


def test_every_project_error_derives_from_bench_error():
    classes = _error_classes()
    assert len(classes) >= 20  # the scan sees them
    assert {name: bases for name, bases in classes.items() if "BenchError" not in bases} == {
        "contract/errors.py:BenchError": ["Exception"]
    }


def test_an_expected_failure_is_one_line_with_status_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    def refuse(*_args: object, **_kwargs: object) -> int:
        raise SpecError("spec.toml: not valid TOML: line 1")

    monkeypatch.setattr(cli.local_run, "run_local", refuse)
    assert main(["run"]) == 2
    assert capsys.readouterr().err == "bench run: spec.toml: not valid TOML: line 1\n"
    assert issubclass(SpecError, BenchError) and issubclass(SpecError, ValueError)


def test_a_bug_shows_its_traceback_and_says_so(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    def broken(*_args: object, **_kwargs: object) -> int:
        return {}["missing"]

    monkeypatch.setattr(cli.local_run, "run_local", broken)
    assert main(["run"]) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "KeyError: 'missing'" in err
    assert err.strip().splitlines()[-1].startswith("bench run: this is a bug in bench")
