"""Telemetry: the sampler thread against this host's real psutil and a real engine-like
process tree, the per-job summary on hand-built samples, and the NVML paths through the
pynvml stand-in (tests/fixtures/fake_nvml.py; this machine has no GPU).

Timing tolerances are wide on purpose: the suite shares two cores with other work.
"""

from __future__ import annotations

import csv
import itertools
import logging
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pynvml
import pytest

from agent.telemetry import (
    GpuSample,
    HostSample,
    JobAccumulator,
    TelemetrySampler,
    read_telemetry_csv,
    summarize,
)
from contract.telemetry import TELEMETRY_COLUMNS, TelemetrySummary
from tests.fixtures.fake_nvml import FakeGpu, FakeNvml

MS = 1_000_000

# An "engine": a parent that starts a child which holds ~80 MiB (written, so resident) and
# keeps one core busy; both end by themselves after 20 s if the test cannot kill them.
ENGINE = """
import subprocess, sys
burner = (
    "import time\\n"
    "x = b'\\\\x01' * (80 * 1024 * 1024)\\n"
    "end = time.monotonic() + 20\\n"
    "while time.monotonic() < end:\\n"
    "    pass\\n"
)
child = subprocess.Popen([sys.executable, "-c", burner])
print("started", flush=True)
try:
    child.wait(timeout=20)
finally:
    child.kill()
"""


@pytest.fixture
def engine_tree() -> Iterator[subprocess.Popen[str]]:
    proc = subprocess.Popen([sys.executable, "-c", ENGINE], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "started"
        yield proc
    finally:
        # Only the processes this test started, by pid: the burner child, then the parent.
        try:
            for child in psutil.Process(proc.pid).children(recursive=True):
                child.kill()
        except psutil.NoSuchProcess:
            pass
        proc.kill()
        proc.wait(timeout=10)
        if proc.stdout is not None:
            proc.stdout.close()


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as fh:
        return list(csv.DictReader(fh))


def _collapse(tags: list[str | None]) -> list[str | None]:
    out: list[str | None] = []
    for tag in tags:
        if not out or out[-1] != tag:
            out.append(tag)
    return out


# -- psutil only: the real host and a real process tree -------------------------------------


def test_host_sampling_tags_jobs_and_follows_the_engine_tree(
    tmp_path: Path, engine_tree: subprocess.Popen[str], caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="agent.telemetry")
    path = tmp_path / "telemetry.csv"
    interval = 0.2
    sampler = TelemetrySampler(path, nvml=None, host_interval_s=interval)
    sampler.track_process(engine_tree.pid)
    marks: dict[str, tuple[int, int]] = {}
    with sampler:
        time.sleep(0.3)
        for job, stay_s in (("a", 0.8), ("b", 0.8), ("none", 0.3)):
            before = time.perf_counter_ns()
            sampler.set_job(None if job == "none" else job)
            marks[job] = (before, time.perf_counter_ns())
            time.sleep(stay_s)
        summary_a = sampler.summary("a", output_tokens=100)
    stats = sampler.stats()

    # Said once, at INFO, and nothing worse than INFO.
    host_only = [r for r in caplog.records if "sampling the host only" in r.getMessage()]
    assert len(host_only) == 1 and host_only[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]

    # The CSV parses, with the contract's header, and only host rows.
    with path.open() as fh:
        assert tuple(next(csv.reader(fh))) == TELEMETRY_COLUMNS
    samples = list(read_telemetry_csv(path))
    assert samples and all(isinstance(s, HostSample) for s in samples)
    assert len(samples) == stats.rows_written

    # Tags: in order, and each row inside the window of its job (the closing read of a job
    # is taken during the next set_job call, before it returns).
    assert _collapse([s.job_id for s in samples]) == [None, "a", "b", None]
    for s in samples:
        t = s.time_perf_ns
        if s.job_id == "a":
            assert marks["a"][0] <= t <= marks["b"][1]
        elif s.job_id == "b":
            assert marks["b"][0] <= t <= marks["none"][1]
        else:
            assert t <= marks["a"][1] or t >= marks["none"][0]
    assert any(s.job_id == "a" and s.time_perf_ns >= marks["b"][0] for s in samples)

    # Cadence: no gap much over the interval, and about as many rows as the time allows.
    times = [s.time_perf_ns for s in samples]
    gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(times)]
    assert max(gaps_s) < interval + 0.25, gaps_s
    expected = (times[-1] - times[0]) / 1e9 / interval
    assert len(samples) >= 0.7 * expected
    assert stats.host_passes >= len(samples) - 1 and stats.gpu_passes == 0

    # Host values are there; the engine tree (parent + burning child) is followed.
    assert all(s.ram_used_mib and s.ram_pct is not None for s in samples)
    # CPU % needs the system's CPU time to have advanced since the last read; /proc/stat
    # counts in 10 ms ticks, so the very first read, the two reads a job switch forces back
    # to back (three switches here) and the final read at stop may have nothing to divide by.
    assert sum(s.cpu_pct is not None for s in samples) >= len(samples) - (1 + 2 * 3 + 1)
    late = [s for s in samples if s.time_perf_ns >= marks["b"][0]]
    assert all(s.engine_pid == engine_tree.pid for s in samples)
    assert max(s.engine_procs or 0 for s in late) == 2
    assert max(s.engine_rss_mib or 0 for s in late) >= 80
    assert max(s.engine_cpu_pct or 0 for s in late) >= 30

    # The job's summary from the live fold.
    assert summary_a.job_id == "a" and summary_a.gpu_samples == 0
    assert summary_a.host_samples == sum(s.job_id == "a" for s in samples)
    assert summary_a.duration_s == pytest.approx(0.8, abs=0.3)
    assert summary_a.energy_j is None and summary_a.joules_per_output_token is None
    assert summary_a.cpu_pct_mean is not None and summary_a.engine_cpu_pct_mean is not None
    assert summary_a.engine_rss_mib_peak is not None and summary_a.engine_rss_mib_peak >= 20
    # The same numbers again from the CSV, offline.
    offline = summarize("a", samples, output_tokens=100)
    assert offline.host_samples == summary_a.host_samples
    assert offline.engine_rss_mib_peak == summary_a.engine_rss_mib_peak

    # Its own cost was measured.
    assert stats.cpu_s > 0 and stats.cpu_s_per_min is not None and stats.cpu_s_per_min < 6


