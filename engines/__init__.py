"""Engine recipes (data: version pins, install steps, serve argv, ports) and the project's
own engine servers. Imports `contract/` only; no subprocesses at import time, no boto3."""
