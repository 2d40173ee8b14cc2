"""The engine's settings: one typed record, and the command line that fills it."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

DEFAULT_PORT = 8100
# How the decode program attends (engines.pytorch.programs).
ATTENTION_FORMS = ("matmul", "reduction", "kernel", "normed-kernel")


@dataclass(frozen=True)
class EngineConfig:
    model: str = "random:tiny"
    served_model_name: str | None = None
    host: str = "127.0.0.1"
    port: int = DEFAULT_PORT
    max_running: int = 64
    max_model_len: int | None = None
    dtype: str = "auto"
    quantize: str = "none"  # w4a16: int4 weights quantized at load
    int4_configs: str | None = None  # the int4 kernels' pinned table (None: the shipped one)
    device: str = "auto"
    seed: int = 0
    batch_invariant: str = "auto"  # auto: on for CPU, off for CUDA
    decode_attention: str = "auto"  # auto: ragged where batch-invariant, else batched
    cuda_graphs: str = "auto"  # auto: on where decode is batched on CUDA
    packed_prefill: str = "auto"  # auto: on where decode is not batch-invariant
    fused_norms: str = "auto"  # auto: on for CUDA
    decode_program: str = "auto"  # auto: the model's own decode step where decode is batched
    gemv_kernel: str = "auto"  # batch-1 projections of the decode program (auto: triton on CUDA)
    attention_form: str = "normed-kernel"  # decode program attention: one of ATTENTION_FORMS
    dependent_launch: str = "auto"  # batch-1 Triton kernels as PDL dependents (auto: sm_90+)
    compile_mode: str = "auto"  # torch.compile mode (auto: default for a CUDA program; none)
    graph_warmup_len: int = 1024
    async_decode: str = "on"  # queue step n+1 before reading step n (batched decode only)
    profile_dir: str | None = None
    profile_decode_steps: int = 32
    threads: int = 1
    prefill_chunk: int = 512
    prefill_budget: int = 2048
    log_level: str = "info"

    def batch_invariant_on(self, device_type: str) -> bool:
        if self.batch_invariant == "auto":
            return device_type == "cpu"
        return self.batch_invariant == "on"

    def batched_decode_on(self, device_type: str) -> bool:
        # The batched attention sums keys in an order that depends on the KV bucket, so
        # it is not batch-invariant: where invariance is asked for, rows go one by one.
        if self.decode_attention == "auto":
            return not self.batch_invariant_on(device_type)
        return self.decode_attention == "batched"

    def cuda_graphs_on(self, device_type: str) -> bool:
        if self.cuda_graphs == "auto":
            return device_type == "cuda" and self.batched_decode_on(device_type)
        return self.cuda_graphs == "on"

    def fused_norms_on(self, device_type: str) -> bool:
        # One rounding step apart from transformers' RMSNorm in bf16: on CUDA, where the
        # kernel count matters and invariance is not promised; off on CPU by default.
        if self.fused_norms == "auto":
            return device_type == "cuda"
        return self.fused_norms == "on"

    def decode_program_on(self, device_type: str) -> bool:
        if self.decode_program == "auto":
            return self.batched_decode_on(device_type)
        return self.decode_program == "on"

    def triton_gemv_on(self, device_type: str) -> bool:
        if self.gemv_kernel == "auto":
            return device_type == "cuda" and self.decode_program_on(device_type)
        return self.gemv_kernel == "triton"

    def compile_mode_for(self, device_type: str) -> str | None:
        """torch.compile mode of the decode step, or None. auto: "default" for a decode
        program on CUDA, where each kind of layer compiles once at start (its time is in
        the server's ready time, benchmarks/records/); off elsewhere, and for a model that
        turns out to have no program (the server passes `compile_without_program=False`):
        the whole-model compile takes far longer, once per shape."""
        if self.compile_mode == "auto":
            on = device_type == "cuda" and self.decode_program_on(device_type)
            return "default" if on else None
        return None if self.compile_mode == "none" else self.compile_mode

    def packed_prefill_on(self, device_type: str) -> bool:
        # Packing changes a prompt's row count, so with batch invariance on each prompt
        # keeps a forward of its own.
        if self.packed_prefill == "auto":
            return not self.batch_invariant_on(device_type)
        return self.packed_prefill == "on"


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engines.pytorch",
        description="The project's PyTorch engine: OpenAI-compatible, continuous batching.",
    )
    p.add_argument(
        "--model", default=EngineConfig.model, help="random:<name>, a local HF folder, or a hub id"
    )
    p.add_argument("--served-model-name", default=None, help="name clients use (default: --model)")
    p.add_argument("--host", default=EngineConfig.host)
    p.add_argument("--port", type=int, default=DEFAULT_PORT)
    p.add_argument(
        "--max-running",
        type=_positive,
        default=EngineConfig.max_running,
        help="requests decoded together at most (KV slots)",
    )
    p.add_argument(
        "--max-model-len",
        type=_positive,
        default=None,
        help="prompt + output tokens per request (default: the model's, capped at 8192)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        help="auto (bf16 on sm_80+, fp16 on older GPUs, fp32 on CPU), float32, bfloat16, float16",
    )
    p.add_argument(
        "--quantize",
        choices=("none", "w4a16"),
        default=EngineConfig.quantize,
        help="w4a16: quantize the model's Linear layers and embedding tables to int4 at load "
        "(round-to-nearest, symmetric, groups of 32; engines.pytorch.checkpoint). A "
        "compressed-tensors W4A16 checkpoint loads as int4 without it",
    )
    p.add_argument(
        "--int4-configs",
        metavar="PATH",
        default=None,
        help="the int4 kernels' block shapes per GPU model and shape, as "
        "benchmarks/int4_gemv_sweep.py --table writes them (default: the table shipped "
        "in engines/pytorch/int4_configs.json)",
    )
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N")
    p.add_argument("--seed", type=int, default=0, help="seed of random:<name> weights")
    p.add_argument(
        "--batch-invariant",
        choices=("auto", "on", "off"),
        default="auto",
        help="decode rows independent of batch size (auto: on for CPU, off for CUDA)",
    )
    p.add_argument(
        "--decode-attention",
        choices=("auto", "ragged", "batched"),
        default="auto",
        help="ragged: one attention call per row (batch-invariant); batched: one per layer "
        "over static pools (auto: batched unless batch-invariant)",
    )
    p.add_argument(
        "--cuda-graphs",
        choices=("auto", "on", "off"),
        default="auto",
        help="replay the batched decode step as CUDA graphs (auto: on for batched CUDA decode)",
    )
    p.add_argument(
        "--packed-prefill",
        choices=("auto", "on", "off"),
        default="auto",
        help="several prompts per prefill forward (auto: on unless batch-invariant)",
    )
    p.add_argument(
        "--fused-norms",
        choices=("auto", "on", "off"),
        default="auto",
        help="RMSNorm as one fused kernel (auto: on for CUDA)",
    )
    p.add_argument(
        "--decode-program",
        choices=("auto", "on", "off"),
        default="auto",
        help="batched decode through the model's own decode program (merged projections, "
        "per-layer compilable; Gemma 4) instead of transformers' modules, where one "
        "exists (auto: on where decode is batched)",
    )
    p.add_argument(
        "--gemv-kernel",
        choices=("auto", "cublas", "triton"),
        default=EngineConfig.gemv_kernel,
        help="batch-1 projections of the decode program: cuBLAS, or the Triton kernels with "
        "the norm, GELU gate or residual step before them fused in (engines.pytorch.kernels; "
        "auto: triton on CUDA)",
    )
    p.add_argument(
        "--attention-form",
        choices=ATTENTION_FORMS,
        default=EngineConfig.attention_form,
        help="decode program attention: at batch 1 one split-KV Triton kernel that also "
        "makes the q/k norms, rotary and KV write, and a combine (normed-kernel; "
        "engines.pytorch.attention_kernel; other batch sizes and the CPU keep the "
        "products), the same kernel after compiled norms and rotary (kernel), as matrix "
        "products, or as reductions that torch.compile fuses",
    )
    p.add_argument(
        "--dependent-launch",
        choices=("auto", "off"),
        default=EngineConfig.dependent_launch,
        help="launch the batch-1 Triton kernels as programmatic dependents of the kernel "
        "before them, so each fetches its first weights while that one drains "
        "(engines.pytorch.dependent_launch; auto: on where the GPU has it, sm_90 and later)",
    )
    p.add_argument(
        "--compile-mode",
        default=EngineConfig.compile_mode,
        help="torch.compile the batched decode step: auto, none, or a torch.compile mode "
        "(default, max-autotune-no-cudagraphs). With a decode program each kind of layer "
        "compiles once (auto: default for a decode program on CUDA, else none)",
    )
    p.add_argument(
        "--async-decode",
        choices=("on", "off"),
        default=EngineConfig.async_decode,
        help="queue each batched decode step on the device, fed with the previous step's "
        "tokens, before reading those tokens, so detokenization and streaming overlap "
        "the next step (greedy rows; nothing on the path waits for the device)",
    )
    p.add_argument(
        "--profile-dir",
        default=None,
        help="write a torch.profiler trace and table of --profile-decode-steps decode steps "
        "here, once, from the 64th decode step on (engines.pytorch.profiling; default: "
        "no profile)",
    )
    p.add_argument(
        "--profile-decode-steps",
        type=_positive,
        default=EngineConfig.profile_decode_steps,
        help="decode steps to profile into --profile-dir",
    )
    p.add_argument(
        "--graph-warmup-len",
        type=int,
        default=EngineConfig.graph_warmup_len,
        help="capture decode graphs for KV lengths up to this at start (0: capture on use)",
    )
    p.add_argument(
        "--threads",
        type=int,
        default=EngineConfig.threads,
        help="CPU threads for torch ops (0: torch's default); 1 suits small models on shared hosts",
    )
    p.add_argument(
        "--prefill-chunk",
        type=_positive,
        default=EngineConfig.prefill_chunk,
        help="prompt tokens per prefill forward",
    )
    p.add_argument(
        "--prefill-budget",
        type=_positive,
        default=EngineConfig.prefill_budget,
        help="prompt tokens prefilled between two decode steps at most",
    )
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    return p


def parse_args(argv: Sequence[str] | None = None) -> EngineConfig:
    ns = build_parser().parse_args(argv)
    return EngineConfig(**vars(ns))
