"""The workstation <-> instance contract: result records, results layout, spec and status,
and the pure computations both sides share: metric definitions and percentiles
(`metrics`), paired statistics of eval runs (`paired`), telemetry samples and their per-job
fold (`telemetry_samples`, `telemetry_summary`).

Both sides import this package; it imports nothing else of ours.
"""
