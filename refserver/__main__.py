"""`python -m refserver`: the reference server's command line (refserver.cli)."""

import sys

from refserver.cli import main

sys.exit(main())
