"""The int4 kernels' variants agree bit for bit on the GPU: values made two at a time in
16-bit halves (`triton_int4._dequantized_pairs`, inline PTX the CPU interpreter cannot
run) against the float32 way, in `matmul_int4` and `dequantize_int4`; the next chunk's
loads issued early (`PREFETCH`) against the plain loop, in both products; scales read two
to a 32-bit word (`SCALE_WORDS`) against one by one. The one-row
kernel's compiled form (its nibbles unpacked by one inline LOP3) and 64-row tiles with
the rows on the tensor cores' long side (`ROWS_FIRST`) match dequantize-then-matmul, and
the dense weight that prefill multiplies equals the CPU's `int4.dequantize`."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch import int4, kernels

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.fixture(params=[torch.bfloat16, torch.float16], ids=str)
def weight(request: pytest.FixtureRequest) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    w = torch.randn(384, 1024, device="cuda", generator=gen, dtype=request.param) / 32
    return int4.quantize(w, 32)


def test_dequantize_kernel_equals_the_cpu_form(weight: tuple[torch.Tensor, torch.Tensor]) -> None:
    packed, scale = weight
    want = int4.dequantize(packed.cpu(), scale.cpu(), scale.dtype)
    for pairs in (False, True):
        got = kernels._launch_dequantize_int4(packed, scale, scale.dtype, pairs=pairs)
        assert torch.equal(got.cpu(), want), pairs
    assert torch.equal(kernels.dense(weight, scale.dtype).cpu(), want)


def test_a_layer_block_gives_each_module_its_own_products() -> None:
    """Int4 modules of one layer gathered into a block (`int4_blocks`): a prefill's rows
    multiply the block's one dequantized copy and get what each module's own weight
    gives, and a few rows still take `matmul_int4` on the module's view."""
    from torch import nn

    from engines.pytorch import int4_blocks

    gen = torch.Generator(device="cuda").manual_seed(1)
    shapes = {"q": (384, 1024), "o": (1024, 384), "down": (256, 2048)}
    weights = {
        name: int4.quantize(torch.randn(*shape, device="cuda", generator=gen) / 32, 32)
        for name, shape in shapes.items()
    }
    layer = nn.ModuleDict(
        {
            name: int4.Int4Linear(p.clone(), s.to(torch.bfloat16), None)
            for name, (p, s) in weights.items()
        }
    )
    model = nn.ModuleDict({"layers": nn.ModuleList([layer])})
    alone = {
        name: int4.Int4Linear(p, s.to(torch.bfloat16), None) for name, (p, s) in weights.items()
    }
    assert int4_blocks.gather(model) == 1
    for rows in (8, 300):
        for name, module in layer.items():
            x = torch.randn(rows, module.in_features, device="cuda", generator=gen)
            x = x.to(torch.bfloat16)
            assert torch.equal(module(x), alone[name](x)), (name, rows)


def test_pairs_make_the_same_products(weight: tuple[torch.Tensor, torch.Tensor]) -> None:
    from engines.pytorch import int4_tuning, triton_int4

    packed, scale = weight
    tuner = triton_int4.matmul_int4
    saved = tuner.configs, dict(tuner.cache)
    try:
        for rows in (3, 64):
            x = torch.randn(rows, packed.shape[1] * 8, device="cuda", dtype=scale.dtype)
            outputs = []
            for pairs in (False, True):
                config = int4_tuning.config_from_label(
                    f"block_m=16,block_n=64,block_k=128,split_k=1,pairs={int(pairs)},w=4,s=3"
                )
                tuner.configs, tuner.cache = [config], {}
                outputs.append(kernels._launch_matmul_int4(x, packed, scale))
            assert torch.equal(outputs[0], outputs[1]), rows
    finally:
        tuner.configs, tuner.cache = saved[0], saved[1]


def _with_config(tuner: object, label: str, launch: object) -> torch.Tensor:
    from engines.pytorch import int4_tuning

    saved = tuner.configs, dict(tuner.cache)  # type: ignore[attr-defined]
    try:
        tuner.configs, tuner.cache = [int4_tuning.config_from_label(label)], {}  # type: ignore[attr-defined]
        return launch()  # type: ignore[operator]
    finally:
        tuner.configs, tuner.cache = saved  # type: ignore[attr-defined]


def _assert_same_products(weight: tuple[torch.Tensor, torch.Tensor], labels: list[str]) -> None:
    """`matmul_int4` at each configuration label gives the same bits, at 3 and 64 rows."""
    from engines.pytorch import triton_int4

    packed, scale = weight
    for rows in (3, 64):
        x = torch.randn(rows, packed.shape[1] * 8, device="cuda", dtype=scale.dtype)
        outputs = [
            _with_config(
                triton_int4.matmul_int4,
                label,
                lambda x=x: kernels._launch_matmul_int4(x, packed, scale),
            )
            for label in labels
        ]
        assert all(torch.equal(outputs[0], out) for out in outputs[1:]), rows


@pytest.mark.parametrize("tile", ["block_k=64,split_k=4", "block_k=128,split_k=1,rows_first=1"])
def test_scales_read_as_words_make_the_same_products(
    weight: tuple[torch.Tensor, torch.Tensor], tile: str
) -> None:
    _assert_same_products(
        weight,
        [f"block_m=64,block_n=64,{tile},pairs=1,scale_words={w},w=4,s=3" for w in (0, 1)],
    )