def test_an_existing_csv_is_appended_to_and_a_foreign_one_moved_aside(tmp_path: Path):
    path = tmp_path / "telemetry.csv"
    for _ in range(2):
        with TelemetrySampler(path, nvml=None, host_interval_s=0.05) as sampler:
            sampler.set_job("j")
            time.sleep(0.1)
        with pytest.raises(ValueError, match="job id"):
            sampler.set_job("")
    lines = path.read_text().splitlines()
    assert lines[0] == ",".join(TELEMETRY_COLUMNS)
    assert sum(line == lines[0] for line in lines) == 1
    assert len(lines) > 4

    path.write_text("something,else\n1,2\n")
    with TelemetrySampler(path, nvml=None, host_interval_s=0.05):
        pass
    assert path.read_text().splitlines()[0] == ",".join(TELEMETRY_COLUMNS)
    assert [p.read_text() for p in tmp_path.glob("telemetry.*.csv")] == ["something,else\n1,2\n"]


# -- summary arithmetic on hand-built samples -------------------------------------------------


def _gpu(t_ms: int, index: int = 0, job: str | None = "j", **values: float | int) -> GpuSample:
    return GpuSample(
        time_unix_s=1e9 + t_ms / 1000, time_perf_ns=t_ms * MS, job_id=job, gpu_index=index,
        **values,  # type: ignore[arg-type]
    )  # fmt: skip


def _host(t_ms: int, job: str | None = "j", **values: float | int) -> HostSample:
    return HostSample(
        time_unix_s=1e9 + t_ms / 1000, time_perf_ns=t_ms * MS, job_id=job,
        **values,  # type: ignore[arg-type]
    )  # fmt: skip


