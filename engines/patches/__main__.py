"""`python -m engines.patches apply NAME SITE_PACKAGES`: apply an engine patch, idempotently."""

from engines.patches import _main

raise SystemExit(_main())
