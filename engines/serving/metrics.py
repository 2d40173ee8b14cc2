"""The engine's Prometheus metrics and their text exposition (format 0.0.4).

A handful of counters, gauges and histograms, written by the scheduler thread and read
by the HTTP thread under one lock; no client library is needed for this little. Each
engine names its own prefix (`pytorch_engine`, `jax_engine`) and may add gauges of its
own (`set_gauge`: the JAX engine's compiled buckets).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

STEP_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


def _num(value: float) -> str:
    if value == float("inf"):
        return "+Inf"
    return repr(float(value)) if not float(value).is_integer() else f"{value:.1f}"


class _Histogram:
    def __init__(self, buckets: Sequence[float]) -> None:
        self.buckets = tuple(buckets)
        self.counts = [0] * len(self.buckets)
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.n += 1
        self.total += value
        for i, bound in enumerate(self.buckets):
            if value <= bound:
                self.counts[i] += 1


class EngineMetrics:
    """What the engine reports: queue sizes, tokens, requests, and time per step."""

    def __init__(self, model_name: str, prefix: str = "pytorch_engine") -> None:
        self._lock = threading.Lock()
        self.prefix = prefix
        self._gauges: dict[str, tuple[str, float]] = {}
        self._base = {"model_name": model_name}
        self.running = 0
        self.waiting = 0
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished: dict[str, int] = {}
        self.step_seconds = {
            "prefill": _Histogram(STEP_BUCKETS_S),
            "decode": _Histogram(STEP_BUCKETS_S),
        }
        self.batch_size = _Histogram(BATCH_BUCKETS)
        self.kv_cache_bytes = 0
        self.decode_steps_queued_ahead = 0
        self.device_busy_s = 0.0
        self.device_steps = 0
        self.device_idle_s = 0.0
        self.device_idle_gaps = 0

    def set_queues(self, running: int, waiting: int) -> None:
        with self._lock:
            self.running, self.waiting = running, waiting

    def observe_step(self, phase: str, seconds: float, rows: int, new_tokens: int) -> None:
        with self._lock:
            self.step_seconds[phase].observe(seconds)
            self.generation_tokens += new_tokens
            if phase == "decode":
                self.batch_size.observe(rows)

    def decode_step_queued_ahead(self) -> None:
        with self._lock:
            self.decode_steps_queued_ahead += 1

    def observe_device_step(self, busy_s: float, idle_s: float | None) -> None:
        """A decode step's device time, and the device's idle time since the decode step
        before it (None where other work came between them)."""
        with self._lock:
            self.device_busy_s += busy_s
            self.device_steps += 1
            if idle_s is not None:
                self.device_idle_s += idle_s
                self.device_idle_gaps += 1

    def add_prompt_tokens(self, n: int) -> None:
        with self._lock:
            self.prompt_tokens += n

    def request_finished(self, reason: str) -> None:
        with self._lock:
            self.finished[reason] = self.finished.get(reason, 0) + 1

    def set_kv_cache_bytes(self, n: int) -> None:
        with self._lock:
            self.kv_cache_bytes = n

    def set_gauge(self, name: str, help_text: str, value: float) -> None:
        """An engine's own gauge, rendered after the common metrics."""
        with self._lock:
            self._gauges[name] = (help_text, value)

    def render(self) -> str:
        lines: list[str] = []

        def metric(
            name: str, kind: str, help_text: str, samples: list[tuple[dict[str, str], float]]
        ) -> None:
            full = f"{self.prefix}_{name}"
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} {kind}")
            for labels, value in samples:
                lines.append(f"{full}{_labels({**self._base, **labels})} {_num(value)}")

        def histogram(name: str, help_text: str, hists: dict[str, _Histogram], label: str) -> None:
            full = f"{self.prefix}_{name}"
            lines.append(f"# HELP {full} {help_text}")
            lines.append(f"# TYPE {full} histogram")
            for key, h in hists.items():
                extra = {label: key} if label else {}
                for bound, count in zip(h.buckets, h.counts, strict=True):
                    le = {**self._base, **extra, "le": _num(bound)}
                    lines.append(f"{full}_bucket{_labels(le)} {count}")
                lines.append(f"{full}_bucket{_labels({**self._base, **extra, 'le': '+Inf'})} {h.n}")
                lines.append(f"{full}_sum{_labels({**self._base, **extra})} {_num(h.total)}")
                lines.append(f"{full}_count{_labels({**self._base, **extra})} {h.n}")

        with self._lock:
            metric(
                "requests_running", "gauge", "Requests in the running batch.", [({}, self.running)]
            )
            metric(
                "requests_waiting",
                "gauge",
                "Requests waiting to join the batch.",
                [({}, self.waiting)],
            )
            metric(
                "prompt_tokens_total",
                "counter",
                "Prompt tokens prefilled.",
                [({}, self.prompt_tokens)],
            )
            metric(
                "generation_tokens_total",
                "counter",
                "Tokens generated.",
                [({}, self.generation_tokens)],
            )
            metric(
                "requests_finished_total",
                "counter",
                "Requests finished, by reason.",
                [({"finished_reason": k}, v) for k, v in sorted(self.finished.items())],
            )
            metric(
                "decode_steps_queued_ahead_total",
                "counter",
                "Decode steps queued on the device before the previous step's tokens were read "
                "(--async-decode).",
                [({}, self.decode_steps_queued_ahead)],
            )
            metric(
                "decode_device_seconds_total",
                "counter",
                "Device time of decode steps (CUDA events around inputs, step and token choice).",
                [({}, self.device_busy_s)],
            )
            metric(
                "decode_device_steps_total",
                "counter",
                "Decode steps timed on the device.",
                [({}, self.device_steps)],
            )
            metric(
                "decode_device_idle_seconds_total",
                "counter",
                "Device idle time between two decode steps with nothing queued between them: "
                "where the host, not the device, set the pace.",
                [({}, self.device_idle_s)],
            )
            metric(
                "decode_device_idle_gaps_total",
                "counter",
                "Gaps counted in decode_device_idle_seconds_total.",
                [({}, self.device_idle_gaps)],
            )
            metric(
                "kv_cache_bytes",
                "gauge",
                "Bytes held by the KV cache pools.",
                [({}, self.kv_cache_bytes)],
            )
            histogram(
                "step_seconds", "Wall time of one model step, by phase.", self.step_seconds, "phase"
            )
            histogram("decode_batch_size", "Rows in one decode step.", {"": self.batch_size}, "")
            for name, (help_text, value) in sorted(self._gauges.items()):
                metric(name, "gauge", help_text, [({}, value)])
        return "\n".join(lines) + "\n"
