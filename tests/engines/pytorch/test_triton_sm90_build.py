"""Every batch-1 kernel variant the engine launches compiles for sm_90 (the H200) on a
machine with no GPU: Triton's front end, the LLVM lowering and ptxas (bundled with
Triton) run without a device. The interpreter tests check the arithmetic but not what
only the compiler checks (constexpr globals, inline asm, layouts), and a kernel that
fails to build would otherwise first fail on the GPU machine, in its scarce time.
Skipped where Triton is not installed."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")

from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from engines.pytorch import kernels  # noqa: E402

H200 = GPUTarget("cuda", 90, 32)
PDL = {"launch_pdl": True}  # as an H200 launches them (engines.pytorch.dependent_launch)
GEMV_POINTERS = (
    "x_ptr",
    "b_ptr",
    "nw_ptr",
    "rw_ptr",
    "s_ptr",
    "xo_ptr",
    "m_ptr",
    "count_ptr",
    "w_ptr",
)


def _gemv_source(prologue: int, epilogue: int, scale: bool, pdl: bool) -> ASTSource:
    from engines.pytorch import triton_kernels

    signature = {name: "*bf16" for name in (*GEMV_POINTERS, "y_ptr")} | {"count_ptr": "*i32"}
    signature |= {"N": "i32", "K": "i32", "eps": "fp32"}
    constants = {
        "PROLOGUE": prologue,
        "SCALE": scale,
        "EPILOGUE": epilogue,
        "PDL": pdl,
        "BLOCK_N": 2,
        "BLOCK_K": 2048,
    }
    signature |= dict.fromkeys(constants, "constexpr")
    return ASTSource(fn=triton_kernels.gemv.fn, signature=signature, constexprs=constants)


# What `kernels` launches: (prologue, epilogue, scalar) of each public function.
LAUNCHED = [
    (kernels.PLAIN, kernels.NO_EPILOGUE, False),
    (kernels.RMS_NORM, kernels.NO_EPILOGUE, False),
    (kernels.RMS_NORM_AFTER, kernels.NO_EPILOGUE, False),
    (kernels.RMS_NORM_AFTER, kernels.GELU_PAIR, False),
    (kernels.GELU_MUL, kernels.NO_EPILOGUE, False),
    (kernels.RESIDUAL, kernels.GELU_TIMES, False),
    (kernels.RESIDUAL_NORM, kernels.NO_EPILOGUE, True),
    (kernels.PLAIN, kernels.RESIDUAL_AFTER, False),
    (kernels.PLAIN, kernels.RESIDUAL_AFTER, True),
]


@pytest.mark.parametrize(("prologue", "epilogue", "scale"), LAUNCHED)
def test_gemv_variant_builds_for_sm90(prologue: int, epilogue: int, scale: bool) -> None:
    compiled = triton.compile(
        _gemv_source(prologue, epilogue, scale, pdl=True), target=H200, options=PDL
    )
    assert "griddepcontrol.wait" in compiled.asm["ptx"]
    assert compiled.metadata.launch_pdl


@pytest.mark.parametrize(("head_dim", "block_l"), [(256, 32), (512, 64)])
def test_attention_kernels_build_for_sm90(head_dim: int, block_l: int) -> None:
    from engines.pytorch import triton_attention as attention

    # Gemma 4 E2B: 8 query heads on one KV head; sliding layers 256 wide, full ones 512.
    shape = {"GROUP": 8, "BLOCK_G": 16, "D": head_dim, "DV": head_dim}
    partial = {**shape, "BLOCK_L": block_l, "SCALED": False, "PDL": True}
    signature = {name: "*bf16" for name in ("q_ptr", "k_ptr", "v_ptr")}
    signature |= {"hidden_ptr": "*u8", "acc_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32"}
    signature |= dict.fromkeys(
        ("kv_len", "stride_kh", "stride_kl", "stride_vh", "stride_vl"), "i32"
    ) | {"scale": "fp32"}
    signature |= dict.fromkeys(partial, "constexpr")
    source = ASTSource(fn=attention.attention_partial, signature=signature, constexprs=partial)
    assert "griddepcontrol.wait" in triton.compile(source, target=H200, options=PDL).asm["ptx"]
    combine = {"GROUP": 8, "BLOCK_G": 16, "DV": head_dim, "BLOCK_S": 8, "PDL": True}
    signature = {"acc_ptr": "*fp32", "max_ptr": "*fp32", "sum_ptr": "*fp32", "out_ptr": "*bf16"}
    signature |= {"blocks": "i32"} | dict.fromkeys(combine, "constexpr")
    source = ASTSource(fn=attention.attention_combine, signature=signature, constexprs=combine)
    assert "griddepcontrol.wait" in triton.compile(source, target=H200, options=PDL).asm["ptx"]


@pytest.mark.parametrize("writes_kv", [True, False])
@pytest.mark.parametrize(("head_dim", "block_l"), [(256, 32), (512, 64)])
def test_the_normed_attention_kernel_builds_for_sm90(
    head_dim: int, block_l: int, writes_kv: bool
) -> None:
    """The block's keys and values are loaded before the wait (rows earlier steps wrote),
    and only a layer that reads an earlier layer's pools reads again after it, past L1:
    the new row that layer wrote in this step."""
    from benchmarks.decode_residency import build_attention_partial_normed

    ptx = build_attention_partial_normed(head_dim, block_l, writes_kv).asm["ptx"]
    wait = ptx.find("griddepcontrol.wait")
    before, after = ptx[:wait], ptx[wait:]
    assert wait >= 0 and "ld.global" in before
    assert ("ld.global.cg" in after) != writes_kv


def _int4_signature(names: tuple[str, ...], ints: tuple[str, ...]) -> dict[str, str]:
    signature = {name: "*bf16" for name in names}
    signature |= {"wq_ptr": "*i32", "part_ptr": "*fp32", "count_ptr": "*i32"}
    return signature | dict.fromkeys(ints, "i32")


# One scale per word, and per group of words (`GROUP_SCALES`).
@pytest.mark.parametrize("group_scales", [False, True])
@pytest.mark.parametrize(("prologue", "epilogue", "scale"), LAUNCHED)
def test_gemv_int4_variant_builds_for_sm90(
    prologue: int, epilogue: int, scale: bool, group_scales: bool
) -> None:
    from engines.pytorch import triton_int4

    names = (*GEMV_POINTERS[:-1], "ws_ptr", "y_ptr")
    signature = _int4_signature(names, ("N", "K")) | {"eps": "fp32"}
    constants = {
        "PROLOGUE": prologue,
        "SCALE": scale,
        "EPILOGUE": epilogue,
        "PDL": True,
        "GROUP": 32,
        "BLOCK_N": 16,
        "BLOCK_K": 256,
        "GROUP_SCALES": group_scales,
    }
    signature = {name: signature[name] for name in triton_int4.gemv_int4.fn.arg_names[:14]}
    signature |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=triton_int4.gemv_int4.fn, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=H200, options=PDL)
    assert "griddepcontrol.wait" in compiled.asm["ptx"]
    # No int-to-float conversion per nibble (`triton_int4._nibble_floats`); the
    # prologues' few (K as a float) remain.
    assert compiled.asm["ptx"].count("cvt.rn.f32.s32") < 8


# The plain product and its two GELU epilogues, at a split of K and without.
@pytest.mark.parametrize("epilogue", [kernels.NO_EPILOGUE, kernels.GELU_PAIR, kernels.GELU_TIMES])
@pytest.mark.parametrize(("split", "prefetch"), [(1, False), (4, True)])
def test_matmul_int4_builds_for_sm90_on_the_tensor_cores(
    split: int, prefetch: bool, epilogue: int
) -> None:
    from engines.pytorch import triton_int4

    names = ("x_ptr", "ws_ptr", "y_ptr", "m_ptr")
    signature = _int4_signature(names, ("M", "N", "K", "M_BUCKET", "m_row_stride"))
    signature = {name: signature[name] for name in triton_int4.matmul_int4.fn.arg_names[:12]}
    constants = {
        "GROUP": 32,
        "BLOCK_M": 16,
        "BLOCK_N": 64,
        "BLOCK_K": 256,
        "SPLIT_K": split,
        "PREFETCH": prefetch,
        "EPILOGUE": epilogue,
    }
    signature |= dict.fromkeys(constants, "constexpr")
    source = ASTSource(fn=triton_int4.matmul_int4.fn, signature=signature, constexprs=constants)
    compiled = triton.compile(source, target=H200)
    assert "mma" in compiled.asm["ptx"]


def _pinned_matmul_configs(bucket: int | None = None) -> list[str]:
    """The pinned tables' `matmul_int4` labels (at one row bucket: of its keys)."""
    import json

    from engines.pytorch import int4_tuning

    tables = json.loads(int4_tuning.PINNED_PATH.read_text())
    return sorted(
        {
            label
            for gpu in tables.values()
            for key, label in gpu.get("matmul_int4", {}).items()
            if bucket is None or key.startswith(f"{bucket},")
        }
    )


