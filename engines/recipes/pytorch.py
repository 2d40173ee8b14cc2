"""The project's own PyTorch engine (engines/pytorch): `python -m engines.pytorch`.

Install: like every pip engine, its own environment (the agent's has no torch, and the Base
DLAMI ships no framework): torch at `TORCH_VERSION` plus the project, editable from its
source tree with its `pytorch` extra. PyPI's Linux torch wheels are the CUDA builds (x86_64
and aarch64 alike), carrying their CUDA runtime as `nvidia-*` wheels; the DLAMIs' driver
(595) runs every CUDA 12.x and 13.x build. On CPU the same pin resolves to whatever the
package index serves for it (the CPU build where the index has one, as this project's CI
does). Its CLI (engines/pytorch/config.py) is
`--model M --host H --port P --max-running N --dtype D [--max-model-len L] [--threads T]
[--quantize w4a16]`. A compressed-tensors W4A16 source (the campaigns' default for this
engine) is served in int4 as it is (engines/pytorch/checkpoint.py); the version probe
records the weights' form in the manifest.
dtype follows the seeds: bfloat16 on sm_80+, float16 on Turing (seed 001: the T4 measured
19.51 TFLOPS fp16 against 2.82 fp32), float32 on CPU. Unlike the seeds' engine, which
served one request at a time, this one batches; max_running defaults to the sweep's 64.
"""

from __future__ import annotations

from engines.recipes.project import own_engine_install
from engines.recipes.schema import (
    DrafterRefusal,
    EngineRecipe,
    Flag,
    GpuVariant,
    ReadyCheck,
    SettingSpec,
)

__all__ = ["RECIPE", "TORCH_VERSION"]

# The version the engine is developed and measured with (pyproject's dev pin; the H200 ran it).
TORCH_VERSION = "2.13.0"

_INSTALL = (
    own_engine_install(
        "pip torch + the project",
        f"torch=={TORCH_VERSION}",
        "pytorch",
        why="the engine's own environment: torch's build for this machine and the project "
        "(engines.pytorch) with its serving dependencies",
    ),
)

RECIPE = EngineRecipe(
    name="pytorch",
    display_name="PyTorch (this project's engine)",
    arm_prefix="pytorch",
    version="project",
    version_note="the project's own engine at the agent's git sha",
    install=_INSTALL,
    serve=(
        "{python}",
        "-m",
        "engines.pytorch",
        "--model",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),
    flags=(
        Flag(setting="max_running", flag="--max-running"),
        Flag(setting="dtype", flag="--dtype"),
        Flag(setting="context", flag="--max-model-len"),
        Flag(setting="threads", flag="--threads"),
        Flag(setting="quantize", flag="--quantize"),
    ),
    settings={
        "max_running": SettingSpec(
            type="int",
            default=64,
            minimum=1,
            help="requests decoded together at most (KV slots)",
            source="derived: the seeds' sweep goes to 64 (their engine served one at a time)",
        ),
        "dtype": SettingSpec(
            type="str",
            default="bfloat16",
            choices=("auto", "float32", "bfloat16", "float16"),
            help="weights and activations dtype",
            source="seed 000 (L4): bf16; seed 001 (T4): fp16",
        ),
        "context": SettingSpec(
            type="int",
            default=None,
            minimum=1,
            help="prompt + output tokens per request (None: the model's, capped at 8192)",
            source="derived",
        ),
        "threads": SettingSpec(
            type="int",
            default=None,
            minimum=0,
            help="CPU threads for torch ops (None: the engine's default, 1)",
            source="derived",
        ),
        "quantize": SettingSpec(
            type="str",
            default=None,
            choices=("none", "w4a16"),
            help="w4a16: int4 weights quantized at load (a W4A16 checkpoint is int4 as it is)",
            source="issue 18: the seeds served int4 weights",
        ),
    },
    port=8100,
    ready=ReadyCheck(
        health_path="/health",
        health_timeout_s=900.0,
        first_completion_timeout_s=300.0,
        why="seeds: 94-236 s to ready (weights load and warm-up)",
    ),
    thinking_off={"chat_template_kwargs": {"enable_thinking": False}},
    force_output="ignore_eos+min_tokens",
    env_names=("HF_TOKEN",),
    requires_gpu=False,
    variants={
        "cpu": GpuVariant(
            settings={"dtype": "float32"},
            why="CPU: float32 (the engine's own thread default, 1, suits a shared host)",
        ),
        "sm_75": GpuVariant(
            settings={"dtype": "float16"},
            why="seed 001: no bf16 on Turing; fp16 prompt reads",
        ),
    },
    drafter=DrafterRefusal(reason="the project's PyTorch engine has no speculative decoding"),
    # torch, CUDA and the weights' form (a W4A16 checkpoint's format, group size, targets).
    version_probe=("{python}", "-m", "engines.pytorch.describe", "{model}"),
    build_id="pytorch-engine-{variant}",
)