def test_summary_energy_from_counter_deltas_across_a_reset():
    samples = [
        _gpu(0, energy_mj=1_000, power_w=100.0, mem_used_mib=500.0, gpu_util_pct=10.0),
        _gpu(100, energy_mj=3_000, power_w=200.0, mem_used_mib=900.0, gpu_util_pct=50.0),
        _gpu(200, energy_mj=6_000, power_w=300.0, mem_used_mib=700.0, gpu_util_pct=90.0),
        # Driver reload: the counter starts again from 0 and reads 500 mJ.
        _gpu(300, energy_mj=500, power_w=200.0, mem_used_mib=650.0, gpu_util_pct=50.0),
        _gpu(400, energy_mj=2_500, power_w=200.0, mem_used_mib=600.0, gpu_util_pct=0.0),
        _gpu(250, job="other", energy_mj=10**9, power_w=999.0, mem_used_mib=99_999.0),
    ]
    s = summarize("j", samples, output_tokens=100)
    (g,) = s.gpus
    # 2000 + 3000 + 500 (since the reset) + 2000 mJ; the other job's row is ignored.
    assert g.energy_j == pytest.approx(7.5)
    assert g.energy_counter_resets == 1
    assert g.samples == 5 and s.gpu_samples == 5
    assert g.peak_memory_used_mib == 900.0 and s.peak_gpu_memory_mib == 900.0
    assert g.mean_power_w == pytest.approx(200.0) and g.max_power_w == 300.0
    assert g.mean_gpu_util_pct == pytest.approx(40.0)
    # Trapezoids: (100+200)/2*.1 + (200+300)/2*.1 + (300+200)/2*.1 + (200+200)/2*.1
    assert g.energy_j_power_integral == pytest.approx(15 + 25 + 25 + 20)
    assert s.energy_j == pytest.approx(7.5) and s.mean_power_w == pytest.approx(200.0)
    assert s.joules_per_output_token == pytest.approx(0.075)
    assert s.duration_s == pytest.approx(0.4)


def test_summary_sums_gpus_and_refuses_partial_energy():
    two = [
        _gpu(0, 0, energy_mj=0, power_w=100.0, mem_used_mib=10.0, gpu_util_pct=20.0),
        _gpu(0, 1, energy_mj=50, power_w=300.0, mem_used_mib=30.0, gpu_util_pct=60.0),
        _gpu(1000, 0, energy_mj=100_000, power_w=100.0, mem_used_mib=20.0, gpu_util_pct=20.0),
        _gpu(1000, 1, energy_mj=300_050, power_w=300.0, mem_used_mib=25.0, gpu_util_pct=60.0),
    ]
    s = summarize("j", two, output_tokens=400)
    assert [g.index for g in s.gpus] == [0, 1]
    assert s.energy_j == pytest.approx(400.0)
    assert s.joules_per_output_token == pytest.approx(1.0)
    assert s.mean_power_w == pytest.approx(400.0)
    assert s.mean_gpu_util_pct == pytest.approx(40.0)
    assert s.peak_gpu_memory_mib == 30.0

    # GPU 1 without the counter (pre-Volta): no energy and no J/token, rather than half.
    no_counter = [
        _gpu(t, i, power_w=100.0, **({"energy_mj": t * 100} if i == 0 else {}))
        for t in (0, 1000)
        for i in (0, 1)
    ]
    s = summarize("j", no_counter, output_tokens=400)
    assert s.gpus[0].energy_j == pytest.approx(100.0) and s.gpus[1].energy_j is None
    assert s.energy_j is None and s.joules_per_output_token is None

    # One reading is not a delta; zero or unknown tokens give no J/token.
    assert summarize("j", [_gpu(0, energy_mj=5)], output_tokens=10).energy_j is None
    assert summarize("j", two, output_tokens=0).joules_per_output_token is None
    assert summarize("j", two).joules_per_output_token is None
    assert summarize("nobody", two) == TelemetrySummary(job_id="nobody")


def test_accumulator_segments_skip_the_gap_and_first_host_cpu():
    acc = JobAccumulator("j")
    acc.open_segment()
    acc.add(_gpu(0, energy_mj=1_000, power_w=100.0))
    acc.add(_host(0, cpu_pct=99.0, engine_cpu_pct=99.0, engine_rss_mib=100.0))
    acc.add(_host(500, cpu_pct=20.0, engine_cpu_pct=50.0, engine_rss_mib=300.0))
    acc.add(_gpu(1000, energy_mj=2_000, power_w=100.0))
    # Another job ran for 9 s and used 900 J; then this one again.
    acc.open_segment()
    acc.add(_host(10_000, cpu_pct=99.0, engine_cpu_pct=99.0, engine_rss_mib=200.0))
    acc.add(_gpu(10_000, energy_mj=902_000, power_w=100.0))
    acc.add(_host(10_500, cpu_pct=40.0, engine_cpu_pct=150.0, engine_rss_mib=250.0))
    acc.add(_gpu(11_000, energy_mj=903_000, power_w=100.0))
    s = acc.summary(output_tokens=20)
    assert s.energy_j == pytest.approx(2.0)  # 1 J per stretch, not the 900 J between
    assert s.gpus[0].energy_j_power_integral == pytest.approx(200.0)
    assert s.duration_s == pytest.approx(2.0)
    assert s.cpu_pct_mean == pytest.approx(30.0)  # the 99 % opening reads left out
    assert s.engine_cpu_pct_mean == pytest.approx(100.0)
    assert s.engine_rss_mib_peak == 300.0
    assert s.joules_per_output_token == pytest.approx(0.1)
    assert TelemetrySummary.from_dict(s.to_dict()) == s


