"""Which configuration each int4 kernel of `triton_int4` runs: the autotuner's lists,
the pinned tables, and the prunes that pick between them.

The configuration lists are `benchmarks/int4_gemv_sweep.py`'s suggestions at 1 row (records:
`benchmarks/records/2026-12-03-h200-int4-long-chunks.md`) and at 8 and 64 rows
(`2026-12-02-h200-int4-scale-words.md`): short, since the
autotuner times every entry at each new shape while the server captures its graphs
(`prune_splits` drops row tiles past a bucket's rows, so 2-16 rows see only the 16-row
tiles). On a GPU model the pinned tables name (`PINNED_PATH`, or the table the server's
`--int4-configs` names: `use_pinned_tables`), a shape they hold gets only its pinned
configuration.
"""

import functools
import json
from pathlib import Path

import triton

from contract.errors import BenchError
from engines.pytorch.gemv_forms import RESIDUAL_AFTER

# Splits are worth offering while the output tiles alone would leave SMs idle (an H200
# has 132; two programs an SM hide more latency).
SPLIT_BELOW_PROGRAMS = 264


# Per GPU model, the configuration `benchmarks/int4_gemv_sweep.py` measured best for each
# of E2B's shapes (`--table`): the autotuner then times that one configuration instead of
# the list, so a server starts sooner and every machine of that model makes the same
# choice, hence the same sums (the autotuner's own pick varies with timing noise). Other
# GPUs and shapes fall back to the list.
PINNED_PATH = Path(__file__).with_name("int4_configs.json")
# The table `use_pinned_tables` chose (the server's --int4-configs); None: PINNED_PATH.
_chosen_table: Path | None = None
_FLAGS = ("GROUP_SCALES", "PAIRS", "PREFETCH", "ROWS_FIRST", "SCALE_WORDS")
# Flags off unless named (the kernels' defaults): a label leaves them out when off.
OFF_UNLESS_NAMED = ("PAIRS", "PREFETCH", "ROWS_FIRST", "SCALE_WORDS")


def config_label(config: triton.Config) -> str:
    """`block_n=16,block_k=512,group_scales=1,w=2,s=2`: a configuration as the sweep's
    records and the pinned tables write it, one label a configuration (an off flag that
    is off by default is left out, so the sweep never times one configuration twice)."""
    meta = {k: v for k, v in config.kwargs.items() if k not in OFF_UNLESS_NAMED or v}
    parts = [f"{k.lower()}={int(v) if isinstance(v, bool) else v}" for k, v in meta.items()]
    return ",".join(parts) + f",w={config.num_warps},s={config.num_stages}"


def config_from_label(label: str) -> triton.Config:
    fields = dict(part.split("=") for part in label.split(","))
    warps, stages = int(fields.pop("w")), int(fields.pop("s"))
    meta = {
        key.upper(): bool(int(value)) if key.upper() in _FLAGS else int(value)
        for key, value in fields.items()
    }
    return triton.Config(meta, num_warps=warps, num_stages=stages)


class PinnedTableError(BenchError, ValueError):
    """The pinned table cannot be read (`PINNED_PATH`, or the one `use_pinned_tables`
    chose)."""


# Per kernel: the meta-parameters a pinned configuration must name, and may.
_KERNELS = {
    "gemv_int4": ({"BLOCK_N", "BLOCK_K", "GROUP_SCALES"}, {"PREFETCH"}),
    "matmul_int4": (
        {"BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"},
        {"PAIRS", "PREFETCH", "ROWS_FIRST", "SCALE_WORDS"},
    ),
}


def _check_label(kernel: str, label: str) -> None:
    names = set(config_from_label(label).kwargs)
    required, optional = _KERNELS[kernel]
    if not required <= names <= required | optional:
        raise ValueError(f"names {sorted(names)}; {kernel} takes {sorted(required | optional)}")


@functools.cache
def pinned_tables() -> dict:
    """The pinned tables, every label read back once (`PinnedTableError` names the
    first bad entry): checked when an int4 model loads, not at its first launch."""
    path = PINNED_PATH if _chosen_table is None else _chosen_table
    if _chosen_table is None and not path.exists():
        return {}
    where = path.name if _chosen_table is None else str(path)
    try:
        tables = json.loads(path.read_text())
    except OSError as exc:
        raise PinnedTableError(f"{where}: cannot be read ({exc.strerror})") from None
    except ValueError as exc:
        raise PinnedTableError(f"{where}: not readable JSON ({exc})") from None
    if not isinstance(tables, dict):
        raise PinnedTableError(f"{where}: expected an object of GPU names")
    for gpu, kernels in tables.items():
        if not isinstance(kernels, dict) or not set(kernels) <= set(_KERNELS):
            raise PinnedTableError(f"{where}: {gpu!r}: expected tables for {sorted(_KERNELS)}")
        for kernel, table in kernels.items():
            for key, label in (table.items() if isinstance(table, dict) else [("", table)]):
                try:
                    _check_label(kernel, label)
                except (AttributeError, TypeError, ValueError, KeyError) as exc:
                    raise PinnedTableError(
                        f"{where}: {gpu!r} {kernel} {key!r}: bad configuration {label!r} "
                        f"({type(exc).__name__}: {exc})"
                    ) from None
    return tables


