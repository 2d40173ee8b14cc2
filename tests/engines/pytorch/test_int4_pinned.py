"""The int4 kernels' pinned configurations (`int4_tuning.PINNED_PATH`): the labels the
sweep writes read back as the same configurations, a pinned GPU gets its one
configuration per shape (other GPUs and shapes the autotuner's list), the sweep's `pin`
writes what the engine reads, and the constants of the values-in-pairs PTX give exactly
(u - 8) * scale rounded once, checked here in torch on the CPU."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

triton = pytest.importorskip("triton")

from engines.pytorch import int4_tuning, kernels, triton_int4  # noqa: E402

LISTS = [*int4_tuning.GEMV_INT4_CONFIGS, *int4_tuning.MATMUL_INT4_CONFIGS]


@pytest.mark.parametrize("config", LISTS, ids=int4_tuning.config_label)
def test_labels_read_back_as_the_same_configuration(config: Any) -> None:
    again = int4_tuning.config_from_label(int4_tuning.config_label(config))
    named = {
        key: value
        for key, value in config.kwargs.items()
        if key not in int4_tuning.OFF_UNLESS_NAMED or value
    }
    assert again.kwargs == named
    assert (again.num_warps, again.num_stages) == (config.num_warps, config.num_stages)
    assert int4_tuning.config_label(again) == int4_tuning.config_label(config)


def test_a_configuration_has_one_label() -> None:
    plain = "block_m=16,block_n=64,block_k=128,split_k=4,pairs=1,w=4,s=1"
    spelled = "block_m=16,block_n=64,block_k=128,split_k=4,pairs=1,prefetch=0,rows_first=0,w=4,s=1"
    assert int4_tuning.config_label(int4_tuning.config_from_label(spelled)) == plain


def test_the_shipped_table_parses_and_keys_every_shape_once() -> None:
    tables = json.loads(int4_tuning.PINNED_PATH.read_text())
    for kernels_of_gpu in tables.values():
        assert set(kernels_of_gpu) <= {"gemv_int4", "matmul_int4"}
        for entries in kernels_of_gpu.values():
            for key, label in entries.items():
                assert len(key.split(",")) in (4, 5) and all(p.isdigit() for p in key.split(","))
                int4_tuning.config_from_label(label)
    int4_tuning.use_pinned_tables(None)


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("{not json", "not readable JSON"),
        ('{"GPU": {"gemv": {}}}', "expected tables for"),
        ('{"GPU": {"gemv_int4": {"1,2,0,0,32": "block_n=x,w=2,s=2"}}}', "'1,2,0,0,32'"),
        ('{"GPU": {"gemv_int4": {"1,2,0,0,32": "block_n=4,block_k=256,w=2"}}}', "KeyError"),
        (
            '{"GPU": {"matmul_int4": {"16,2,8,32": '
            '"block_n=4,block_k=256,group_scales=1,w=2,s=2"}}}',
            "matmul_int4 takes",
        ),
    ],
)
def test_a_bad_pinned_table_is_one_line_naming_the_entry(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str, names: str
) -> None:
    bad = tmp_path / "int4_configs.json"
    bad.write_text(text)
    monkeypatch.setattr(int4_tuning, "PINNED_PATH", bad)
    try:
        with pytest.raises(int4_tuning.PinnedTableError) as caught:
            int4_tuning.use_pinned_tables(None)
    finally:
        int4_tuning.pinned_tables.cache_clear()
    message = str(caught.value)
    assert "\n" not in message and message.startswith("int4_configs.json: ") and names in message


def test_a_chosen_table_pins_instead_of_the_shipped_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    label = "block_n=2,block_k=256,group_scales=0,w=2,s=2"
    chosen = tmp_path / "my-gpu.json"
    chosen.write_text(json.dumps({"GPU Y": {"gemv_int4": {"256,1536,0,0,32": label}}}))
    monkeypatch.setattr(int4_tuning, "gpu_name", lambda: "GPU Y")
    forms = {"PROLOGUE": 0, "EPILOGUE": 0, "GROUP": 32}
    configs, shape = int4_tuning.GEMV_INT4_CONFIGS, {"N": 256, "K": 1536}
    try:
        int4_tuning.use_pinned_tables(chosen)
        (pinned,) = int4_tuning.prune_gemv(configs, shape, **forms)
        assert int4_tuning.config_label(pinned) == label
        # The file named in the one line when it cannot be read.
        with pytest.raises(int4_tuning.PinnedTableError, match=f"^{tmp_path}/gone.json: cannot"):
            int4_tuning.use_pinned_tables(tmp_path / "gone.json")
    finally:
        int4_tuning.use_pinned_tables(None)
    # Back to the shipped table, which names no "GPU Y".
    assert int4_tuning.prune_gemv(configs, shape, **forms) == configs


def test_a_pinned_gpu_gets_one_configuration_and_others_the_list(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = next(iter(json.loads(int4_tuning.PINNED_PATH.read_text())))
    table = json.loads(int4_tuning.PINNED_PATH.read_text())[gpu]
    key, label = next(iter(table["matmul_int4"].items()))
    bucket, n, k, group = (int(p) for p in key.split(","))
    named = {"M": bucket, "M_BUCKET": bucket, "N": n, "K": k}
    configs = int4_tuning.MATMUL_INT4_CONFIGS
    monkeypatch.setattr(int4_tuning, "gpu_name", lambda: gpu)
    (pinned,) = int4_tuning.prune_matmul(configs, named, GROUP=group)
    assert int4_tuning.config_label(pinned) == label
    gemv_key, gemv_label = next(iter(table["gemv_int4"].items()))
    n, k, prologue, epilogue, group = (int(p) for p in gemv_key.split(","))
    forms = {"PROLOGUE": prologue, "EPILOGUE": epilogue, "GROUP": group}
    (pinned,) = int4_tuning.prune_gemv(int4_tuning.GEMV_INT4_CONFIGS, {"N": n, "K": k}, **forms)
    assert int4_tuning.config_label(pinned) == gemv_label
    # A shape no table holds, and a GPU no table names: the list, pruned as before.
    unknown = named | {"N": n + 8}
    assert int4_tuning.prune_matmul(configs, unknown, GROUP=group) == (
        int4_tuning.prune_splits(configs, unknown)
    )
    monkeypatch.setattr(int4_tuning, "gpu_name", lambda: "a GPU with no table")
    assert int4_tuning.prune_matmul(configs, named, GROUP=group) == (
        int4_tuning.prune_splits(configs, named)
    )
    assert int4_tuning.prune_gemv(
        int4_tuning.GEMV_INT4_CONFIGS, {"N": n, "K": k}, **forms
    ) == int4_tuning.GEMV_INT4_CONFIGS


def test_a_gpu_with_the_same_sm_pins_from_its_twins_table_unless_it_has_its_own(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    (gpu, twin), *_ = int4_tuning.SAME_TILES_AS.items()
    table = json.loads(int4_tuning.PINNED_PATH.read_text())
    assert int4_tuning.pinned_source(gpu) == twin
    assert int4_tuning.pinned_source("a GPU with no table") is None
    key, label = next(iter(table[twin]["gemv_int4"].items()))
    n, k, prologue, epilogue, group = (int(p) for p in key.split(","))
    forms = {"PROLOGUE": prologue, "EPILOGUE": epilogue, "GROUP": group}
    configs = int4_tuning.GEMV_INT4_CONFIGS
    monkeypatch.setattr(int4_tuning, "gpu_name", lambda: gpu)
    int4_tuning.pinned_config.cache_clear()
    (pinned,) = int4_tuning.prune_gemv(configs, {"N": n, "K": k}, **forms)
    assert int4_tuning.config_label(pinned) == label
    # A table of its own (a sweep on that GPU) wins, also where it lacks the shape.
    own = "block_n=4,block_k=256,group_scales=0,w=4,s=1"
    chosen = tmp_path / "own.json"
    chosen.write_text(json.dumps(table | {gpu: {"gemv_int4": {key: own}}}))
    try:
        int4_tuning.use_pinned_tables(chosen)
        (pinned,) = int4_tuning.prune_gemv(configs, {"N": n, "K": k}, **forms)
        assert int4_tuning.config_label(pinned) == own
        assert int4_tuning.pinned_source(gpu) == gpu
        assert int4_tuning.prune_gemv(configs, {"N": n + 8, "K": k}, **forms) == configs
    finally:
        int4_tuning.use_pinned_tables(None)


def test_the_sweeps_pin_writes_what_the_engine_reads(tmp_path: Path) -> None:
    from benchmarks import int4_gemv_sweep as sweep

    table = tmp_path / "pinned.json"
    table.write_text(json.dumps({"another GPU": {"gemv_int4": {"1,2,0,0,32": "kept"}}}))
    fast, slow = "block_n=4,block_k=2048,group_scales=1,w=8,s=2", "block_n=1,block_k=512,w=2,s=2"
    pair = SimpleNamespace(
        rows=1, n=512, n_out=256, k=1536, prologue=kernels.RMS_NORM_AFTER,
        epilogue=kernels.GELU_PAIR,
        results={fast: {"us": 1.0, "config": fast}, slow: {"us": 2.0, "config": slow},
                 "broken": {"error": "x"}},
    )  # fmt: skip
    few = SimpleNamespace(
        rows=8, n=1536, n_out=1536, k=6144,
        results={"label": {"us": 3.0, "config": "block_m=16,block_n=64,block_k=128,"
                           "split_k=8,pairs=1,w=4,s=3"}},
    )  # fmt: skip
    assert sweep.pin(str(table), "GPU X", [pair, few]) == 2  # type: ignore[list-item]
    written = json.loads(table.read_text())
    assert written["another GPU"] == {"gemv_int4": {"1,2,0,0,32": "kept"}}
    gemv_key = int4_tuning.gemv_key(256, 1536, kernels.RMS_NORM_AFTER, kernels.GELU_PAIR, 32)
    assert written["GPU X"]["gemv_int4"] == {gemv_key: fast}
    matmul_key = int4_tuning.matmul_key(16, 1536, 6144, 32)
    assert int4_tuning.config_from_label(written["GPU X"]["matmul_int4"][matmul_key]).kwargs[
        "PAIRS"
    ]


def test_the_sweeps_long_chunks_reach_the_whole_row_and_no_further() -> None:
    """At one row a chunk may cover the whole row (one masked chunk of the next power of
    two), never two rows' worth, within 64 words a thread; the sweep's fit agrees."""
    from benchmarks import int4_gemv_sweep as sweep

    down = SimpleNamespace(k=12288, paired=False, rows=1, n_out=1536)
    chunks = sweep.long_chunks(down)  # type: ignore[arg-type]
    assert {c.kwargs["BLOCK_K"] for c in chunks} == {2048, 4096, 8192, 16384}
    for c in chunks:
        words = c.kwargs["BLOCK_N"] * c.kwargs["BLOCK_K"] / 8 / (32 * c.num_warps)
        assert words <= 64 and (words > 16 or c.kwargs["BLOCK_K"] > down.k)
        assert sweep.Shape.fits(down, c)  # type: ignore[arg-type]
    qkv = SimpleNamespace(k=1536, paired=False)
    assert max(c.kwargs["BLOCK_K"] for c in sweep.long_chunks(qkv)) == 2048  # type: ignore[arg-type]
    # The pairs stream a gate and an up row a row: half the outputs a tile.
    pair = SimpleNamespace(k=1536, paired=True)
    assert all(
        c.kwargs["BLOCK_N"] * 2 * c.kwargs["BLOCK_K"] / 8 / (32 * c.num_warps) <= 64
        for c in sweep.long_chunks(pair)  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_pair_constants_give_q_times_scale_rounded_once(dtype: torch.dtype) -> None:
    base, one, minus, _fma = triton_int4.PAIR_FORMS[str(dtype).removeprefix("torch.")]

    def half(word: int) -> torch.Tensor:  # the low 16 bits of a pair, as `dtype`
        return torch.tensor([word & 0xFFFF], dtype=torch.int32).to(torch.uint16).view(dtype).float()

    # Each fma.x2 is exact in float32 here and rounded once to `dtype`, as PTX's is.
    u = torch.arange(16)
    values = torch.cat([half((base & 0xFFFF) | int(i)) for i in u])
    centred = (values * half(one) + half(minus)).to(dtype)
    assert torch.equal(centred.float(), (u - 8).float())
    gen = torch.Generator().manual_seed(0)
    scales = (torch.randn(64, generator=gen) * 0.05).to(dtype)
    got = (centred.float()[None, :] * scales.float()[:, None] + -0.0).to(dtype)
    want = ((u - 8).float()[None, :] * scales.float()[:, None]).to(dtype)
    assert torch.equal(got.view(torch.int16), want.view(torch.int16))  # signs of zero too


def test_the_sweeps_dry_run_pins_every_shape_at_one_and_eight_rows(tmp_path: Path) -> None:
    import os
    import subprocess
    import sys

    table = tmp_path / "pinned.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    args = ["--dry-run", "--rows", "1,8", "--budget-s", "300", "--table", str(table)]
    proc = subprocess.run(
        [sys.executable, "-m", "benchmarks.int4_gemv_sweep", *args],
        env=env, capture_output=True, text=True, timeout=600, check=False,
        cwd=Path(__file__).resolve().parents[3],
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-2000:]
    (entries,) = json.loads(table.read_text()).values()
    assert len(entries["gemv_int4"]) == 3 and len(entries["matmul_int4"]) == 3


def test_the_split_workspace_has_room_for_the_largest_split_a_shape_may_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`kernels._split_partials` is sized by `largest_split`: the pinned configuration's
    split, else the largest the list offers; none for a shape whose tiles fill the SMs."""
    configs = int4_tuning.MATMUL_INT4_CONFIGS
    table = json.loads(int4_tuning.PINNED_PATH.read_text())
    gpu = next(iter(table))
    monkeypatch.setattr(int4_tuning, "gpu_name", lambda: gpu)
    for key, label in table[gpu]["matmul_int4"].items():
        bucket, n, k, group = (int(p) for p in key.split(","))
        split = int4_tuning.config_from_label(label).kwargs["SPLIT_K"]
        assert int4_tuning.largest_split(configs, bucket, n, k, group) == split, key
    monkeypatch.setattr(int4_tuning, "gpu_name", lambda: "a GPU with no table")
    int4_tuning.use_pinned_tables(None)  # forgets the answers, as a new table does
    most = max(c.kwargs["SPLIT_K"] for c in configs)
    assert int4_tuning.largest_split(configs, 16, 256, 1536, 32) == most
    assert int4_tuning.largest_split(configs, 64, 262144, 1536, 32) == 1
    (one,) = [c for c in configs if c.kwargs["SPLIT_K"] == 4][:1]
    assert int4_tuning.largest_split([one], 64, 262144, 1536, 32) == 4


def test_the_sweep_offers_splits_that_fill_whole_waves_of_the_sms() -> None:
    from benchmarks.int4_gemv_sweep import filling_splits

    def tile(bm: int, bn: int) -> triton.Config:
        return triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": 128, "SPLIT_K": 1})

    # down at 64 rows, 64 x 64 tiles: 24 tiles, so 5 (120 programs), 11 (264), 16 (384);
    # 22 would pass 16.
    assert filling_splits(64, 1536, tile(64, 64)) == [5, 11, 16]
    # q/k/v at 8 rows, 16 x 32 tiles: 80, so 3 and 6 (4 is the splits phase's).
    assert filling_splits(8, 2560, tile(16, 32)) == [3, 6]
    # Tiles that fill the SMs alone: no split.
    assert filling_splits(64, 262144, tile(64, 128)) == []