@pytest.mark.parametrize("label", _pinned_matmul_configs())
def test_pinned_int4_configurations_build_for_sm90(label: str) -> None:
    from engines.pytorch import int4_tuning
    from tests.engines.pytorch.triton_builds import build_matmul_int4

    config = int4_tuning.config_from_label(label)
    ptx = build_matmul_int4(config, H200, "bf16").asm["ptx"]
    assert "wgmma" in ptx or "mma.sync" in ptx  # 32-output tiles: mma.sync (wgmma is 64)
    assert ("fma.rn.bf16x2" in ptx) == bool(config.kwargs.get("PAIRS"))


@pytest.mark.parametrize("label", _pinned_matmul_configs(bucket=64))
def test_pinned_64_row_configurations_build_with_the_gate_up_pair(label: str) -> None:
    """Where 64 rows of a gate/up projection run: its gate as the product's epilogue
    (`kernels._gated_matmul`), each tile's gate and up halves split apart in registers."""
    from engines.pytorch import int4_tuning
    from tests.engines.pytorch.triton_builds import build_matmul_int4

    meta = int4_tuning.config_from_label(label)
    config = triton.Config(
        {**meta.kwargs, "EPILOGUE": kernels.GELU_PAIR}, meta.num_warps, meta.num_stages
    )
    ptx = build_matmul_int4(config, H200, "bf16").asm["ptx"]
    assert "wgmma" in ptx or "mma.sync" in ptx


@pytest.mark.parametrize("pair", [True, False])
def test_the_gate_after_a_product_builds_for_sm90(pair: bool) -> None:
    """`gelu_gate_int4`: the GELU gates after `cuda_int4_rows`' product, in bf16."""
    from engines.pytorch import triton_int4

    signature = {"y_ptr": "*bf16", "m_ptr": "*bf16", "out_ptr": "*bf16"}
    signature |= {"N": "i32", "y_row_stride": "i32", "m_row_stride": "i32"}
    constants = {"PAIR": pair, "BLOCK": kernels._GATE_BLOCK}
    signature |= dict.fromkeys(constants, "constexpr")
    fn = triton_int4.gelu_gate_int4
    compiled = triton.compile(ASTSource(fn=fn, signature=signature, constexprs=constants), H200)
    assert "ex2.approx" in compiled.asm["ptx"]  # the gate's exponential