# -- NVML through the pynvml stand-in -------------------------------------------------------


def _gpu_rows(path: Path, index: int) -> list[GpuSample]:
    return [
        s for s in read_telemetry_csv(path) if isinstance(s, GpuSample) and s.gpu_index == index
    ]


def test_nvml_sampling_probes_once_and_counts_energy_from_the_counter(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="agent.telemetry")
    # A driver older than the binding: the newer entry points are missing, the deprecated
    # ones answer.
    full = FakeGpu(power_w=300.0, old_driver=True)
    # An older board on an older driver: no temperature, PCIe or clock reasons at all.
    partial = FakeGpu(
        name="NVIDIA T4 (fake)",
        power_w=70.0,
        old_driver=True,
        unsupported={
            "nvmlDeviceGetTemperature",
            "nvmlDeviceGetPcieThroughput",
            "nvmlDeviceGetCurrentClocksThrottleReasons",
        },
    )
    nvml = FakeNvml([full, partial])
    path = tmp_path / "telemetry.csv"
    interval = 0.05
    sampler = TelemetrySampler(
        path, nvml=nvml, psutil_module=None, gpu_interval_s=interval, pcie_interval_s=0.2
    )
    with sampler:
        sampler.set_job("gen")
        time.sleep(0.8)
        sampler.set_job(None)
        summary = sampler.summary("gen", output_tokens=1000)
        devices = sampler.devices
    stats = sampler.stats()
    assert nvml.initialized == 0  # nvmlShutdown called

    assert [d.name for d in devices] == ["NVIDIA H200 (fake)", "NVIDIA T4 (fake)"]
    assert devices[0].unsupported == ()
    assert set(devices[1].unsupported) == {"temperature", "throttle_reasons", "pcie"}
    # Warned once per unsupported reading, and never asked again after the probe.
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3 and all("GPU 1" in w for w in warnings), warnings
    for fn in ("nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature"):
        assert partial.calls[fn] == 1
    assert full.calls["nvmlDeviceGetTemperatureV"] == 1  # probed, fell back
    assert full.calls["nvmlDeviceGetTemperature"] > 5
    assert partial.calls["nvmlDeviceGetPcieThroughput"] == 1
    assert stats.nvml_errors == 0 and stats.internal_errors == 0 and stats.nvml

    rows0, rows1 = _gpu_rows(path, 0), _gpu_rows(path, 1)
    assert len(rows0) == len(rows1) > 0
    assert all(r.temp_c == 61 and r.throttle_reasons == 1 for r in rows0)
    assert all(r.temp_c is None and r.pcie_rx_kb_s is None for r in rows1)
    assert all(r.throttle_reasons is None for r in rows1)
    assert all(r.power_w == 70.0 and r.sm_clock_mhz == 1980 for r in rows1)
    # PCIe only at its own cadence (4x slower here), never on the job-boundary reads.
    with_pcie = [r for r in rows0 if r.pcie_rx_kb_s is not None]
    assert with_pcie and all(r.pcie_rx_kb_s == 1200 and r.pcie_tx_kb_s == 800 for r in with_pcie)
    assert len(with_pcie) <= len(rows0) / 2
    # Raw CSV: empty cells, not zeros, where there is no value.
    raw1 = [r for r in _rows(path) if r["gpu_index"] == "1"]
    assert all(r["temp_c"] == "" and r["cpu_pct"] == "" for r in raw1)

    # Cadence of the regular reads.
    regular = [r.time_perf_ns for r in rows0 if r.job_id == "gen"]
    gaps_s = [(b - a) / 1e9 for a, b in itertools.pairwise(regular)]
    assert statistics.median(gaps_s) == pytest.approx(interval, abs=0.02)
    assert max(gaps_s) < interval + 0.2

    # Energy from the counter: power x time, per GPU and summed; J per output token.
    g0, g1 = summary.gpus
    assert summary.duration_s is not None and summary.duration_s == pytest.approx(0.8, abs=0.2)
    assert g0.energy_j == pytest.approx(300.0 * summary.duration_s, rel=0.03)
    assert g1.energy_j == pytest.approx(70.0 * summary.duration_s, rel=0.03)
    assert g0.energy_j_power_integral == pytest.approx(g0.energy_j, rel=0.03)
    assert summary.energy_j == pytest.approx(370.0 * summary.duration_s, rel=0.03)
    assert summary.joules_per_output_token == pytest.approx(summary.energy_j / 1000)
    assert summary.mean_power_w == pytest.approx(370.0)
    # Old driver: the v1 memory query, which counts the driver's reserved 512 MiB as used.
    assert summary.peak_gpu_memory_mib == 1024.0 + 512.0
    assert summary.mean_gpu_util_pct == pytest.approx(87.0)


