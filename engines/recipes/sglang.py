"""SGLang 0.5.23 from PyPI, serving the W4A16 checkpoint.

Settings are the seeds' L4 run: 80% of the card static (`--mem-fraction-static 0.80`),
64 running requests, decode CUDA graphs up to 64 (0.5.23 spells that
`--cuda-graph-max-bs-decode`: the bare `--cuda-graph-max-bs` is ambiguous to its parser),
bfloat16. On Turing (seed 001): float16, and SGLang's own Marlin kernels are built for
sm_80+ only, so the 4-bit checkpoint loads only with the sglang-marlin-sm75-via-vllm
patch, which calls vLLM 0.33's compiled Turing Marlin: vLLM is installed beside SGLang
with --no-deps (vLLM pins torch 2.14.0, SGLang 2.14.1; SGLang's stays). Marlin's
atomic-add reduction is switched off there (sglang-marlin-atomic-add-off) unless
SGLANG_MARLIN_USE_ATOMIC_ADD=1.

Not carried: the two Gemma 4 checkpoint patches the seeds also applied (the attention shim
that runs only for multimodal configs, and the int4 embed_tokens / per-layer tables loaded
as uninitialised bf16) are described too loosely in the seeds to write; see the report.

The drafter: `--speculative-algorithm NEXTN` with Google's assistant drafter, which 0.5.23
promotes to FROZEN_KV_MTP for Gemma4AssistantForCausalLM drafts; top-k 1, so a verify
window of N+1 tokens for N drafted.
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

__all__ = ["RECIPE"]

RECIPE = EngineRecipe(
    name="sglang",
    display_name="SGLang",
    arm_prefix="sglang",
    version="0.5.23",
    install=(
        InstallStep(
            name="pip sglang",
            kind="pip",
            argv=("{python}", "-m", "pip", "install", "sglang=={version}"),
            why="the pinned release from PyPI",
        ),
    ),
    serve=(
        "{python}",
        "-m",
        "sglang.launch_server",
        "--model-path",
        "{model}",
        "--host",
        "{host}",
        "--port",
        "{port}",
    ),
    flags=(
        Flag(setting="memory_fraction", flag="--mem-fraction-static"),
        Flag(setting="max_running", flag="--max-running-requests"),
        Flag(setting="cuda_graph_max_bs", flag="--cuda-graph-max-bs-decode"),
        Flag(setting="context", flag="--context-length"),
        Flag(setting="dtype", flag="--dtype"),
        Flag(setting="kv_cache_dtype", flag="--kv-cache-dtype"),
    ),
    settings={
        "memory_fraction": SettingSpec(
            type="float",
            default=0.80,
            minimum=0.05,
            maximum=1.0,
            help="static fraction of GPU memory (weights and KV pool)",
            source="seed 000 (L4): --mem-fraction-static 0.80",
        ),
        "max_running": SettingSpec(
            type="int",
            default=64,
            minimum=1,
            help="requests running at once at most",
            source="seed 000 (L4): 64 running requests",
        ),
        "cuda_graph_max_bs": SettingSpec(
            type="int",
            default=64,
            minimum=1,
            help="largest decode batch captured as a CUDA graph",
            source="seed 000 (L4): decode CUDA graphs up to 64",
        ),
        "context": SettingSpec(
            type="int",
            default=16384,
            minimum=256,
            help="prompt + output tokens per request",
            source="derived: as vLLM's 16,384 in seed 000",
        ),
        "dtype": SettingSpec(
            type="str",
            default="bfloat16",
            choices=("auto", "half", "float16", "bfloat16", "float", "float32"),
            help="activation dtype",
            source="seed 000 (L4): bfloat16; seed 001 (T4): float16",
        ),
        "kv_cache_dtype": SettingSpec(
            type="str",
            default="auto",
            choices=("auto", "fp8_e5m2", "fp8_e4m3", "bf16", "bfloat16"),
            help="KV cache dtype (its size follows from memory_fraction)",
            source="derived: the model's dtype",
        ),
    },
    port=8030,
    ready=ReadyCheck(
        health_path="/health",
        health_timeout_s=1200.0,
        first_completion_timeout_s=600.0,
        why="seeds: 61-334 s to ready (weight repack, CUDA graph capture)",
    ),
    # Seed 000: send thinking off explicitly to SGLang.
    thinking_off={"chat_template_kwargs": {"enable_thinking": False}},
    force_output="ignore_eos+min_tokens",
    env_names=("HF_TOKEN",),
    requires_gpu=True,
    variants={
        "sm_75": GpuVariant(
            settings={"dtype": "float16"},
            extra_install=(
                InstallStep(
                    name="pip vllm beside sglang (Turing Marlin)",
                    kind="pip",
                    argv=("{python}", "-m", "pip", "install", "--no-deps", "vllm==0.33.0"),
                    why="seed 001: the Marlin patch calls vLLM 0.33's compiled sm_75 "
                    "kernels; --no-deps keeps SGLang's torch",
                ),
            ),
            patches=("sglang-marlin-sm75-via-vllm", "sglang-marlin-atomic-add-off"),
            why="seed 001: no bfloat16 on Turing; SGLang's Marlin is sm_80+ only, and "
            "its atomic-add reduction broke greedy repeats on float16",
        ),
    },
    drafter=DrafterArgs(
        args=(
            "--speculative-algorithm",
            "NEXTN",
            "--speculative-draft-model-path",
            "{drafter}",
            "--speculative-num-steps",
            "{draft_tokens}",
            "--speculative-eagle-topk",
            "1",
            "--speculative-num-draft-tokens",
            "{draft_tokens_plus_one}",
        ),
        token_count="required",
        max_tokens=16,
        needs_model=True,
        note="seeds: 4 drafted tokens best up to 8 requests on the L4; loses on the T4",
    ),
    version_probe=(
        "{python}",
        "-c",
        "import torch, sglang; print(sglang.__version__, torch.__version__, torch.version.cuda)",
    ),
    build_id="sglang-{version}-{variant}{patches}",
)