def use_pinned_tables(path: Path | None) -> None:
    """Pins from `path` (a table `benchmarks/int4_gemv_sweep.py --table` wrote: a new
    GPU model's, or another tuning compared in one run) instead of the shipped one;
    None: the shipped one. Set before the first int4 launch; read and checked now."""
    global _chosen_table
    _chosen_table = path
    pinned_tables.cache_clear()
    pinned_config.cache_clear()
    _largest_splits.clear()
    pinned_tables()


# A GPU with no table of its own pins from a GPU with the same SM where that was measured
# to beat the autotuner (`benchmarks/records/2026-12-05-h100-strided-inputs.md`: the
# H200's tiles on an H100, a 1.550 ms step against 1.658 autotuned).
SAME_TILES_AS = {"NVIDIA H100 80GB HBM3": "NVIDIA H200"}


def pinned_source(gpu: str) -> str | None:
    """The GPU whose pinned table `gpu` runs: its own, else its twin's (`SAME_TILES_AS`);
    None where neither is in the table (the autotuner chooses)."""
    tables = pinned_tables()
    if gpu in tables:
        return gpu
    twin = SAME_TILES_AS.get(gpu)
    return twin if twin in tables else None


@functools.cache
def pinned_config(gpu: str, kernel: str, key: str):
    source = pinned_source(gpu)
    label = None if source is None else pinned_tables()[source].get(kernel, {}).get(key)
    return None if label is None else config_from_label(label)


def gpu_name() -> str:
    import torch

    return torch.cuda.get_device_name()


def gemv_key(n: int, k: int, prologue: int, epilogue: int, group: int) -> str:
    """A pinned table's key for `gemv_int4` (outputs, inputs, prologue, epilogue, group):
    a prologue changes what each program computes before and while it streams."""
    return f"{n},{k},{prologue},{epilogue},{group}"


def matmul_key(bucket: int, n: int, k: int, group: int) -> str:
    """A pinned table's key for `matmul_int4` (row bucket, outputs, inputs, group)."""
    return f"{bucket},{n},{k},{group}"


def prune_gemv(configs: list, named_args: dict, **kwargs: object) -> list:
    forms = ("PROLOGUE", "EPILOGUE", "GROUP")
    prologue, epilogue, group = (int(kwargs[name]) for name in forms)  # type: ignore[call-overload]
    # The residual step after the product (epilogue 3) is one program's work once the
    # others are done: the product's own pinned shape stands for it.
    if epilogue == RESIDUAL_AFTER:
        epilogue = 0
    key = gemv_key(named_args["N"], named_args["K"], prologue, epilogue, group)
    pinned = pinned_config(gpu_name(), "gemv_int4", key)
    return configs if pinned is None else [pinned]


def prune_matmul(configs: list, named_args: dict, **kwargs: object) -> list:
    group = int(kwargs["GROUP"])  # type: ignore[call-overload]
    key = matmul_key(named_args["M_BUCKET"], named_args["N"], named_args["K"], group)
    pinned = pinned_config(gpu_name(), "matmul_int4", key)
    if pinned is not None:
        return [pinned]
    return prune_splits(prune_scale_words(configs, named_args["K"], group), named_args)


def largest_split(configs: list, bucket: int, n: int, k: int, group: int) -> int:
    """The largest SPLIT_K `matmul_int4` may run at this shape out of `configs` (the
    autotuner's list): its pinned configuration's, else the largest `prune_matmul` offers
    any rows of the bucket (one row offers the most: the fewest tiles); a list of one is
    run unpruned, as the autotuner runs it. The partial sums' workspace is sized by it,
    so a shape whose tiles fill the SMs needs none: the LM head's, which room for eight
    splits made 8 x 64 x 262,144 floats at 64 rows."""
    key = (id(configs), bucket, n, k, group)
    if key not in _largest_splits:
        if len(configs) == 1:
            split = configs[0].kwargs["SPLIT_K"]
        else:
            named = {"M": 1, "M_BUCKET": bucket, "N": n, "K": k}
            split = max(c.kwargs["SPLIT_K"] for c in prune_matmul(configs, named, GROUP=group))
        _largest_splits[key] = configs, split
    return _largest_splits[key][1]


