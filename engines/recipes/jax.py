"""The project's own JAX engine (engines/jax): `python -m engines.jax`, Gemma 4 only.

Installs, into its own environment, the project (editable, its `jax` extra) and JAX's CUDA
wheels: `jax[cuda12]` brings jaxlib and the CUDA 12 plugin and PJRT
wheels with their own CUDA libraries from PyPI, which need only the NVIDIA driver (525 or
newer) rather than a CUDA toolkit. The CUDA 12 build is the one that matches the drivers
the instances come with (a `cuda13` build would need a 580 driver). On aarch64 (G5g:
Graviton2 + T4G) nothing builds from source: `pip download --platform
manylinux_2_27_aarch64` (with manylinux_2_28 beside it; pip matches the tag exactly)
finds jaxlib, jax-cuda12-plugin and jax-cuda12-pjrt 0.10.2 wheels for cp312 (checked
2026-12-01; vllm 0.33.0 has a manylinux_2_28_aarch64 wheel too, where seed 002's vLLM
rig built from source for hours). Seed 002's PyTorch rig, also wheels, finished its
install a median 113.55 s after launch.
Its CLI (engines/jax/config.py) is `--model M --host H --port P --max-running N --dtype D
[--max-model-len L]`; every prompt and KV bucket compiles before /health answers 200,
so readiness (health, then a first good completion) measures time to serving, which the
seed's JAX rig did not (it compiled on the first request: 22 s after health).
dtype: bfloat16 on sm_80+, float16 on Turing (the T4G is sm_75), float32 on CPU.
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

__all__ = ["RECIPE"]

RECIPE = EngineRecipe(
    name="jax",
    display_name="JAX (this project's engine)",
    arm_prefix="jax",
    version="0.10.2",
    version_note="the project's own engine at the agent's git sha, on JAX {version}",
    install=(
        own_engine_install(
            "pip jax cuda12 + the project",
            "jax[cuda12]=={version}",
            "jax",
            why="the engine's own environment: JAX with its CUDA 12 plugin and libraries from "
            "PyPI (x86_64 and aarch64 wheels; needs only the driver) and the project "
            "(engines.jax) with its serving dependencies",
        ),
    ),
    serve=(
        "{python}",
        "-m",
        "engines.jax",
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
    ),
    settings={
        "max_running": SettingSpec(
            type="int",
            default=64,
            minimum=1,
            help="KV slots: requests decoded together at most",
            source="derived: the seeds' sweep goes to 64 (seed 002's JAX rig had no batching)",
        ),
        "dtype": SettingSpec(
            type="str",
            default="bfloat16",
            choices=("auto", "float32", "bfloat16", "float16"),
            help="weights and activations dtype",
            source="seed 002 (T4G, sm_75): float16",
        ),
        "context": SettingSpec(
            type="int",
            default=4096,
            minimum=1,
            help="prompt + output tokens per request: the largest KV bucket",
            source="seed 002: the JAX and PyTorch rigs served 4096",
        ),
    },
    port=8200,
    ready=ReadyCheck(
        health_path="/health",
        health_timeout_s=1200.0,
        first_completion_timeout_s=120.0,
        why="every bucket compiles before /health (seed 002's rig compiled on first use)",
    ),
    thinking_off={"chat_template_kwargs": {"enable_thinking": False}},
    force_output="ignore_eos+min_tokens",
    env_names=("HF_TOKEN",),
    requires_gpu=False,
    variants={
        "cpu": GpuVariant(
            settings={"dtype": "float32"},
            install=(
                own_engine_install(
                    "pip jax cpu + the project",
                    "jax[cpu]=={version}",
                    "jax",
                    why="JAX's CPU wheels and the project (engines.jax)",
                ),
            ),
            why="CPU: float32, JAX's CPU wheels",
        ),
        "sm_75": GpuVariant(
            settings={"dtype": "float16"},
            why="seed 002: the T4G (Turing) has no bf16 datapath",
        ),
    },
    drafter=DrafterRefusal(reason="the project's JAX engine has no speculative decoding"),
    version_probe=("{python}", "-c", "import jax; print(jax.__version__, jax.devices())"),
    build_id="jax-engine-{version}-{variant}",
)
