"""Static residency of the batch-1 int4 decode step's kernels on an H200, on a machine
with no GPU: each kernel of a Gemma 4 E2B layer, in the order the step launches them,
built for sm_90 at the configuration the pinned table names (`int4_tuning`), with its
registers and stack frame a thread (`ptxas -v`), its shared memory, its programs, how
many of them an SM holds, and what its SASS does after `griddepcontrol.wait` (its serial
path once the kernel before has ended): barriers, instructions, global loads and how
many of those are 2 bytes or narrower. Then, for each kernel, whether one of its
programs still fits on an SM beside the programs the kernel before left there (its
programs spread evenly over the SMs).

Why: a dependent launch lets a kernel's programs start while the kernel before still
runs, and do what depends on no earlier kernel (their first chunk of weights, the
attention's keys) before their wait. That overlap needs room on the SMs: a program that
does not fit beside the kernel before starts only as that kernel's programs leave.

    python -m benchmarks.decode_residency [--table other.json] [--out result.json]

Prints a table; needs Triton (no GPU).
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from benchmarks.int4_issue_bound import SMS, ptxas_usage, sass
from engines.pytorch import attention_kernel, int4_tuning, kernels, triton_attention, triton_int4

SM90 = GPUTarget("cuda", 90, 32)
GPU = "NVIDIA H200"
REGISTERS_AN_SM, SHARED_AN_SM, WARPS_AN_SM = 65536, 228 * 1024, 64
GROUP, HEADS, BUCKET = 32, 8, 1024


@dataclass(frozen=True)
class Residency:
    """One kernel of the step, as built and as it would sit on the SMs."""

    name: str
    config: str
    programs: int
    warps: int
    registers: int  # a thread
    shared_bytes: int
    an_sm: int  # programs an SM holds
    barriers_after_wait: int
    instructions_after_wait: int  # in its SASS, a loop's body once
    # Its global loads after the wait (`LDG`), and those of 2 bytes or fewer a thread:
    # each narrow load costs L1 a request for little data (40-52 of them where the inputs
    # were read as 2-byte strided slices, 4-8 in the shipped form, made every product
    # slower: records/2026-12-05-h100-strided-inputs.md).
    loads_after_wait: int
    narrow_loads_after_wait: int
    # Local memory a thread (values that did not fit its registers): each use a round trip
    # through L1 (a first form of a split residual step held 1,480 bytes and ran several
    # times slower: records/2026-12-06-h100-ple-pair-refused.md).
    stack_bytes: int = 0
    beside_previous: int | None = None  # its programs that fit beside the kernel before's


def _aligned(signature: dict[str, str]) -> dict[tuple[int, ...], list[list[Any]]]:
    # As a launch specializes: pointers 16-byte aligned, and at E2B's sizes every integer
    # argument (sizes, strides, lengths) a multiple of 16.
    return {(i,): [["tt.divisibility", 16]] for i, kind in enumerate(signature.values())
            if kind.startswith("*") or kind == "i32"}  # fmt: skip


def _gemv_int4(n: int, k: int, prologue: int, epilogue: int, scale: bool) -> tuple[Any, str, int]:
    # The table keys a residual-after product by its plain form (`int4_tuning.prune_gemv`).
    key = int4_tuning.gemv_key(
        n, k, prologue, 0 if epilogue == kernels.RESIDUAL_AFTER else epilogue, GROUP
    )
    config = int4_tuning.config_from_label(int4_tuning.pinned_tables()[GPU]["gemv_int4"][key])
    built = build_gemv_int4(prologue, epilogue, scale, config)
    return built, int4_tuning.config_label(config), -(-n // config.kwargs["BLOCK_N"])


def build_gemv_int4(prologue: int, epilogue: int, scale: bool, config: triton.Config) -> Any:
    """`triton_int4.gemv_int4` for sm_90 in one of the forms `kernels` launches, at
    `config`, with dependent launch."""
    names = triton_int4.gemv_int4.fn.arg_names[:14]
    kinds = {"wq_ptr": "*i32", "count_ptr": "*i32", "eps": "fp32", "N": "i32", "K": "i32"}
    signature = {name: kinds.get(name, "*bf16") for name in names}
    constants = {"PROLOGUE": prologue, "SCALE": scale, "EPILOGUE": epilogue, "PDL": True,
                 "GROUP": GROUP, **config.kwargs}  # fmt: skip
    return _build(
        triton_int4.gemv_int4.fn, signature, constants, config.num_warps, config.num_stages
    )


def build_attention_partial_normed(head_dim: int, block_l: int, writes_kv: bool) -> Any:
    """`triton_attention.attention_partial_normed` for sm_90 as E2B launches it (8 query
    heads on one KV head), at the warps `attention_kernel` gives heads `head_dim` wide."""
    block_g = attention_kernel.split(BUCKET, HEADS)[2]
    constants = {"HEADS": HEADS, "KV_HEADS": 1, "GROUP": HEADS, "BLOCK_G": block_g,
                 "D": head_dim, "BLOCK_L": block_l, "SCALED": False, "WRITES_KV": writes_kv,
                 "PDL": True}  # fmt: skip
    signature = {name: "*bf16" for name in ("qkv_ptr", "nq_ptr", "nk_ptr", "cos_ptr", "sin_ptr")}
    signature |= {"pos_ptr": "*i64", "k_ptr": "*bf16", "v_ptr": "*bf16", "hidden_ptr": "*u8"}
    signature |= {"acc_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32"}
    ints = ("kv_len", "stride_kh", "stride_kl", "stride_vh", "stride_vl")
    signature |= dict.fromkeys(ints, "i32") | {"scale": "fp32", "eps": "fp32"}
    warps = attention_kernel.partial_warps(head_dim)
    return _build(triton_attention.attention_partial_normed, signature, constants, warps)


def _attention(head_dim: int, writes_kv: bool) -> list[tuple[str, Any, str, int]]:
    block_l, blocks, block_g = attention_kernel.split(BUCKET, HEADS)
    warps, combine_warps = attention_kernel.partial_warps(head_dim), attention_kernel.COMBINE_WARPS
    partial = build_attention_partial_normed(head_dim, block_l, writes_kv)
    combine_blocks = attention_kernel.combine_blocks(head_dim, blocks, combine_warps)
    combine_constants = {"GROUP": HEADS, "BLOCK_G": block_g, "DV": head_dim, "PDL": True,
                         "BLOCK_S": combine_blocks}  # fmt: skip
    combine_signature = {"acc_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32",
                         "out_ptr": "*bf16", "blocks": "i32"}  # fmt: skip
    combine = _build(
        triton_attention.attention_combine, combine_signature, combine_constants, combine_warps
    )
    return [
        ("attention partial", partial, f"keys a block {block_l}, warps {warps}", blocks),
        ("attention combine", combine, f"warps {combine_warps}", HEADS),
    ]


def _build(
    fn: Any, signature: dict[str, str], constants: dict[str, Any], warps: int, stages: int = 3
) -> Any:
    source = ASTSource(
        fn=fn,
        signature=signature | dict.fromkeys(constants, "constexpr"),
        constexprs=constants,
        attrs=_aligned(signature),
    )
    options = {"num_warps": warps, "num_stages": stages, "launch_pdl": True}
    return triton.compile(source, target=SM90, options=options)


def barriers_after_wait(built: Any) -> int:
    """The `BAR.SYNC`s in `built`'s SASS after its `griddepcontrol.wait`."""
    return _barriers(_after_wait(sass(built)))