# `largest_split`'s answers, worked out once a shape (not at each launch) and forgotten
# when the pinned table changes; each holds its list, so that no other list takes that
# list's id while the answer stands.
_largest_splits: dict[tuple[int, int, int, int, int], tuple[list, int]] = {}


def scale_words_fit(k: int, group: int) -> bool:
    """`SCALE_WORDS` reads a row's scales two to an aligned 32-bit word, which rows of an
    odd number of groups do not start on (the engine's scales are whole rows of their
    allocation, so the rest do)."""
    return (k // group) % 2 == 0


def prune_scale_words(configs: list, k: int, group: int) -> list:
    """Where `scale_words_fit` does not, the configurations load the scales one by one."""
    if scale_words_fit(k, group):
        return configs
    return [
        triton.Config({**c.kwargs, "SCALE_WORDS": False}, c.num_warps, c.num_stages)
        if c.kwargs.get("SCALE_WORDS")
        else c
        for c in configs
    ]


def prune_splits(configs: list, named_args: dict, **kwargs: object) -> list:
    rows = named_args.get("M", 1)
    bucket = named_args.get("M_BUCKET", 1)
    kept = []
    for config in configs:
        meta = config.kwargs
        if meta.get("BLOCK_M", 1) > max(bucket, 16):  # row tiles past the rows there are
            continue
        programs = -(-named_args["N"] // meta["BLOCK_N"]) * -(-rows // meta.get("BLOCK_M", 1))
        split = meta["SPLIT_K"]
        if split == 1 or (
            programs < SPLIT_BELOW_PROGRAMS and named_args["K"] >= 2 * split * meta["BLOCK_K"]
        ):
            kept.append(config)
    return kept or configs


GEMV_INT4_CONFIGS = [
    triton.Config(
        {"BLOCK_N": bn, "BLOCK_K": bk, "GROUP_SCALES": gs, "PREFETCH": pf},
        num_warps=w,
        num_stages=s,
    )
    # the focused sweep's suggestion at one row with chunks up to the whole row
    # (`2026-12-03-h200-int4-long-chunks-sweep.json`)
    for bn, bk, gs, pf, w, s in (
        (4, 256, False, False, 2, 2),
        (16, 2048, True, False, 4, 1),
        (16, 512, True, True, 4, 3),
        (4, 8192, True, False, 4, 1),
        (16, 2048, True, False, 8, 1),
        (16, 512, True, True, 2, 1),
        (8, 4096, True, True, 4, 1),
        (8, 2048, True, False, 4, 3),
    )
]


MATMUL_INT4_CONFIGS = [
    triton.Config(
        {
            "BLOCK_M": bm,
            "BLOCK_N": bn,
            "BLOCK_K": bk,
            "SPLIT_K": sk,
            "PAIRS": pairs,
            "PREFETCH": pf,
            "ROWS_FIRST": rf,
            "SCALE_WORDS": sw,
        },
        num_warps=w,
        num_stages=s,
    )
    # the focused sweep's suggestions at 8 rows, then at 64 (`-int4-scale-words-sweep.json`)
    for bm, bn, bk, sk, pairs, pf, rf, sw, w, s in (
        (16, 32, 256, 1, True, True, False, False, 4, 3),
        (16, 32, 64, 8, True, True, False, False, 4, 1),
        (16, 64, 256, 1, True, False, False, False, 4, 3),
        (16, 64, 128, 8, True, False, False, True, 4, 3),
        (16, 64, 128, 4, True, True, False, False, 4, 4),
        (16, 32, 64, 8, True, False, False, True, 4, 3),
        (16, 64, 128, 4, True, False, False, False, 4, 1),
        (16, 32, 256, 1, True, True, False, False, 4, 1),
        (32, 64, 256, 1, True, False, False, False, 4, 3),
        (64, 64, 128, 4, True, True, False, False, 4, 1),
        (64, 64, 128, 1, True, False, True, True, 4, 3),
        (64, 64, 128, 8, True, True, True, False, 4, 4),
        (64, 128, 128, 1, True, True, True, False, 8, 3),
        (32, 64, 128, 4, True, True, False, False, 4, 4),
        (64, 64, 128, 8, True, True, False, False, 4, 1),
    )
]
