"""`python -m engines.jax ...`: parse the command line, set up logging, serve."""

from __future__ import annotations

import logging
import os
import sys


def main() -> None:
    from engines.jax.config import parse_args

    config = parse_args()
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    if config.device == "cpu":
        # Before JAX starts: a CPU run must not claim (or wait for) a GPU.
        os.environ["JAX_PLATFORMS"] = "cpu"
    from engines.jax.server import serve

    try:
        serve(config)
    except ValueError as e:  # bad flags or model: one line, no traceback
        sys.exit(f"engines.jax: error: {e}")


if __name__ == "__main__":
    main()
