"""vLLM 0.33.0 from PyPI (its own torch 2.14.0+cu130), serving the W4A16 checkpoint.

Settings are the seeds' L4 run: 85% of the card, 64 running requests, 16,384 tokens each,
bfloat16. On Turing (sm_75, seed 001) there is no bfloat16, so float16, and vLLM's Triton
attention needs its KV tile clamped to fit 64 KiB of shared memory (the
vllm-triton-tile-clamp-sm75 patch); it then held an 880,057-token cache at 85%.
The drafter is Google's Gemma 4 assistant, which vLLM 0.33 runs as MTP ("gemma4_assistant"
drafts become gemma4_mtp); arms say how many tokens it drafts (vllm-d1 .. vllm-d4).
The server is started as `python -m vllm.entrypoints.cli.main serve` (what the `vllm`
console script runs), so the interpreter's bin folder need not be on PATH: on the seeds'
AMI it was not.
"""

from __future__ import annotations

from engines.recipes.schema import (
    DrafterArgs,
    EngineRecipe,
    Flag,
    GpuVariant,
    InstallStep,
    JsonArg,
    ReadyCheck,
    SettingSpec,
)

__all__ = ["RECIPE"]

RECIPE = EngineRecipe(
    name="vllm",
    display_name="vLLM",
    arm_prefix="vllm",
    version="0.33.0",
    install=(
        InstallStep(
            name="pip vllm",
            kind="pip",
            argv=("{python}", "-m", "pip", "install", "vllm=={version}"),
            why="the pinned wheel from PyPI, built for CUDA 13.0, with its own torch 2.14.0",
        ),
    ),
    serve=(
        "{python}",
        "-m",
        "vllm.entrypoints.cli.main",
        "serve",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),
    flags=(
        Flag(setting="memory_fraction", flag="--gpu-memory-utilization"),
        Flag(setting="max_running", flag="--max-num-seqs"),
        Flag(setting="context", flag="--max-model-len"),
        Flag(setting="dtype", flag="--dtype"),
        Flag(setting="kv_cache_dtype", flag="--kv-cache-dtype"),
        Flag(setting="language_model_only", flag="--language-model-only", form="switch"),
    ),
    settings={
        "memory_fraction": SettingSpec(
            type="float",
            default=0.85,
            minimum=0.05,
            maximum=1.0,
            help="fraction of GPU memory for weights, activations and KV cache",
            source="seed 000 (L4): --gpu-memory-utilization 0.85; seed 001 (T4): 85%",
        ),
        "max_running": SettingSpec(
            type="int",
            default=64,
            minimum=1,
            help="requests decoded together at most",
            source="seed 000 (L4): 64 running requests",
        ),
        "context": SettingSpec(
            type="int",
            default=16384,
            minimum=256,
            help="prompt + output tokens per request",
            source="seed 000 (L4): 16,384 tokens each",
        ),
        "dtype": SettingSpec(
            type="str",
            default="bfloat16",
            choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
            help="activation dtype",
            source="seed repo g6 rig: bfloat16 on the L4; float16 on sm_75",
        ),
        "kv_cache_dtype": SettingSpec(
            type="str",
            default="auto",
            help="KV cache dtype (its size follows from memory_fraction)",
            source="seed repo: --kv-cache-dtype auto",
        ),
        "language_model_only": SettingSpec(
            type="bool",
            default=True,
            help="load Gemma 4's text model only (no vision/audio towers)",
            source="seed repo T4 rigs: --language-model-only",
        ),
    },
    port=8010,
    ready=ReadyCheck(
        health_path="/health",
        health_timeout_s=1200.0,
        first_completion_timeout_s=600.0,
        why="seeds: 110-300 s to ready (torch.compile and CUDA graphs before /health)",
    ),
    thinking_off={"chat_template_kwargs": {"enable_thinking": False}},
    force_output="ignore_eos+min_tokens",
    env_names=("HF_TOKEN",),
    requires_gpu=True,
    variants={
        "sm_75": GpuVariant(
            settings={"dtype": "float16"},
            patches=("vllm-triton-tile-clamp-sm75",),
            why="seed 001: Turing has no bfloat16, and Triton attention's KV tile for "
            "Gemma 4's 256/512-wide heads overflows 64 KiB of shared memory",
        ),
    },
    drafter=DrafterArgs(
        args=(
            "--speculative-config",
            JsonArg(
                template={
                    "method": "mtp",
                    "model": "{drafter}",
                    "num_speculative_tokens": "{draft_tokens}",
                }
            ),
        ),
        token_count="required",
        max_tokens=16,
        needs_model=True,
        note="seeds: 1-4 drafted tokens; 4 best for one request, 1 from ~16 requests on T4",
    ),
    version_probe=(
        "{python}",
        "-c",
        "import torch, vllm; print(vllm.__version__, torch.__version__, torch.version.cuda)",
    ),
    build_id="vllm-{version}-{variant}{patches}",
)
