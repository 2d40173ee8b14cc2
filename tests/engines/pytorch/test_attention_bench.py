"""`benchmarks/attention_h200.py`'s chains on a host with no GPU, through Triton's own
launch path to the stand-in H200 driver (`stub_cuda`): E2B's 35 layers launch the
engine's partial kernel and combine, dependent on the launch before, at the grids the
step uses, within an H200's registers and shared memory; the floor launches the same
grids."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.engines.pytorch import stub_cuda

pytest.importorskip("triton")


@pytest.mark.skipif(stub_cuda.compiler() is None, reason="no C compiler to build the stub driver")
def test_the_chain_launches_each_layers_attention_as_the_step_does(tmp_path: Path) -> None:
    from benchmarks import attention_h200 as bench

    _, launches = stub_cuda.run(__file__, "launcher", tmp_path)
    layers = bench.e2b_layers()
    assert sum(layer.writes_kv for layer in layers) == 15
    assert [layer.head_dim for layer in layers].count(512) == 7
    floor, engine = launches[: 2 * len(layers)], launches[2 * len(layers) :]
    assert len(engine) == 2 * len(layers)
    for i, layer in enumerate(layers):
        partial, combine = engine[2 * i], engine[2 * i + 1]
        assert partial.kernel == "attention_partial_normed" and partial.grid == (1, 32, 1)
        assert combine.kernel == "attention_combine" and combine.grid == (8, 1, 1)
        assert partial.threads == (256 if layer.head_dim == 512 else 128)
        assert partial.dependent and combine.dependent
        assert [f.grid for f in floor[2 * i : 2 * i + 2]] == [partial.grid, combine.grid]


def _launcher_child() -> None:
    import torch

    from benchmarks import attention_h200 as bench
    from engines.pytorch import dependent_launch, triton_attention

    stub_cuda.as_h200()
    dependent_launch.enabled = lambda device: True  # the stub answers as an H200
    layers = bench.e2b_layers()
    bench.floor(layers, torch.device("cpu"))()
    run, _ = bench.chain(triton_attention, layers, bench._inputs(layers, torch.device("cpu")))
    run()


if __name__ == "__main__":
    if sys.argv[1:] == ["launcher"]:
        _launcher_child()
    print(json.dumps([]))
