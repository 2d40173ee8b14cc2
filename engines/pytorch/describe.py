"""`python -m engines.pytorch.describe MODEL [--quantize Q]`: one line naming what the
engine will serve, for the manifest (the recipe's version probe): torch and CUDA versions,
and the weights' form: a compressed-tensors W4A16 checkpoint's format, group sizes and
targets, int4 quantized at load, or dense. Reads only the model's config.json (a hub id's
from the local cache only); never fails: what it cannot tell it says."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch

from engines.pytorch import checkpoint, int4


def weights_form(model: str, quantize: str) -> str:
    if quantize == "w4a16":
        return (
            f"int4 quantized at load ({checkpoint.FORMAT} layout, symmetric, group "
            f"{int4.DEFAULT_GROUP_SIZE}, Linear and Embedding of the text decoder)"
        )
    if model.startswith("random:"):
        return "dense (random weights)"
    try:
        local = Path(model).expanduser()
        if local.is_dir():
            config_file = local / "config.json"
        else:
            from huggingface_hub import hf_hub_download

            # The cache alone: a probe must not wait on the network (the agent fetched
            # the model before, or the engine will when it starts).
            config_file = Path(hf_hub_download(model, "config.json", local_files_only=True))
        qc = json.loads(config_file.read_text()).get("quantization_config")
    except Exception as exc:  # a line for the manifest, whatever went wrong
        return f"unknown ({type(exc).__name__})"
    if qc is None:
        return "dense"
    try:
        sizes = checkpoint.check_quantization_config(qc)
    except checkpoint.UnsupportedCheckpoint as exc:
        return f"unsupported ({exc})"
    targets = sorted({t for g in qc["config_groups"].values() for t in g.get("targets", [])})
    ignore = qc.get("ignore") or []
    return (
        f"W4A16 checkpoint ({checkpoint.QUANT_METHOD} {checkpoint.FORMAT}, int4 symmetric, "
        f"group {'/'.join(str(s) for s in sizes)}, targets {', '.join(targets)}"
        + (f", {len(ignore)} modules left dense" if ignore else "")
        + ")"
    )


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m engines.pytorch.describe")
    p.add_argument("model")
    p.add_argument("--quantize", default="none")
    args = p.parse_args(argv)
    sys.stdout.write(
        f"torch {torch.__version__} cuda {torch.version.cuda}; weights: "
        f"{weights_form(args.model, args.quantize)}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
