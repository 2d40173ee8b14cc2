"""Every recipe renders for every arm and GPU variant, with the seeds' values, and bad input
(unknown engine, setting, arm or drafter) fails with one line naming engine and reason."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from contract.suite import RequestSettings
from engines.builds.llamacpp import LLAMA_CPP_BUILD_NUMBER, LLAMA_CPP_COMMIT
from engines.patches import PATCHES
from engines.recipes import (
    RECIPES,
    RecipeError,
    check_arm,
    get_recipe,
    recipe_for_arm,
    render,
    render_install,
    variant_key,
)
from engines.recipes.llamacpp import SEED_COMMIT
from engines.recipes.schema import DrafterArgs, DrafterRefusal
from tests.engines.recipes.conftest import DRAFTER, MODEL, case_id, renderable

ROOT = Path(__file__).resolve().parents[3]
PLACEHOLDER = re.compile(r"\{[a-z_]+\}")


def _render(engine: str, arm: str, gpu: str | None, tmp_path: Path, **kw: object):
    recipe = get_recipe(engine)
    needs = isinstance(recipe.drafter, DrafterArgs) and recipe.drafter.needs_model
    drafter = DRAFTER if arm.endswith(tuple(f"-d{n}" for n in range(1, 17))) and needs else None
    return render(recipe, arm, gpu, MODEL, workdir=tmp_path, drafter=drafter, **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize("case", renderable(), ids=case_id)
def test_every_arm_renders_on_every_gpu(case: tuple[str, str, str | None], tmp_path: Path):
    engine, arm, gpu = case
    recipe = get_recipe(engine)
    served = _render(engine, arm, gpu, tmp_path)
    assert served.engine == engine and served.arm == arm
    assert served.argv and all(isinstance(a, str) and a for a in served.argv)
    leftover = [a for a in served.argv if PLACEHOLDER.search(a)]
    assert leftover == [], f"unfilled placeholders in {leftover}"
    assert served.port == recipe.port
    assert served.variant == variant_key(gpu)
    assert served.health_url.startswith(f"http://127.0.0.1:{recipe.port}/")
    # Thinking is off the way this engine reads it, in every request.
    for key, value in recipe.thinking_off.items():
        assert served.extra_body[key] == value
    for path, text in served.files.items():
        assert Path(path).is_absolute()
        json.loads(text)
    if re.search(r"-d\d*$", arm):
        plain = render(recipe, recipe.arm_prefix, gpu, MODEL, workdir=tmp_path)
        assert (served.argv, served.files) != (plain.argv, plain.files)
    if served.draft_tokens is not None:
        assert str(served.draft_tokens) in " ".join(served.argv)


def test_ports_are_the_seeds():
    ports = {name: r.port for name, r in RECIPES.items()}
    assert ports == {
        "llamacpp": 8080,
        "vllm": 8010,
        "mistralrs": 8020,
        "sglang": 8030,
        "pytorch": 8100,
        "jax": 8200,
        "litert-lm": 9379,
    }


def test_versions_are_pinned_and_llamacpp_matches_what_is_built():
    assert get_recipe("vllm").version == "0.33.0"
    assert get_recipe("sglang").version == "0.5.23"
    assert get_recipe("mistralrs").version == "v0.9.5"
    assert get_recipe("litert-lm").version == "0.18.1"
    # llama.cpp: the recipe pins what engines/builds builds (the sdist's vendored commit),
    # and keeps the seeds' commit beside it so a report can say they differ.
    llama = get_recipe("llamacpp")
    assert llama.version == f"b{LLAMA_CPP_BUILD_NUMBER}-{LLAMA_CPP_COMMIT[:9]}"
    assert SEED_COMMIT == "7182ef71e" and SEED_COMMIT in llama.version_note


def _flag(argv: tuple[str, ...], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_vllm_has_the_seeds_l4_and_t4_settings(tmp_path: Path):
    l4 = render(get_recipe("vllm"), "vllm", "8.9", MODEL)
    assert _flag(l4.argv, "--gpu-memory-utilization") == "0.85"
    assert _flag(l4.argv, "--max-num-seqs") == "64"
    assert _flag(l4.argv, "--max-model-len") == "16384"
    assert _flag(l4.argv, "--dtype") == "bfloat16"
    assert l4.patches == ()
    t4 = render(get_recipe("vllm"), "vllm-d3", "7.5", MODEL, drafter=DRAFTER)
    assert _flag(t4.argv, "--dtype") == "float16"
    assert t4.patches == ("vllm-triton-tile-clamp-sm75",)
    spec = json.loads(_flag(t4.argv, "--speculative-config") or "{}")
    assert spec == {"method": "mtp", "model": DRAFTER, "num_speculative_tokens": 3}
    assert "vllm-triton-tile-clamp-sm75" in t4.build_id


def test_sglang_has_the_seeds_settings_and_turing_patches():
    l4 = render(get_recipe("sglang"), "sglang-d4", "8.9", MODEL, drafter=DRAFTER)
    assert _flag(l4.argv, "--mem-fraction-static") == "0.8"
    assert _flag(l4.argv, "--max-running-requests") == "64"
    assert _flag(l4.argv, "--cuda-graph-max-bs-decode") == "64"
    assert _flag(l4.argv, "--speculative-num-steps") == "4"
    assert _flag(l4.argv, "--speculative-num-draft-tokens") == "5"
    t4 = render(get_recipe("sglang"), "sglang", "7.5", MODEL)
    assert _flag(t4.argv, "--dtype") == "float16"
    assert t4.patches == ("sglang-marlin-sm75-via-vllm", "sglang-marlin-atomic-add-off")


def test_mistralrs_has_the_seeds_settings():
    l4 = render(get_recipe("mistralrs"), "mistralrs", "8.9", MODEL)
    assert _flag(l4.argv, "--max-seqs") == "32"
    assert _flag(l4.argv, "--kv-cache") == "16384tokens"
    assert _flag(l4.argv, "--max-num-batched-tokens") == "4096"
    t4 = render(get_recipe("mistralrs"), "mistralrs", "7.5", MODEL)
    assert _flag(t4.argv, "--max-seqs") == "4"
    assert _flag(t4.argv, "--kv-cache") == "8192tokens"


@pytest.mark.parametrize("engine", sorted(RECIPES))
def test_turing_is_float16_everywhere(engine: str, tmp_path: Path):
    recipe = get_recipe(engine)
    served = render(recipe, recipe.arm_prefix, "7.5", MODEL, workdir=tmp_path)
    # llama.cpp's weights are the GGUF's Q4_0; its float setting is the KV cache's.
    keys = [k for k in ("dtype", "cache_type_k", "cache_type_v") if k in recipe.settings]
    if not keys:
        pytest.skip(f"{engine} has no dtype setting (LiteRT-LM picks its own)")
    assert {served.settings[k] for k in keys} <= {"float16", "f16"}


def test_install_steps_per_gpu():
    vllm_t4 = render_install(get_recipe("vllm"), "7.5", python="/venv/bin/python")
    assert [s.kind for s in vllm_t4] == ["pip", "patch"]
    assert vllm_t4[0].argv == ("/venv/bin/python", "-m", "pip", "install", "vllm==0.33.0")
    sglang_t4 = render_install(get_recipe("sglang"), "7.5", site_packages="/sp")
    assert [s.kind for s in sglang_t4] == ["pip", "pip", "patch", "patch"]
    assert "--no-deps" in sglang_t4[1].argv and "vllm==0.33.0" in sglang_t4[1].argv
    assert [s.argv[-2] for s in sglang_t4[2:]] == list(
        get_recipe("sglang").variants["sm_75"].patches
    )
    assert all(s.argv[-1] == "/sp" for s in sglang_t4[2:])
    mistral_t4 = render_install(get_recipe("mistralrs"), "7.5")
    assert mistral_t4[0].kind == "cargo" and "flash-attn" not in " ".join(mistral_t4[0].argv)
    assert mistral_t4[0].env == {"CUDA_COMPUTE_CAP": "75"}
    mistral_l4 = render_install(get_recipe("mistralrs"), "8.9")
    assert "cuda flash-attn" in mistral_l4[0].argv and mistral_l4[0].env["CUDA_COMPUTE_CAP"] == "89"
    llama_cpu = render_install(get_recipe("llamacpp"), None, bin_dir="/bin", install_dir="/e")
    assert llama_cpu[0].argv[1:] == (
        "-m", "engines.builds.llamacpp", "--link-into", "/bin", "--copy-log", "/e/build.log"
    )  # fmt: skip
    llama_h200 = render_install(get_recipe("llamacpp"), "9.0", bin_dir="/bin")
    assert llama_h200[0].argv[-6:-2] == ("--cuda-arch", "90", "--link-into", "/bin")
    # Our engine: its own environment with torch and the project, editable from its tree.
    (own,) = render_install(get_recipe("pytorch"), None, python="/e/bin/python")
    assert own.kind == "pip" and own.argv[:4] == ("/e/bin/python", "-m", "pip", "install")
    assert own.argv[-2:] == ("--editable", f"{Path(__file__).resolve().parents[3]}[pytorch]")
    for recipe in RECIPES.values():
        for gpu in ("7.5", "8.9"):
            rendered = render_install(
                recipe, gpu, site_packages="/sp", bin_dir="/bin", install_dir="/e"
            )
            for step in rendered:
                assert not any(PLACEHOLDER.search(a) for a in step.argv), step


def test_every_named_patch_exists():
    for recipe in RECIPES.values():
        for variant in recipe.variants.values():
            for name in variant.patches:
                assert name in PATCHES
                assert (ROOT / "engines" / "patches" / f"{name}.patch").is_file()


@pytest.mark.parametrize(
    ("given", "key"),
    [(None, "cpu"), ("7.5", "sm_75"), (7.5, "sm_75"), ("75", "sm_75"), ("sm_89", "sm_89"),
     ((9, 0), "sm_90"), ("9.0a", "sm_90a"), ("sm_90a", "sm_90a"), ("cpu", "cpu")],
)  # fmt: skip
def test_variant_key(given: object, key: str):
    assert variant_key(given) == key  # type: ignore[arg-type]


# -- overrides -----------------------------------------------------------------------


def test_settings_override_and_omit(tmp_path: Path):
    recipe = get_recipe("vllm")
    served = render(recipe, "vllm", "8.9", MODEL, settings={"max_running": 8, "dtype": None})
    assert _flag(served.argv, "--max-num-seqs") == "8"
    assert "--dtype" not in served.argv
    off = render(recipe, "vllm", "8.9", MODEL, settings={"language_model_only": False})
    assert "--language-model-only" not in off.argv
    litert = render(get_recipe("litert-lm"), "litert-int248-d", "8.9", MODEL, workdir=tmp_path,
                    settings={"max_num_tokens": 2048})  # fmt: skip
    (config,) = litert.files.values()
    assert json.loads(config)["default"] == {
        "backend": "gpu",
        "max_num_tokens": 2048,
        "thinking": False,
        "speculative_decoding": True,
    }


def test_request_settings_carry_engine_extras_and_forced_output():
    served = render(get_recipe("llamacpp"), "llama", None, "m.gguf")
    merged = served.request_settings(RequestSettings(extra_body={"seed": 1}))
    assert merged.force_output == "ignore_eos"
    assert merged.extra_body == {
        "cache_prompt": False,
        "chat_template_kwargs": {"enable_thinking": False},
        "seed": 1,
    }
    thinking = render(get_recipe("sglang"), "sglang", "8.9", MODEL, thinking=True)
    assert "chat_template_kwargs" not in thinking.extra_body
    litert = render(get_recipe("litert-lm"), "litert", None, "/m.litertlm", workdir=Path("/w"))
    assert litert.extra_body == {"reasoning_effort": "none"}
    assert litert.served_model == "/m.litertlm"
    assert litert.ready.health_path == "/v1/models"


def test_hf_token_never_reaches_argv(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    secret = "hf_SECRETvalue0123456789"
    monkeypatch.setenv("HF_TOKEN", secret)
    for engine, arm, gpu in renderable():
        served = _render(engine, arm, gpu, tmp_path)
        blob = json.dumps(served.model_dump(mode="json"))
        assert secret not in blob
        assert not any(a in ("--hf-token", "-hft", "--token") for a in served.argv)
        for step in render_install(get_recipe(engine), gpu):
            assert secret not in json.dumps(step.model_dump())
    hub = [r.name for r in RECIPES.values() if "HF_TOKEN" in r.env_names]
    assert sorted(hub) == ["jax", "mistralrs", "pytorch", "sglang", "vllm"]


# -- bad input: one line, naming the engine and the reason --------------------------


def _one_line(exc: pytest.ExceptionInfo[RecipeError], engine: str, *words: str) -> None:
    text = str(exc.value)
    assert "\n" not in text
    assert text.startswith(f"{engine}: ")
    for word in words:
        assert word in text, text


def test_unknown_engine():
    with pytest.raises(RecipeError) as exc:
        get_recipe("tensorrt-llm")
    _one_line(exc, "tensorrt-llm", "unknown engine", "vllm", "llamacpp")
    with pytest.raises(RecipeError) as exc:
        recipe_for_arm("trt-d4")
    _one_line(exc, "trt", "names no known engine")
    assert recipe_for_arm("llama-d2").name == "llamacpp"
    assert recipe_for_arm("litert-int248").name == "litert-lm"


def test_unknown_setting_names_engine_and_key():
    with pytest.raises(RecipeError) as exc:
        render(get_recipe("vllm"), "vllm", "8.9", MODEL, settings={"gpu_mem": 0.9})
    _one_line(exc, "vllm", "unknown setting 'gpu_mem'", "memory_fraction")
    with pytest.raises(RecipeError) as exc:
        check_arm(get_recipe("sglang"), "sglang", "8.9", {"memory_fraction": "lots"})
    _one_line(exc, "sglang", "'memory_fraction'", "expected float")
    with pytest.raises(RecipeError) as exc:
        check_arm(get_recipe("vllm"), "vllm", "8.9", {"memory_fraction": 1.5})
    _one_line(exc, "vllm", "above the maximum")
    with pytest.raises(RecipeError) as exc:
        check_arm(get_recipe("llamacpp"), "llama", None, {"flash_attn": "maybe"})
    _one_line(exc, "llamacpp", "'flash_attn'", "on, off, auto")


@pytest.mark.parametrize(
    ("engine", "arm", "gpu", "words"),
    [
        ("mistralrs", "mistralrs-d1", "8.9", ("cannot run a drafter", "SDK")),
        ("mistralrs", "mistralrs-d1", "7.5", ("cannot run a drafter",)),
        ("pytorch", "pytorch-d2", None, ("cannot run a drafter", "no speculative")),
        ("litert-lm", "litert-int248-d4", "8.9", ("sets its own draft length",)),
        ("vllm", "vllm-d", "8.9", ("how many tokens",)),
        ("vllm", "vllm-d99", "8.9", ("1..16",)),
        ("vllm", "llama-d2", "8.9", ("not one of this engine's arms",)),
        ("litert-lm", "litert-int4", "8.9", ("unknown part 'int4'", "int248")),
        ("vllm", "vllm", None, ("needs an NVIDIA GPU",)),
        ("vllm", "vllm", "turing", ("compute capability",)),
    ],
)
def test_bad_arms_are_refused_with_the_reason(
    engine: str, arm: str, gpu: str | None, words: tuple[str, ...]
):
    recipe = get_recipe(engine)
    with pytest.raises(RecipeError) as exc:
        check_arm(recipe, arm, gpu)
    _one_line(exc, engine, *words)
    with pytest.raises(RecipeError):
        render(recipe, arm, gpu, MODEL, drafter=DRAFTER, workdir=Path("/w"))


def test_drafter_arm_without_a_drafter_model_is_refused():
    with pytest.raises(RecipeError) as exc:
        render(get_recipe("llamacpp"), "llama-d2", "8.9", "m.gguf")
    _one_line(exc, "llamacpp", "needs a drafter model")


def test_config_file_engine_needs_a_workdir():
    with pytest.raises(RecipeError) as exc:
        render(get_recipe("litert-lm"), "litert", "8.9", "m.litertlm")
    _one_line(exc, "litert-lm", "workdir")


def test_drafter_refusals_are_where_the_seeds_put_them():
    refused = {n for n, r in RECIPES.items() if isinstance(r.drafter, DrafterRefusal)}
    assert refused == {"mistralrs", "pytorch", "jax"}


def test_no_code_path_compares_an_engine_name():
    """Recipes are data: render, schema and readiness never branch on an engine's name."""
    names = set(RECIPES) | {r.arm_prefix for r in RECIPES.values()}
    files = [
        ROOT / "engines" / "recipes" / "render.py",
        ROOT / "engines" / "recipes" / "schema.py",
        ROOT / "engines" / "recipes" / "__init__.py",
        ROOT / "agent" / "readiness.py",
    ]
    for path in files:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare):
                for side in [node.left, *node.comparators]:
                    if isinstance(side, ast.Constant) and side.value in names:
                        pytest.fail(f"{path.name}:{node.lineno} compares with {side.value!r}")