def test_nvml_device_failing_mid_run_and_a_counter_reset_do_not_stop_sampling(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    caplog.set_level(logging.INFO, logger="agent.telemetry")
    flaky, lost, steady = FakeGpu(), FakeGpu(name="lost"), FakeGpu(power_w=200.0)
    nvml = FakeNvml([flaky, lost, steady])
    path = tmp_path / "telemetry.csv"
    # Energy at every pass here, so the reset mid-job is seen between two reads.
    sampler = TelemetrySampler(
        path, nvml=nvml, psutil_module=None, gpu_interval_s=0.05, energy_interval_s=0.05
    )
    with sampler:
        sampler.set_job("gen")
        time.sleep(0.3)
        flaky.fail_with = pynvml.NVML_ERROR_UNKNOWN
        lost.fail_with = pynvml.NVML_ERROR_GPU_IS_LOST
        steady.reset_energy_counter()
        time.sleep(0.3)
        flaky.fail_with = None  # a transient fault: it answers again
        time.sleep(0.3)
        sampler.set_job(None)
        summary = sampler.summary("gen", output_tokens=10)
        running_after = sampler._running()
    stats = sampler.stats()
    assert running_after

    rows = {i: _gpu_rows(path, i) for i in range(3)}
    # The flaky GPU kept its rows, with empty cells while failing, then values again.
    assert any(r.power_w is None for r in rows[0]) and rows[0][-1].power_w is not None
    # The lost GPU stopped producing rows; the steady one never noticed.
    assert len(rows[1]) < len(rows[2]) / 2
    assert all(r.power_w == 200.0 for r in rows[2])
    assert all(r.mem_used_mib == 1024.0 for r in rows[2])  # v2: reserved memory left out
    # PCIe (~40 ms blocking per GPU on real hardware) is read for one GPU per pass, in turn:
    # with the default 1 s per GPU, three GPUs and ~0.9 s, a handful of reads in all.
    pcie_reads = [r for i in (0, 2) for r in rows[i] if r.pcie_rx_kb_s is not None]
    assert 1 <= len(pcie_reads) <= 4
    assert stats.nvml_errors > 0 and stats.internal_errors == 0

    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    lost_msgs = [w for w in warnings if "GPU is lost" in w]
    assert len(lost_msgs) == 1
    # One warning per reading of the flaky GPU, however many passes failed.
    flaky_msgs = [w for w in warnings if w.startswith("GPU 0") and "Unknown Error" in w]
    assert 1 <= len(flaky_msgs) <= 9 < stats.nvml_errors
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]

    # The steady GPU's counter went back to 0 mid-job: one reset, energy still about P x t
    # (short by at most the one interval before the reset).
    g2 = summary.gpus[2]
    assert g2.energy_counter_resets == 1
    assert summary.duration_s is not None
    expected = 200.0 * summary.duration_s
    assert expected - 200.0 * 0.2 <= g2.energy_j <= expected * 1.02  # type: ignore[operator]
    # GPU 1 has no energy after it was lost, but its earlier delta stands; the job's total
    # needs every GPU, which it has.
    assert summary.energy_j is not None


@pytest.mark.parametrize(
    "init_error", [pynvml.NVML_ERROR_LIBRARY_NOT_FOUND, pynvml.NVML_ERROR_DRIVER_NOT_LOADED]
)
def test_no_driver_means_host_only_said_once_at_info(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, init_error: int
):
    caplog.set_level(logging.DEBUG, logger="agent.telemetry")
    path = tmp_path / "telemetry.csv"
    nvml = FakeNvml([FakeGpu()], init_error=init_error)
    with TelemetrySampler(path, nvml=nvml, host_interval_s=0.05) as sampler:
        sampler.set_job("j")
        time.sleep(0.15)
    assert sampler.devices == [] and not sampler.stats().nvml
    said = [r for r in caplog.records if "sampling the host only" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.INFO
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    samples = list(read_telemetry_csv(path))
    assert samples and all(isinstance(s, HostSample) for s in samples)
