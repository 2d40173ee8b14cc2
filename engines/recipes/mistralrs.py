"""mistral.rs v0.9.5, built with cargo for the GPU's compute capability, serving the GGUF.

Install: `cargo install` of the `mistralrs` CLI at the v0.9.5 tag with `--features cuda`
and `CUDA_COMPUTE_CAP` set to the GPU's capability; flash-attn is added on sm_80+ and left
out on Turing (seed 001: its flash-attn feature needs sm_80). The seeds also needed cuRAND's
development package (libcurand-dev-13-1): the user data installs the one matching the
default CUDA toolkit where that toolkit lacks it (`ensure_curand_dev` in infra/user_data.sh),
and rustup's toolchain for cargo.

Settings. mistral.rs plans ~395 MiB of activations per running request, so 64 do not load
on the L4 (seed 000: "needs 28292 MiB"); the seeds served 32 requests with a fixed
16,384-token cache and 4,096 batched tokens on the L4, and 4 requests with an 8,192-token
cache on the T4. Those flag spellings are the seeds' (v0.9.5); this project cannot run
mistral.rs's parser (crates.io is out of reach), so they are the one argv not checked
against a real parser.

Drafter: refused. The seeds' L4 drafter arm ran at 0.95x (slower than none), on the T4 it
did not run at all (Google's drafter loads as bf16 against a float16 target: "dtype
mismatch in matmul"), and the serve CLI of this version is not known to take a drafter.
mistral.rs thinks by default on Gemma 4: thinking off is sent in every request.
"""

from __future__ import annotations

from engines.recipes.schema import (
    DrafterRefusal,
    EngineRecipe,
    Flag,
    GpuVariant,
    InstallStep,
    ReadyCheck,
    SettingSpec,
)

__all__ = ["RECIPE"]

_GIT = "https://github.com/EricLBuehler/mistral.rs"

RECIPE = EngineRecipe(
    name="mistralrs",
    display_name="mistral.rs",
    arm_prefix="mistralrs",
    version="v0.9.5",
    install=(
        InstallStep(
            name="cargo mistralrs (CUDA, flash-attn)",
            kind="cargo",
            argv=(
                "cargo",
                "install",
                "--locked",
                "--git",
                _GIT,
                "--tag",
                "{version}",
                "mistralrs-cli",
                "--features",
                "cuda flash-attn",
            ),
            env={"CUDA_COMPUTE_CAP": "{cuda_arch}"},
            why="seed 000: cargo install, CUDA 13.1, built for the GPU's compute capability",
        ),
    ),
    binary="mistralrs",
    serve=(
        "{binary}",
        "serve",
        "--host",
        "{host}",
        "--port",
        "{port}",
        # The HF token is named, never passed: mistral.rs reads it from that variable.
        "--token-source",
        "env:HF_TOKEN",
        "-m",
        "{model}",
    ),
    flags=(
        Flag(setting="max_running", flag="--max-seqs"),
        Flag(setting="kv_cache_tokens", flag="--kv-cache", value_format="{value}tokens"),
        Flag(setting="max_batched_tokens", flag="--max-num-batched-tokens"),
        Flag(setting="dtype", flag="--dtype"),
    ),
    settings={
        "max_running": SettingSpec(
            type="int",
            default=32,
            minimum=1,
            help="sequences running at once (~395 MiB of activations each)",
            source="seed 000 (L4): --max-seqs 32 (64 does not load); seed 001 (T4): 4",
        ),
        "kv_cache_tokens": SettingSpec(
            type="int",
            default=16384,
            minimum=256,
            help="fixed KV cache size in tokens",
            source="seed 000 (L4): --kv-cache 16384tokens; seed 001 (T4): 8,192",
        ),
        "max_batched_tokens": SettingSpec(
            type="int",
            default=4096,
            minimum=1,
            help="tokens per scheduler step at most",
            source="seed 000 (L4): --max-num-batched-tokens 4096",
        ),
        "dtype": SettingSpec(
            type="str",
            default=None,
            choices=("auto", "bf16", "f16", "f32"),
            help="activation dtype (None: mistral.rs's auto)",
            source="seed 001 (T4): float16",
        ),
    },
    port=8020,
    ready=ReadyCheck(
        health_path="/health",
        health_timeout_s=900.0,
        first_completion_timeout_s=300.0,
        why="seeds: 24-46 s to ready",
    ),
    # Seeds 000/001: mistral.rs thinks by default on Gemma 4 (BFCL 0.8675 and 10x the time).
    thinking_off={"chat_template_kwargs": {"enable_thinking": False}},
    # Not known to accept ignore_eos or min_tokens: output length is not forced.
    force_output="none",
    env_names=("HF_TOKEN",),
    requires_gpu=True,
    variants={
        "sm_75": GpuVariant(
            settings={"max_running": 4, "kv_cache_tokens": 8192, "dtype": "f16"},
            install=(
                InstallStep(
                    name="cargo mistralrs (CUDA, no flash-attn)",
                    kind="cargo",
                    argv=(
                        "cargo",
                        "install",
                        "--locked",
                        "--git",
                        _GIT,
                        "--tag",
                        "{version}",
                        "mistralrs-cli",
                        "--features",
                        "cuda",
                    ),
                    env={"CUDA_COMPUTE_CAP": "{cuda_arch}"},
                    why="seed 001: the flash-attn feature needs sm_80",
                ),
            ),
            drafter_refusal="seed 001: Google's drafter loads as bf16 and every drafted "
            "request fails against a float16 target (dtype mismatch in matmul)",
            why="seed 001: built without flash-attn; 4 requests with an 8,192-token cache",
        ),
    },
    drafter=DrafterRefusal(
        reason="mistral.rs v0.9.5 runs a drafter only from its SDK, not from the "
        "`mistralrs serve` CLI this project drives (the seeds measured it at 0.95x on the "
        "L4 and it did not run on the T4)"
    ),
    version_probe=("{binary}", "--version"),
    build_id="mistral.rs-{version}-{variant}",
)
