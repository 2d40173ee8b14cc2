"""`benchmarks/stage_chain_h200.py`'s kernels on the CPU, in Triton's interpreter: a chain
of int4 products run a launch a product and as counter-chained launches (a launch a
layer, one launch for all) gives the same outputs, close to the dequantized reference,
and a second chained launch finds its counters reset. The interpreter runs programs one
at a time in grid order, so it checks the tickets' arithmetic and the counters' protocol,
not their concurrency (the benchmark's own runs on a GPU compare the outputs too).

The interpreter runs in a child process (this file is its script), as in
`test_triton_interpreter`.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.engines.pytorch import interpreter_child, stub_cuda

pytest.importorskip("triton")

BLOCK_N, BLOCK_K = 16, 64
BLOCK_N_H200 = 8  # the benchmark's default tile's


def test_chained_launches_compute_what_separate_launches_do() -> None:
    result = interpreter_child.run(__file__, timeout_s=600)
    assert result["launches_error"] < 2**-7, result
    assert all(result["same"].values()) and len(result["same"]) == 4, result


def _child() -> dict[str, object]:
    import torch

    from benchmarks import stage_chain_h200 as sc
    from engines.pytorch import triton_interpreter

    triton_interpreter.fix()
    chain = sc.build(2, "cpu", torch.bfloat16, sc.DRY_RUN_LAYER)
    start = chain.stages[0][2]
    sc.run_launches(chain, BLOCK_N, BLOCK_K, 4, pdl=False)
    separate = chain.acts.clone()
    same = {}
    for name, group in (("a launch a layer", len(sc.DRY_RUN_LAYER)), ("one launch", 12)):
        chain.acts[start:] = 0
        sc.run_chained(chain, sc.plan(chain, group, BLOCK_N), BLOCK_N, BLOCK_K, 4)
        same[name] = bool(torch.equal(chain.acts, separate))
    for name, programs in (("again", None), ("persistent", 3)):
        launches = sc.plan(chain, 12, BLOCK_N)
        for _ in range(2):  # the second launch must find the counters reset
            chain.acts[start:] = 0
            sc.run_chained(chain, launches, BLOCK_N, BLOCK_K, 4, programs)
            counters = torch.cat([launches[0].done, launches[0].ticket, launches[0].exits])
            same[name] = bool(torch.equal(chain.acts, separate)) and not counters.any()
    # Each product against the dequantized weight times its own input: the error of one
    # stage (a chain's compounds: 12 bf16 outputs, which the interpreter truncates).
    error = (separate[start:].float() - sc.reference(chain, separate)[start:].float()).abs()
    return {
        "launches_error": float(error.max() / separate[start:].float().abs().max()),
        "same": same,
    }


def test_the_benchmarks_dry_run_prints_every_variant(tmp_path: Path) -> None:
    out = tmp_path / "chain.json"
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.stage_chain_h200", "--dry-run", "--out", str(out)],
        env={**os.environ, "TRITON_INTERPRET": "1"},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["variant"]: row for row in json.loads(out.read_text())["rows"]}
    assert list(rows) == [
        "launches",
        "launches, no PDL",
        "engine",
        "chained, a launch a layer",
        "chained, one launch",
        "chained, one launch, persistent",
    ]
    assert rows["chained, one launch"]["same_as_launches"], rows
    assert proc.stdout.count("| chained") == 3


@pytest.mark.skipif(stub_cuda.compiler() is None, reason="no C compiler to build the stub driver")
def test_the_benchmarks_launches_pass_tritons_cuda_launcher(tmp_path: Path) -> None:
    """Before the benchmark spends device time: two layers of E2B's products at the
    default tile, every variant, through Triton's own launch path to a stub H200 driver
    (`stub_cuda`), accepted with no spills; their PTX holds what only the compiler checks
    (the poll's inline asm, the atomics' orderings), and the chained kernel's loads
    vectorize as a launch's do (its stages' parts start aligned: `ALIGN`)."""
    from benchmarks.stage_chain_h200 import LAYER

    ptx, launches = stub_cuda.run(__file__, "launcher", tmp_path)
    stages = 2 * len(LAYER)
    kinds = [launch.kernel for launch in launches]
    assert kinds == ["stage_gemv"] * stages + ["chained_gemv"] * 4, kinds
    for launch in launches:
        assert launch.local_bytes == 0 and launch.dependent == (launch.kernel == "stage_gemv")
    tickets = sum(-(-n // BLOCK_N_H200) for _name, n, _k in LAYER)
    grids = [launch.grid[0] for launch in launches[stages:]]
    assert grids == [tickets, tickets, 2 * tickets, min(4 * 132, 2 * tickets)], grids
    assert "griddepcontrol.wait" in ptx["stage_gemv"]
    for chained in (ptx["chained_gemv"], ptx["chained_gemv persistent"]):
        # The poll is an acquiring load; the tile counts itself done with a releasing add.
        assert "nanosleep" in chained and "gpu.acquire.b32" in chained
        assert "gpu.release.add" in chained
        for load in ("ld.global.b16", "ld.global.v4.b32"):
            assert chained.count(load) == ptx["stage_gemv"].count(load), load


def _launcher_child() -> dict[str, str]:
    import torch

    from benchmarks import stage_chain_h200 as sc
    from benchmarks.stage_chain_h200 import LAYER

    stub_cuda.as_h200()
    chain = sc.build(2, "cpu", torch.bfloat16)
    tile = (BLOCK_N_H200, 2048, 4)
    sc.run_launches(chain, *tile, pdl=True)
    ptx = {"stage_gemv": stub_cuda.builds_ptx(sc.stage_gemv)[-1]}
    sc.run_chained(chain, sc.plan(chain, len(LAYER), BLOCK_N_H200), *tile)
    sc.run_chained(chain, sc.plan(chain, 2 * len(LAYER), BLOCK_N_H200), *tile)
    ptx["chained_gemv"] = stub_cuda.builds_ptx(sc.chained_gemv)[-1]
    sc.run_chained(chain, sc.plan(chain, 2 * len(LAYER), BLOCK_N_H200), *tile, programs=4 * 132)
    ptx["chained_gemv persistent"] = stub_cuda.builds_ptx(sc.chained_gemv)[-1]
    return ptx


if __name__ == "__main__":
    print(json.dumps(_launcher_child() if sys.argv[1:] == ["launcher"] else _child()))