def _barriers(code: str) -> int:
    return len(re.findall(r"\bBAR\.SYNC", code))


def _after_wait(code: str) -> str:
    # griddepcontrol.wait is ACQBULK in SASS.
    return code[code.find("ACQBULK") :] if "ACQBULK" in code else code


def _instructions(code: str) -> int:
    return len(re.findall(r"/\*[0-9a-f]{4,}\*/ ", code))


def _loads(code: str) -> tuple[int, int]:
    widths = [_load_bytes(suffix) for suffix in re.findall(r"\bLDG((?:\.[A-Z0-9]+)+)", code)]
    return len(widths), sum(width <= 2 for width in widths)


# LDG's width modifiers; none is 32 bits.
_LOAD_WIDTHS = {"128": 16, "64": 8, "U16": 2, "S16": 2, "U8": 1, "S8": 1}


def _load_bytes(suffix: str) -> int:
    return next((_LOAD_WIDTHS[m] for m in suffix.split(".") if m in _LOAD_WIDTHS), 4)


def residency(name: str, built: Any, config: str, programs: int) -> Residency:
    warps = built.metadata.num_warps
    used, stack = ptxas_usage(built)
    shared = built.metadata.shared
    an_sm = min(
        REGISTERS_AN_SM // (_warp_registers(used) * warps),
        SHARED_AN_SM // shared if shared else WARPS_AN_SM,
        WARPS_AN_SM // warps,
    )
    after = _after_wait(sass(built))
    return Residency(name, config, programs, warps, used, shared, an_sm,
                     _barriers(after), _instructions(after), *_loads(after),
                     stack_bytes=stack)  # fmt: skip


