"""The NVML energy counter (milliseconds a read on an H200) is read once a second and at
every job boundary, not at every 100 ms pass; a job's energy is still its counter delta."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from agent.telemetry import TelemetrySampler, read_telemetry_csv
from contract.telemetry_samples import GpuSample
from tests.fixtures.fake_nvml import FakeGpu, FakeNvml


def test_energy_is_read_once_a_second_and_at_job_boundaries(tmp_path: Path) -> None:
    gpu = FakeGpu(power_w=100.0)
    path = tmp_path / "telemetry.csv"
    sampler = TelemetrySampler(path, nvml=FakeNvml([gpu]), psutil_module=None, gpu_interval_s=0.05)
    with sampler:
        time.sleep(0.2)
        sampler.set_job("a")
        start = time.perf_counter()
        time.sleep(1.5)
        sampler.set_job(None)
        took_s = time.perf_counter() - start
        summary = sampler.summary("a")
    rows = [s for s in read_telemetry_csv(path) if isinstance(s, GpuSample)]
    in_job = [r for r in rows if r.job_id == "a"]
    with_energy = [r for r in in_job if r.energy_mj is not None]
    assert len(in_job) >= 10, "the other readings keep their 50 ms cadence"
    # The opening and the closing read, and one or two once-a-second reads between.
    assert 2 <= len(with_energy) <= 4 < len(in_job)
    assert with_energy[0] is in_job[0] and with_energy[-1] is in_job[-1]
    (gpu_summary,) = summary.gpus
    assert gpu_summary.energy_j == pytest.approx(100.0 * took_s, rel=0.15)