@pytest.mark.parametrize("split", [1, 4])
def test_prefetch_makes_the_same_products(
    weight: tuple[torch.Tensor, torch.Tensor], split: int
) -> None:
    _assert_same_products(
        weight,
        [
            f"block_m=16,block_n=64,block_k=128,split_k={split},pairs=1,prefetch={p},w=4,s=1"
            for p in (0, 1)
        ],
    )


def _error(got: torch.Tensor, x: torch.Tensor, weight: tuple[torch.Tensor, torch.Tensor]) -> float:
    """The largest difference from dequantize-then-matmul, relative to its largest value."""
    want = x.float() @ int4.dequantize(*weight, torch.float32).T
    return float((got.float() - want).abs().max() / want.abs().max())


@pytest.mark.parametrize("prefetch", [0, 1])
def test_the_one_row_kernel_matches_dequantize_then_matmul(
    weight: tuple[torch.Tensor, torch.Tensor], prefetch: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engines.pytorch import cuda_int4, triton_int4

    # `gemv_int4` itself, where `cuda_int4`'s product would take the row.
    monkeypatch.setattr(cuda_int4, "product_for", lambda *args, **kwargs: None)
    x = torch.randn(1, weight[0].shape[1] * 8, device="cuda", dtype=weight[1].dtype)
    for tile in ("block_n=4,block_k=256,group_scales=0", "block_n=16,block_k=512,group_scales=1"):
        got = _with_config(
            triton_int4.gemv_int4,
            f"{tile},prefetch={prefetch},w=4,s=2",
            lambda: kernels.linear(x, weight, True),
        )
        assert _error(got, x, weight) < 1e-2, tile


@pytest.mark.parametrize("split", [1, 2])
def test_rows_first_tiles_match_dequantize_then_matmul(
    weight: tuple[torch.Tensor, torch.Tensor], split: int
) -> None:
    from engines.pytorch import triton_int4

    x = torch.randn(64, weight[0].shape[1] * 8, device="cuda", dtype=weight[1].dtype)
    for rows_first in (0, 1):
        got = _with_config(
            triton_int4.matmul_int4,
            f"block_m=64,block_n=64,block_k=128,split_k={split},pairs=1,rows_first={rows_first},"
            "w=4,s=3",
            lambda: kernels._launch_matmul_int4(x, *weight),
        )
        assert _error(got, x, weight) < 1e-2, rows_first


@pytest.mark.parametrize(
    "tile",
    ["block_k=128,split_k=1", "block_k=64,split_k=4", "block_k=128,split_k=1,rows_first=1"],
)
def test_the_gelu_epilogues_gate_the_same_products(
    weight: tuple[torch.Tensor, torch.Tensor], tile: str
) -> None:
    """`matmul_int4` with a GELU gate as its epilogue against its plain product gated by
    F.gelu: gelu_tanh(gate) * up of a gate/up pair (each tile holds gate rows and the up
    rows of the same outputs), and gelu_tanh(.) times a strided slice (as the per-layer
    inputs are); and both gates launched after the plain product (`gelu_gate_int4`, as
    they follow `cuda_int4_rows`' product). The same sums, so the same bits but where
    the two GELU forms round a value to neighbouring 16-bit floats: on a few values, a
    gate an ulp apart, which the multiply after it carries into up to two ulps of the
    output."""
    from engines.pytorch import triton_int4

    packed, scale = weight
    label = f"block_m=64,block_n=64,{tile},pairs=1,w=4,s=3"
    ulp = 2.0**-7 if scale.dtype == torch.bfloat16 else 2.0**-10
    gelu = torch.nn.functional.gelu
    for rows in (3, 17, 64):
        x = torch.randn(rows, packed.shape[1] * 8, device="cuda", dtype=scale.dtype)
        times = torch.randn(rows, 3, packed.shape[0], device="cuda", dtype=scale.dtype)[:, 1]

        def product(
            epilogue: int, multiplier: torch.Tensor | None = None, x: torch.Tensor = x
        ) -> torch.Tensor:
            return _with_config(
                triton_int4.matmul_int4,
                label,
                lambda: kernels._launch_matmul_int4(x, packed, scale, epilogue, multiplier),
            )

        plain = product(kernels.NO_EPILOGUE)
        gate, up = plain.chunk(2, dim=-1)
        checks = {
            "pair": (product(kernels.GELU_PAIR), gelu(gate, approximate="tanh") * up),
            "times": (product(kernels.GELU_TIMES, times), gelu(plain, approximate="tanh") * times),
        }
        # The same gates after the plain product, as they follow `cuda_int4_rows`' product
        checks["pair after"] = (
            kernels._launch_gelu_gate_int4(plain, kernels.GELU_PAIR, None),
            checks["pair"][1],
        )
        checks["times after"] = (
            kernels._launch_gelu_gate_int4(plain, kernels.GELU_TIMES, times),
            checks["times"][1],
        )
        for name, (got, want) in checks.items():
            assert got.shape == want.shape, (name, rows)
            apart = (got.float() - want.float()).abs()
            within = bool((apart <= 2 * ulp * want.float().abs() + 1e-6).all())
            assert within, (name, rows, float(apart.max()))
            assert float((apart > 0).float().mean()) < 0.01, (name, rows)
