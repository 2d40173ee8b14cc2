"""Every argv the vLLM, SGLang and LiteRT-LM recipes render is accepted by that engine's own
parser at the installed version (opt-in: `-m optin`), and the PyTorch engine's always.

The engines are installed by hand, each in its own venv under
`${BENCH_CACHE_DIR:-~/.cache/llm-serving-bench}/engines-check/<engine>/` (vllm==0.33.0,
sglang==0.5.23, litert-lm; see the report for versions); a missing venv skips its engine.
engine_parsers.py runs inside that venv: the parser runs exactly as the launcher runs it,
and stops before anything is served. A deliberately bad flag per engine shows the check
can fail.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from engines.pytorch.config import build_parser
from engines.recipes import RECIPES, get_recipe, render
from tests.engines.recipes.conftest import DRAFTER, GPUS, MODEL, arms_of

HERE = Path(__file__).resolve().parent
# The module each recipe's argv runs with `python -m`; the parser gets what follows it.
MODULES = {
    "vllm": "vllm.entrypoints.cli.main",
    "sglang": "sglang.launch_server",
    "litert-lm": "litert_lm_cli.main",
}
BAD_FLAG = "--surely-not-a-flag"


def _venv_python(engine: str) -> Path:
    root = os.environ.get("BENCH_CACHE_DIR") or str(Path.home() / ".cache" / "llm-serving-bench")
    return Path(root) / "engines-check" / engine / "bin" / "python"


def _rendered(engine: str, tmp_path: Path) -> list[tuple[str, list[str]]]:
    recipe = get_recipe(engine)
    out = []
    for gpu in GPUS:
        if gpu is None and recipe.requires_gpu:
            continue
        for arm in arms_of(recipe):
            served = render(
                recipe, arm, gpu, MODEL, drafter=DRAFTER, workdir=tmp_path / f"{arm}-{gpu}"
            )
            for path, text in served.files.items():
                Path(path).parent.mkdir(parents=True, exist_ok=True)
                Path(path).write_text(text)
            argv = list(served.argv)
            cut = argv.index(MODULES[engine]) + 1
            out.append((f"{arm}@{served.variant}", argv[cut:]))
    return out


def _parse(engine: str, argvs: list[list[str]]) -> list[dict[str, object]]:
    python = _venv_python(engine)
    if not python.exists():
        pytest.skip(f"{engine} is not installed in {python.parent.parent}")
    proc = subprocess.run(
        [str(python), str(HERE / "engine_parsers.py"), engine],
        input=json.dumps(argvs),
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        cwd=HERE,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("ENGINE-PARSERS-RESULT ")]
    assert lines, f"{engine} parser run failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}"
    return json.loads(lines[-1].split(" ", 1)[1])


def _negatives(engine: str, argv: list[str], tmp_path: Path) -> list[list[str]]:
    """Argv each parser must refuse: an unknown flag; for LiteRT-LM a config off its schema."""
    bad = [[*argv, BAD_FLAG, "1"]]
    if "--config" in argv:
        config = tmp_path / "bad-config.json"
        config.write_text(json.dumps({"default": {"backend": "tpu", "max_num_tokens": 0}}))
        at = argv.index("--config") + 1
        bad.append([*argv[:at], str(config), *argv[at + 1 :]])
    return bad


@pytest.mark.optin
@pytest.mark.parametrize("engine", sorted(MODULES))
def test_engine_parser_accepts_every_rendered_argv(engine: str, tmp_path: Path):
    cases = _rendered(engine, tmp_path)
    negatives = _negatives(engine, cases[0][1], tmp_path)
    results = _parse(engine, [argv for _, argv in cases] + negatives)
    good, bad = results[: len(cases)], results[len(cases) :]
    rejected = {name: r["error"] for (name, _), r in zip(cases, good, strict=True) if not r["ok"]}
    assert rejected == {}
    assert [r["ok"] for r in bad] == [False] * len(negatives), bad
    seen = {name: r["seen"] for (name, _), r in zip(cases, good, strict=True)}
    # What the parser understood is what the recipe meant.
    for name, values in seen.items():
        assert MODEL in json.dumps(values) or engine == "litert-lm", (name, values)
    print(json.dumps(seen, indent=1))


def test_pytorch_engine_parser_accepts_every_rendered_argv():
    recipe = RECIPES["pytorch"]
    for gpu in GPUS:
        served = render(recipe, recipe.arm_prefix, gpu, "random:tiny", 8100)
        argv = list(served.argv)
        config = build_parser().parse_args(argv[argv.index("engines.pytorch") + 1 :])
        assert config.port == 8100 and config.model == "random:tiny"
        assert config.max_running == served.settings["max_running"]
        assert config.dtype == served.settings["dtype"]
