"""`python -m engines.pytorch.quantize --model M --out DIR`: write a model as a
compressed-tensors `pack-quantized` W4A16 checkpoint (round-to-nearest, symmetric, groups
of 32 by default) that the engine, transformers with compressed-tensors, and vLLM read.

M is what the engine's --model takes (`random:<name>`, a local folder, a hub id). The
scales are in --dtype (the checkpoint's dtype; bfloat16 by default). Errors are one line.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from engines.pytorch import checkpoint, int4
from engines.pytorch.model import load_model

log = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m engines.pytorch.quantize",
        description="Write a model as a compressed-tensors pack-quantized W4A16 checkpoint.",
    )
    p.add_argument("--model", required=True, help="random:<name>, a local HF folder, or a hub id")
    p.add_argument("--out", required=True, help="folder to write (created)")
    p.add_argument("--group-size", type=int, default=int4.DEFAULT_GROUP_SIZE)
    p.add_argument("--dtype", default="bfloat16", help="dtype of the dense weights and scales")
    p.add_argument("--seed", type=int, default=0, help="seed of random:<name> weights")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    out = Path(args.out)
    try:
        loaded = load_model(args.model, dtype=args.dtype, device="cpu", seed=args.seed)
        if loaded.quantization is not None:
            raise checkpoint.UnsupportedCheckpoint(f"{args.model} is already int4")
        count = checkpoint.save_w4a16(loaded.model, out, args.group_size)
    except (ValueError, OSError) as exc:
        sys.stderr.write(f"error: {exc}\n")
        return 2
    loaded.tokenizer.save_pretrained(str(out))
    loaded.model.generation_config.save_pretrained(str(out))
    log.info("wrote %s: %d int4 modules, group %d", out, count, args.group_size)
    return 0


if __name__ == "__main__":
    sys.exit(main())
