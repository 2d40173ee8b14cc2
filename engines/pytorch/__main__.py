"""`python -m engines.pytorch ...`: parse the command line, set up logging, serve."""

from __future__ import annotations

import logging

from engines.pytorch.config import parse_args
from engines.pytorch.server import serve


def main() -> None:
    config = parse_args()
    logging.basicConfig(
        level=config.log_level.upper(),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    serve(config)


if __name__ == "__main__":
    main()
