"""Per-job telemetry summary, folded sample by sample so memory stays bounded.

The sampler feeds every sample tagged with a job into that job's `JobAccumulator` as it is
taken (the CSV holds the rows; nothing here keeps them). `summarize` runs the same fold over
a list of samples, which is what the tests and offline reports use.

Energy is the NVML total-energy counter's delta (vLLM's GpuEnergyMeter and AIPerf do the
same), summed over consecutive samples of one stretch of the job: a counter that goes
backwards has been reset (driver reload), and the value after the reset is the energy since
it. The trapezoid integral of the power samples is kept as a cross-check only: on
A100/H100-class GPUs nvmlDeviceGetPowerUsage is a one-second average, so the integral lags.

A job may run in several stretches (set_job(a), set_job(b), set_job(a) again); each
`open_segment` starts a new one so the gap between them is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from contract.telemetry import GpuTelemetrySummary, TelemetrySummary
from contract.telemetry_samples import GpuSample, Sample

__all__ = ["JobAccumulator", "summarize"]


@dataclass
class _Mean:
    total: float = 0.0
    n: int = 0

    def add(self, value: float | None) -> None:
        if value is not None:
            self.total += value
            self.n += 1

    @property
    def value(self) -> float | None:
        return self.total / self.n if self.n else None


def _max(current: float | None, value: float | None) -> float | None:
    if value is None:
        return current
    return value if current is None else max(current, value)


@dataclass
class _GpuFold:
    index: int
    samples: int = 0
    peak_memory_mib: float | None = None
    max_power_w: float | None = None
    max_temp_c: float | None = None
    throttle_seen: int | None = None
    power: _Mean = field(default_factory=_Mean)
    gpu_util: _Mean = field(default_factory=_Mean)
    mem_util: _Mean = field(default_factory=_Mean)
    energy_mj: int = 0
    energy_deltas: int = 0
    counter_resets: int = 0
    last_energy_mj: int | None = None
    integral_j: float = 0.0
    integral_spans: int = 0
    last_power: tuple[int, float] | None = None  # (perf ns, W)

    def new_segment(self) -> None:
        self.last_energy_mj = None
        self.last_power = None

    def add(self, s: GpuSample) -> None:
        self.samples += 1
        self.peak_memory_mib = _max(self.peak_memory_mib, s.mem_used_mib)
        self.max_power_w = _max(self.max_power_w, s.power_w)
        self.max_temp_c = _max(self.max_temp_c, s.temp_c)
        if s.throttle_reasons is not None:
            self.throttle_seen = (self.throttle_seen or 0) | s.throttle_reasons
        self.power.add(s.power_w)
        self.gpu_util.add(s.gpu_util_pct)
        self.mem_util.add(s.mem_util_pct)
        if s.energy_mj is not None:
            if self.last_energy_mj is not None:
                delta = s.energy_mj - self.last_energy_mj
                if delta < 0:
                    # Counter reset: it restarted from 0, so its value is the energy since.
                    self.counter_resets += 1
                    delta = s.energy_mj
                self.energy_mj += delta
                self.energy_deltas += 1
            self.last_energy_mj = s.energy_mj
        if s.power_w is not None:
            if self.last_power is not None:
                t0, p0 = self.last_power
                dt_s = (s.time_perf_ns - t0) / 1e9
                if dt_s > 0:
                    self.integral_j += (p0 + s.power_w) / 2 * dt_s
                    self.integral_spans += 1
            self.last_power = (s.time_perf_ns, s.power_w)

    def summary(self) -> GpuTelemetrySummary:
        return GpuTelemetrySummary(
            index=self.index,
            samples=self.samples,
            peak_memory_used_mib=self.peak_memory_mib,
            mean_power_w=self.power.value,
            max_power_w=self.max_power_w,
            mean_gpu_util_pct=self.gpu_util.value,
            mean_mem_util_pct=self.mem_util.value,
            max_temp_c=self.max_temp_c,
            throttle_reasons_seen=self.throttle_seen,
            energy_j=self.energy_mj / 1000.0 if self.energy_deltas else None,
            energy_j_power_integral=self.integral_j if self.integral_spans else None,
            energy_counter_resets=self.counter_resets,
        )


def _sum_all(values: list[float | None]) -> float | None:
    """Sum, or None if any is missing: a partial sum over GPUs would understate the job."""
    if not values or any(v is None for v in values):
        return None
    return sum(v for v in values if v is not None)


class JobAccumulator:
    """Running summary of one job; feed it samples in time order."""

    def __init__(self, job_id: str) -> None:
        self.job_id = job_id
        self._gpus: dict[int, _GpuFold] = {}
        self._gpu_samples = 0
        self._host_samples = 0
        self._cpu = _Mean()
        self._engine_cpu = _Mean()
        self._ram_peak: float | None = None
        self._rss_peak: float | None = None
        self._closed_ns = 0
        self._first_ns: int | None = None
        self._last_ns: int | None = None
        self._host_in_segment = 0

    def open_segment(self) -> None:
        """Start a new stretch of the job: no delta or duration spans the gap before it."""
        if self._first_ns is not None and self._last_ns is not None:
            self._closed_ns += self._last_ns - self._first_ns
        self._first_ns = self._last_ns = None
        self._host_in_segment = 0
        for fold in self._gpus.values():
            fold.new_segment()

    def _stamp(self, perf_ns: int) -> None:
        if self._first_ns is None:
            self._first_ns = perf_ns
        self._last_ns = perf_ns if self._last_ns is None else max(self._last_ns, perf_ns)

    def add(self, sample: Sample) -> None:
        self._stamp(sample.time_perf_ns)
        if isinstance(sample, GpuSample):
            self._gpu_samples += 1
            fold = self._gpus.get(sample.gpu_index)
            if fold is None:
                fold = self._gpus[sample.gpu_index] = _GpuFold(sample.gpu_index)
            fold.add(sample)
            return
        self._host_samples += 1
        self._host_in_segment += 1
        if self._host_in_segment > 1:
            # The first host sample's percentages cover the time before the stretch began.
            self._cpu.add(sample.cpu_pct)
            self._engine_cpu.add(sample.engine_cpu_pct)
        self._ram_peak = _max(self._ram_peak, sample.ram_used_mib)
        self._rss_peak = _max(self._rss_peak, sample.engine_rss_mib)

    def summary(self, output_tokens: int | None = None) -> TelemetrySummary:
        """The job so far. joules_per_output_token needs output_tokens > 0 and the counter."""
        gpus = tuple(self._gpus[i].summary() for i in sorted(self._gpus))
        span_ns = self._closed_ns
        if self._first_ns is not None and self._last_ns is not None:
            span_ns += self._last_ns - self._first_ns
        energy_j = _sum_all([g.energy_j for g in gpus])
        utils = [g.mean_gpu_util_pct for g in gpus if g.mean_gpu_util_pct is not None]
        peaks = [g.peak_memory_used_mib for g in gpus if g.peak_memory_used_mib is not None]
        per_token = None
        if energy_j is not None and output_tokens is not None and output_tokens > 0:
            per_token = energy_j / output_tokens
        return TelemetrySummary(
            job_id=self.job_id,
            duration_s=span_ns / 1e9 if self._gpu_samples or self._host_samples else None,
            gpu_samples=self._gpu_samples,
            host_samples=self._host_samples,
            gpus=gpus,
            peak_gpu_memory_mib=max(peaks) if peaks else None,
            mean_power_w=_sum_all([g.mean_power_w for g in gpus]),
            mean_gpu_util_pct=sum(utils) / len(utils) if utils else None,
            energy_j=energy_j,
            energy_j_power_integral=_sum_all([g.energy_j_power_integral for g in gpus]),
            output_tokens=output_tokens,
            joules_per_output_token=per_token,
            cpu_pct_mean=self._cpu.value,
            ram_used_mib_peak=self._ram_peak,
            engine_rss_mib_peak=self._rss_peak,
            engine_cpu_pct_mean=self._engine_cpu.value,
        )


def summarize(
    job_id: str, samples: Iterable[Sample], output_tokens: int | None = None
) -> TelemetrySummary:
    """Summary of one job from its samples (one stretch; other jobs' samples are ignored)."""
    acc = JobAccumulator(job_id)
    for sample in sorted((s for s in samples if s.job_id == job_id), key=lambda s: s.time_perf_ns):
        acc.add(sample)
    return acc.summary(output_tokens)
