"""Google's LiteRT-LM 0.18.1 (`litert-lm serve`), serving a .litertlm file one request at a time.

`litert-lm serve` takes only host, port and a config file: backend, token budget,
thinking and the drafter are per-model options in that JSON file (its "default" section),
which render writes into the job's workdir. The engine loads lazily on the first
completion, so /v1/models answers 200 long before it can serve (there is no /health):
the readiness check's first real completion is what counts here.

Version: the seeds ran 0.19.0, which PyPI does not publish (0.18.1 is its newest release;
0.19.0 exists only as litert-lm-nightly dev builds), so the pin is 0.18.1, the newest that
installs; the parser check ran on it. A campaign that wants the seeds' version once it is
published says so in its spec (`[engine_versions] litert-lm = "0.19.0"`, `SEED_VERSION`);
`bench plan` checks that whatever version is asked for resolves on PyPI first.

Thinking off is `reasoning_effort: "none"` per request (LiteRT-LM ignores
chat_template_kwargs) and `thinking: false` in the config. The drafter is the one built
into the .litertlm file ("its own" in the seeds): arm `litert-<label>-d`, no token count.
"""

from __future__ import annotations

from engines.recipes.schema import (
    ConfigFile,
    DrafterArgs,
    EngineRecipe,
    GpuVariant,
    InstallStep,
    ReadyCheck,
    SettingSpec,
)

__all__ = ["CONFIG_NAME", "RECIPE", "SEED_VERSION"]

CONFIG_NAME = "litert-lm-config.json"
SEED_VERSION = "0.19.0"  # the seeds' release; not on PyPI when this was pinned

RECIPE = EngineRecipe(
    name="litert-lm",
    display_name="LiteRT-LM",
    arm_prefix="litert",
    arm_labels={
        "int248": "Google's gemma-4-E2B-it.litertlm (int2/4/8 weights)",
        "q40": "the exact Q4_0 build converted from the QAT weights",
    },
    version="0.18.1",
    version_note=f"PyPI's newest litert-lm release; the seeds ran {SEED_VERSION} (unpublished)",
    install=(
        InstallStep(
            name="pip litert-lm",
            kind="pip",
            argv=("{python}", "-m", "pip", "install", "litert-lm=={version}"),
            why="the newest published release (GPU through WebGPU on Vulkan)",
        ),
    ),
    serve=(
        "{python}",
        "-m",
        "litert_lm_cli.main",
        "serve",
        "--config",
        "{workdir}/" + CONFIG_NAME,
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),
    config_file=ConfigFile(
        name=CONFIG_NAME,
        section="default",
        keys={
            "backend": "backend",
            "max_num_tokens": "max_num_tokens",
            "thinking": "thinking",
            "speculative_decoding": "speculative_decoding",
            "activation_data_type": "activation_data_type",
            "cpu_thread_count": "cpu_thread_count",
            "cache": "cache",
        },
    ),
    settings={
        "backend": SettingSpec(
            type="str",
            default="gpu",
            choices=("cpu", "gpu", "npu"),
            help="where the model runs",
            source="seeds: GPU through WebGPU on Vulkan",
        ),
        "max_num_tokens": SettingSpec(
            type="int",
            default=4096,
            minimum=256,
            help="KV cache size in tokens (prompt + output per request)",
            source="derived: GSM8K's 2,048-token replies plus the prompt",
        ),
        "thinking": SettingSpec(
            type="bool",
            default=False,
            help="the model's thinking mode",
            source="seeds: thinking off for every speed and accuracy run",
        ),
        "speculative_decoding": SettingSpec(
            type="bool",
            default=False,
            help="the drafter built into the .litertlm file (drafter arms turn it on)",
            source="seeds: 'its own' drafter",
        ),
        "activation_data_type": SettingSpec(
            type="str",
            default=None,
            choices=("fp32", "fp16", "int16", "int8"),
            help="activation dtype (None: LiteRT-LM's choice)",
            source="derived",
        ),
        "cpu_thread_count": SettingSpec(
            type="int",
            default=None,
            minimum=1,
            help="CPU threads for the cpu backend",
            source="derived",
        ),
        "cache": SettingSpec(
            type="str",
            default=None,
            choices=("disk", "memory", "no"),
            help="where compiled programs are cached (None: LiteRT-LM's default)",
            source="derived",
        ),
    },
    port=9379,
    ready=ReadyCheck(
        health_path="/v1/models",
        health_timeout_s=300.0,
        first_completion_timeout_s=900.0,
        why="no /health; the engine loads on the first completion (seeds: 9-21 s)",
    ),
    # The model field picks the model: a path to the .litertlm file or an imported id.
    served_model="{model}",
    thinking_off={"reasoning_effort": "none"},
    force_output="none",
    requires_gpu=False,
    variants={
        "cpu": GpuVariant(
            settings={"backend": "cpu", "cpu_thread_count": 2},
            why="no GPU: the CPU backend on a 2-core machine",
        ),
        "sm_75": GpuVariant(
            why="seed 001: none; Google's int2/4/8 file (the Q4_0 build needs "
            "~45 GB of RAM to convert)"
        ),
    },
    drafter=DrafterArgs(
        token_count="engine",
        needs_model=False,
        settings={"speculative_decoding": True},
        note="seeds: 1.15x on the L4, 0.98x on the T4",
    ),
    version_probe=("{python}", "-m", "litert_lm_cli.main", "--version"),
    build_id="litert-lm-{version}-{variant}",
)
