"""The on-instance side: everything that runs where the GPU is (or locally under `bench run`).

Load generation and metrics, engine supervision, telemetry, result writing, upload and
status. Never imports `infra/` or `cli/`: the instance has no CDK and no workstation CLI.
"""
