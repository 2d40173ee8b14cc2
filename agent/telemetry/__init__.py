"""Telemetry for the whole run: GPU (NVML) and host (psutil) samples in `telemetry.csv`, each
row tagged with the job running, and a per-job summary (peak GPU memory, mean power, energy
from the NVML counter, joules per output token).

- `sampler`: `TelemetrySampler`, the thread the runner starts once and tells about jobs.
- `gpu`: NVML probing and reads (capabilities probed once, errors never raised).
- `host`: psutil reads of the host and the engine's process tree.
- the sample records, their CSV rows and the per-job fold over samples are pure and shared
  with reports: `contract.telemetry_samples` and `contract.telemetry_summary`.

Imports only the standard library, `contract`, and (optionally) pynvml and psutil, so the
GPU check script (benchmarks/telemetry_gpu_check.py) runs where only torch and
nvidia-ml-py are installed.
"""

from agent.telemetry.sampler import AUTO, TelemetrySampler
from contract.telemetry_samples import GpuSample, HostSample, Sample, read_telemetry_csv
from contract.telemetry_summary import JobAccumulator, summarize

__all__ = [
    "AUTO",
    "GpuSample",
    "HostSample",
    "JobAccumulator",
    "Sample",
    "TelemetrySampler",
    "read_telemetry_csv",
    "summarize",
]
