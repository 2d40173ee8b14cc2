"""llama.cpp's `llama-server`: built with CMake from the pinned llama-cpp-python sdist.

Version. The seeds served llama.cpp at commit 7182ef71e. This project builds llama.cpp from
the source that llama-cpp-python 0.3.36's sdist vendors (engines/builds/llamacpp.py): the
machines the project runs on reach PyPI and no other host, so a pinned, hashed sdist is the
one source a CPU box, CI and a GPU instance can all build from. That sdist vendors commit
0c1e57098 (release b11312), so that is what `version` pins and what the build id records;
`SEED_COMMIT` keeps the seeds' commit so a report can say the two differ. The flags below
are the ones this build's parser accepts (checked by tests/engines/recipes against the real
binary): the drafter flags are the `--spec-draft-*` spelling, and `--draft-max` is gone.

Settings. The seeds give no llama.cpp serving flags beyond offloading every layer; slots
and context are sized here so the seeds' 1-64-request sweep never queues in the server:
64 slots over one unified 65,536-token KV pool (any one request may use all of it, so the
2,048-token GSM8K replies fit too). On CPU the local default's sizing is kept: 8 slots of
2,048 tokens and 1 thread.
"""

from __future__ import annotations

from engines.recipes.schema import (
    DrafterArgs,
    EngineRecipe,
    Flag,
    GpuVariant,
    InstallStep,
    ReadyCheck,
    SettingSpec,
)

__all__ = ["RECIPE", "SEED_COMMIT"]

SEED_COMMIT = "7182ef71e"
VENDORED = "b11312-0c1e57098"

RECIPE = EngineRecipe(
    name="llamacpp",
    display_name="llama.cpp",
    arm_prefix="llama",
    version=VENDORED,
    version_note=(
        f"llama-cpp-python 0.3.36 sdist's vendored llama.cpp (b11312, 0c1e57098); "
        f"the seeds used {SEED_COMMIT}, which no reachable registry ships"
    ),
    install=(
        InstallStep(
            name="llama-server (CUDA)",
            kind="cmake",
            argv=(
                "{bench_python}",
                "-m",
                "engines.builds.llamacpp",
                "--cuda-arch",
                "{cuda_arch}",
                "--link-into",
                "{bin_dir}",
                "--copy-log",
                "{install_dir}/build.log",
            ),
            why="CMake build of llama-server for this GPU's compute capability, cached; "
            "its build log copied beside install.log (uploaded with it)",
        ),
    ),
    binary="llama-server",
    serve=(
        "{binary}",
        "--model",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
        "--jinja",  # the model's own chat template (thinking switch included)
        "--no-webui",
        "--metrics",
    ),
    flags=(
        Flag(setting="parallel", flag="--parallel"),
        Flag(setting="ctx_size", flag="--ctx-size"),
        Flag(
            setting="kv_unified",
            flag="--kv-unified",
            form="switch_pair",
            off_flag="--no-kv-unified",
        ),
        Flag(setting="n_gpu_layers", flag="--n-gpu-layers"),
        Flag(setting="flash_attn", flag="--flash-attn"),
        Flag(setting="cache_type_k", flag="--cache-type-k"),
        Flag(setting="cache_type_v", flag="--cache-type-v"),
        Flag(setting="threads", flag="--threads"),
        Flag(setting="spec_type", flag="--spec-type"),
    ),
    settings={
        "parallel": SettingSpec(
            type="int",
            default=64,
            minimum=1,
            help="server slots: requests decoded together",
            source="derived: the seeds' sweep goes to 64 requests at once",
        ),
        "ctx_size": SettingSpec(
            type="int",
            default=65536,
            minimum=256,
            help="KV cache size in tokens (shared by all slots when kv_unified)",
            source="derived: 64 slots x the sweep's 640-token requests, with room",
        ),
        "kv_unified": SettingSpec(
            type="bool",
            default=True,
            help="one KV pool for all slots (a request may use all of ctx_size)",
            source="derived",
        ),
        "n_gpu_layers": SettingSpec(
            type="str",
            default="all",
            help="layers offloaded to the GPU ('all', 'auto' or a number)",
            source="seed repo: --n-gpu-layers 999 (every layer)",
        ),
        "flash_attn": SettingSpec(
            type="str",
            default="on",
            choices=("on", "off", "auto"),
            help="flash attention",
            source="seed repo local rig: -fa 1",
        ),
        "cache_type_k": SettingSpec(
            type="str",
            default="f16",
            choices=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
            help="KV cache dtype for K",
            source="seed repo local rig: -ctk f16 (q8_0 measured -12% decode on Turing)",
        ),
        "cache_type_v": SettingSpec(
            type="str",
            default="f16",
            choices=("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1"),
            help="KV cache dtype for V",
            source="seed repo local rig: -ctv f16",
        ),
        "threads": SettingSpec(
            type="int",
            default=None,
            minimum=1,
            help="CPU threads for generation (None: llama.cpp's default)",
            source="derived",
        ),
        "spec_type": SettingSpec(
            type="str",
            default=None,
            help="speculative decoding type; drafter arms set draft-mtp",
            source="llama.cpp PR 23398/24282: Gemma 4 assistant drafters run as draft-mtp",
        ),
    },
    port=8080,
    ready=ReadyCheck(
        health_path="/health",
        health_timeout_s=600.0,
        first_completion_timeout_s=300.0,
        why="llama-server answers /health 200 only once the model is loaded",
    ),
    # llama.cpp reuses a slot's cache around small prompt differences even with the nonce
    # first (seed 002): prompt caching off keeps every prefill real.
    request_extras={"cache_prompt": False},
    thinking_off={"chat_template_kwargs": {"enable_thinking": False}},
    # llama.cpp's request schema has ignore_eos and no min_tokens.
    force_output="ignore_eos",
    requires_gpu=False,
    variants={
        "cpu": GpuVariant(
            settings={
                "parallel": 8,
                "ctx_size": 8 * 2048,
                "kv_unified": None,
                "n_gpu_layers": None,
                "flash_attn": None,
                "cache_type_k": None,
                "cache_type_v": None,
                # On a 2-core machine 1 thread measured several times faster than 2 (the
                # load generator needs the other core); callers on bigger machines
                # override it (the runner passes a `threads` setting).
                "threads": 1,
            },
            install=(
                InstallStep(
                    name="llama-server (CPU)",
                    kind="cmake",
                    argv=(
                        "{bench_python}",
                        "-m",
                        "engines.builds.llamacpp",
                        "--link-into",
                        "{bin_dir}",
                        "--copy-log",
                        "{install_dir}/build.log",
                    ),
                    why="CMake CPU build of llama-server, cached (the local default's engine)",
                ),
            ),
            why="the local default: 8 slots of 2,048 tokens (the sweep's largest shape plus "
            "the template), one thread per core less one for the load generator",
        ),
        "sm_75": GpuVariant(why="seed 001: no Turing changes; the CUDA build targets sm_75"),
    },
    drafter=DrafterArgs(
        args=("--spec-draft-model", "{drafter}", "--spec-draft-n-max", "{draft_tokens}"),
        token_count="required",
        max_tokens=16,
        needs_model=True,
        settings={"spec_type": "draft-mtp"},
        note="seeds: Google's E2B assistant drafter as an exact Q4_0 GGUF; 1-4 tokens",
    ),
    version_probe=("{binary}", "--version"),
    build_id="llama.cpp-{version}-{variant}",
)