def layer(head_dim: int, writes_kv: bool, double_mlp: bool) -> list[tuple[str, Any, str, int]]:
    """The kernels of one E2B layer at batch 1 with int4 weights, in launch order."""
    q_rows = (HEADS + (2 if writes_kv else 0)) * head_dim
    inner = 12288 if double_mlp else 6144
    products = [
        ("q/k/v" if writes_kv else "q", (q_rows, 1536, kernels.RMS_NORM_AFTER, 0, False)),
        ("o", (1536, HEADS * head_dim, kernels.PLAIN, kernels.RESIDUAL_AFTER, False)),
        ("gate/up", (inner, 1536, kernels.RMS_NORM_AFTER, kernels.GELU_PAIR, False)),
        ("down", (1536, inner, kernels.PLAIN, 0, False)),
        ("per-layer gate", (256, 1536, kernels.RESIDUAL, kernels.GELU_TIMES, False)),
        ("per-layer projection", (1536, 256, kernels.PLAIN, kernels.RESIDUAL_AFTER, True)),
    ]
    built = [(name, *_gemv_int4(*form)) for name, form in products]
    return [built[0], *_attention(head_dim, writes_kv), *built[1:]]


def _room(before: Residency, resident: int, kernel: Residency) -> int:
    """Programs of `kernel` an SM holds beside `resident` programs of `before`."""
    left = (
        REGISTERS_AN_SM - _program_registers(before) * resident,
        SHARED_AN_SM - before.shared_bytes * resident,
        WARPS_AN_SM - before.warps * resident,
    )
    need = (_program_registers(kernel), kernel.shared_bytes, kernel.warps)
    return max(0, min(have // want for have, want in zip(left, need, strict=True) if want))


def _warp_registers(registers: int) -> int:
    return -(-registers * 32 // 256) * 256  # allocated a warp at a time, 256 at a time


def _program_registers(kernel: Residency) -> int:
    return _warp_registers(kernel.registers) * kernel.warps


def with_room(kernels_in_order: list[Residency]) -> list[Residency]:
    """Each kernel, with how many of its programs fit on the SMs beside the programs of
    the kernel before it (the last of the layer, for the first), that kernel's programs
    spread as evenly as the SMs hold them."""
    out = []
    for i, kernel in enumerate(kernels_in_order):
        before = kernels_in_order[i - 1]
        fuller = min(before.an_sm, -(-before.programs // SMS))
        fuller_sms = min(SMS, before.programs % SMS or SMS)
        if before.programs >= before.an_sm * SMS:  # another wave waits: every SM is full
            fuller, fuller_sms = before.an_sm, SMS
        room = fuller_sms * _room(before, fuller, kernel)
        room += (SMS - fuller_sms) * _room(before, fuller - 1, kernel)
        out.append(Residency(**{**asdict(kernel), "beside_previous": min(room, kernel.programs)}))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--table", type=Path, help="a pinned table other than the shipped one")
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.table:
        int4_tuning.use_pinned_tables(args.table)
    layers = {
        "sliding layer that writes KV (12 a step)": layer(256, True, False),
        "sliding layer that reads KV, double MLP (16 a step)": layer(256, False, True),
    }
    result: dict[str, list[dict[str, Any]]] = {}
    for title, built in layers.items():
        rows = with_room([residency(*kernel) for kernel in built])
        result[title] = [asdict(row) for row in rows]
        print(f"\n{title}\n")
        print("| kernel | configuration | programs | warps | registers | stack bytes "
              "| shared KB | an SM "
              "| barriers after the wait | instructions after it "
              "| loads after it (2 bytes or fewer) "
              "| its programs that fit beside the kernel before's |")  # fmt: skip
        print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for r in rows:
            cells = (f"`{r.config}`", r.programs, r.warps, r.registers, r.stack_bytes,
                     f"{r.shared_bytes / 1024:.0f}", r.an_sm, r.barriers_after_wait,
                     r.instructions_after_wait,
                     f"{r.loads_after_wait} ({r.narrow_loads_after_wait})",
                     f"{r.beside_previous} of {r.programs}")  # fmt: skip
            print(f"| {r.name} | " + " | ".join(str(cell) for cell in cells) + " |")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
