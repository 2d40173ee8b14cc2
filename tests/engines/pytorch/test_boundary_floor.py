"""`benchmarks/boundary_floor_h200.py`'s launches on a host with no GPU, through Triton's
own launch path to the stand-in H200 driver (`stub_cuda`): each variant launches once a
product of the chain at the chain's grids (or one program), dependent where it says so."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.engines.pytorch import stub_cuda

pytest.importorskip("triton")


@pytest.mark.skipif(stub_cuda.compiler() is None, reason="no C compiler to build the stub driver")
def test_each_variant_launches_once_a_product_at_the_chains_grids(tmp_path: Path) -> None:
    from benchmarks import boundary_floor_h200 as bf
    from benchmarks.stage_chain_h200 import LAYER

    names, launches = stub_cuda.run(__file__, "launcher", tmp_path)
    grids = [-(-n // bf.BLOCK_N) for _ in range(bf.LAYERS) for _name, n, _k in LAYER]
    assert len(names) == 6 and len(launches) == 6 * len(grids)
    for i, name in enumerate(names):
        mine = launches[i * len(grids) : (i + 1) * len(grids)]
        want = [1] * len(grids) if "one program" in name else grids
        assert [launch.grid[0] for launch in mine] == want, name
        assert all(launch.dependent == (", PDL," in name) for launch in mine), name


def _launcher_child() -> list[str]:
    import torch

    from benchmarks import boundary_floor_h200 as bf

    stub_cuda.as_h200()
    table = bf.variants(torch.zeros(1 << 16, dtype=torch.int32), pdl_capable=True)
    for run in table.values():
        run()
    return list(table)


if __name__ == "__main__":
    print(json.dumps(_launcher_child() if sys.argv[1:] == ["launcher"] else []))
