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

from tests.engines.pytorch import interpreter_child

pytest.importorskip("triton")

BLOCK_N, BLOCK_K = 16, 64


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


def test_chain_kernels_build_for_sm90() -> None:
    # What only the compiler checks (the poll's inline asm, the atomics' orderings), on a
    # machine with no GPU, before the benchmark spends device time (as test_triton_sm90_build).
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from benchmarks import stage_chain_h200 as sc

    h200 = GPUTarget("cuda", 90, 32)
    tile = {"BLOCK_N": 8, "BLOCK_K": 2048}
    stage = {"x_ptr": "*bf16", "wq_ptr": "*i32", "ws_ptr": "*bf16", "y_ptr": "*bf16"}
    stage |= {"N": "i32", "K": "i32"} | dict.fromkeys((*tile, "PDL"), "constexpr")
    # Pointers and widths as a launch specializes them (16-byte aligned: torch's
    # allocations are; multiples of 16).
    built = triton.compile(
        ASTSource(
            fn=sc.stage_gemv,
            signature=stage,
            constexprs={**tile, "PDL": True},
            attrs={(i,): [["tt.divisibility", 16]] for i in range(6)},
        ),
        target=h200,
        options={"launch_pdl": True},
    )
    assert "griddepcontrol.wait" in built.asm["ptx"]
    tables = ("starts_ptr", "n_ptr", "k_ptr", "w_at_ptr", "s_at_ptr", "x_at_ptr", "y_at_ptr")
    chained = {"acts_ptr": "*bf16", "wq_ptr": "*i32", "ws_ptr": "*bf16"}
    chained |= {name: "*i32" if i < 3 else "*i64" for i, name in enumerate(tables)}
    chained |= {"done_ptr": "*i32", "ticket_ptr": "*i32", "exits_ptr": "*i32", "tickets": "i32"}
    aligned = {
        (i,): [["tt.divisibility", 16]] for i, kind in enumerate(chained.values()) if "*" in kind
    }
    for persistent in (False, True):
        constants = {"STAGES": 210, "BLOCK_S": 256, **tile, "PERSISTENT": persistent}
        signature = chained | dict.fromkeys(constants, "constexpr")
        source = ASTSource(sc.chained_gemv, signature, constexprs=constants, attrs=aligned)
        ptx = triton.compile(source, target=h200).asm["ptx"]
        # The poll is an acquiring load; the tile counts itself done with a releasing add.
        assert "nanosleep" in ptx and "gpu.acquire.b32" in ptx and "gpu.release.add" in ptx
        # Its stages' parts start aligned (`ALIGN`): its loads vectorize as a launch's do.
        for load in ("ld.global.b16", "ld.global.v4.b32"):
            assert ptx.count(load) == built.asm["ptx"].count(load), load


if __name__ == "__main__":
    print(json.dumps(_child()))
