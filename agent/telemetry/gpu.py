"""NVML side of telemetry: find the GPUs, probe once what each can report, read them.

Everything NVML-specific lives here; the sampler thread only calls `open_gpus` and
`GpuDevice.read`. The NVML module is passed in (the real `pynvml` from nvidia-ml-py, or a
stand-in with the same functions, constants and `NVMLError` classes), so tests can exercise
the error paths without a GPU.

Hygiene (after AIPerf's pynvml collector): each reading is probed once per device at start;
one that NVML does not support there is recorded as unsupported, warned about once, and
never called again (its column stays empty). A read that fails at run time leaves its cell
empty, is counted, and is warned about once per device and reading; a GPU that NVML
reports lost is dropped. Nothing here raises into the run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from contract.telemetry import GpuDeviceInfo
from contract.telemetry_samples import GpuSample

__all__ = ["GPU_READINGS", "GpuDevice", "GpuReading", "load_nvml", "nvml_error_code", "open_gpus"]

log = logging.getLogger(__name__)

MIB = 1024 * 1024

# NVML return codes (nvml.h) that mean "this device will never answer this call": the
# reading is dropped at probe time instead of failing on every sample.
_PERMANENT_ERROR_NAMES = (
    "NVML_ERROR_NOT_SUPPORTED",
    "NVML_ERROR_FUNCTION_NOT_FOUND",  # older driver than the binding
    "NVML_ERROR_NO_PERMISSION",
    "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
    "NVML_ERROR_DEPRECATED",
)
# Codes after which a device is gone for the rest of the run.
_LOST_ERROR_NAMES = ("NVML_ERROR_GPU_IS_LOST", "NVML_ERROR_RESET_REQUIRED")
# Codes from nvmlInit that just mean "no NVIDIA GPU here": said at INFO, not an error.
_NO_GPU_ERROR_NAMES = ("NVML_ERROR_LIBRARY_NOT_FOUND", "NVML_ERROR_DRIVER_NOT_LOADED")


def load_nvml() -> Any | None:
    """The `pynvml` module (nvidia-ml-py), or None where it is not installed.

    Importing pynvml never touches the driver; `nvmlInit` does (see `init_nvml`).
    """
    # Imported here, not at module level: hosts without NVIDIA software sample psutil only.
    try:
        import pynvml
    except (ImportError, OSError):
        return None
    return pynvml


def nvml_error_code(exc: BaseException) -> int | None:
    """The NVML return code an `NVMLError` carries (pynvml stores it as `.value`)."""
    value = getattr(exc, "value", None)
    return value if isinstance(value, int) else None


def _codes(nvml: Any, names: tuple[str, ...]) -> frozenset[int]:
    return frozenset(getattr(nvml, n) for n in names if isinstance(getattr(nvml, n, None), int))


def init_nvml(nvml: Any) -> tuple[bool, str]:
    """Call nvmlInit. Returns (ok, reason); a host with no NVIDIA driver is not an error.

    Never raises: NVML failures must not stop a run that can still sample the host.
    """
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as exc:
        code = nvml_error_code(exc)
        if code in _codes(nvml, _NO_GPU_ERROR_NAMES):
            return False, f"no NVIDIA driver ({exc})"
        return False, f"nvmlInit failed: {exc}"
    except Exception as exc:  # a broken install (ctypes, symbol errors) is still not fatal
        return False, f"nvmlInit failed: {type(exc).__name__}: {exc}"
    return True, "ok"


Reader = Callable[[Any, Any], dict[str, float | int]]


@dataclass(frozen=True)
class GpuReading:
    """One NVML query and the CSV columns it fills.

    `candidates` are (label, reader) pairs tried in order at probe time, newer API first
    and for drivers that lack it the older one; the first that answers is used from then
    on. `reader(nvml, handle)` returns the column values. `slow` readings block in the
    driver and run at the PCIe cadence only; `per_second` ones cost milliseconds a call and
    run once a second and at every job boundary.
    """

    name: str
    columns: tuple[str, ...]
    candidates: tuple[tuple[str, Reader], ...]
    slow: bool = False
    per_second: bool = False


def _utilization(nvml: Any, h: Any) -> dict[str, float | int]:
    u = nvml.nvmlDeviceGetUtilizationRates(h)
    return {"gpu_util_pct": float(u.gpu), "mem_util_pct": float(u.memory)}


def _memory_v2(nvml: Any, h: Any) -> dict[str, float | int]:
    # v2 'used' leaves out the driver's reserved memory, as nvidia-smi shows it; v1 'used'
    # (total - free) counts it, several hundred MiB more on Hopper.
    m = nvml.nvmlDeviceGetMemoryInfo(h, version=nvml.nvmlMemory_v2)
    return {"mem_used_mib": round(m.used / MIB, 1)}


def _memory_v1(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"mem_used_mib": round(nvml.nvmlDeviceGetMemoryInfo(h).used / MIB, 1)}


def _power(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"power_w": nvml.nvmlDeviceGetPowerUsage(h) / 1000.0}  # NVML reports milliwatts


def _energy(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"energy_mj": int(nvml.nvmlDeviceGetTotalEnergyConsumption(h))}


def _temperature_v(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"temp_c": float(nvml.nvmlDeviceGetTemperatureV(h, nvml.NVML_TEMPERATURE_GPU))}


def _temperature(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"temp_c": float(nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU))}


def _sm_clock(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"sm_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM))}


def _mem_clock(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"mem_clock_mhz": int(nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_MEM))}


def _event_reasons(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"throttle_reasons": int(nvml.nvmlDeviceGetCurrentClocksEventReasons(h))}


def _throttle_reasons(nvml: Any, h: Any) -> dict[str, float | int]:
    return {"throttle_reasons": int(nvml.nvmlDeviceGetCurrentClocksThrottleReasons(h))}


def _pcie(nvml: Any, h: Any) -> dict[str, float | int]:
    return {
        "pcie_rx_kb_s": int(nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_RX_BYTES)),
        "pcie_tx_kb_s": int(nvml.nvmlDeviceGetPcieThroughput(h, nvml.NVML_PCIE_UTIL_TX_BYTES)),
    }


GPU_READINGS: tuple[GpuReading, ...] = (
    GpuReading("utilization", ("gpu_util_pct", "mem_util_pct"),
               (("nvmlDeviceGetUtilizationRates", _utilization),)),
    GpuReading("memory", ("mem_used_mib",),
               (("nvmlDeviceGetMemoryInfo(v2)", _memory_v2),
                ("nvmlDeviceGetMemoryInfo", _memory_v1))),
    GpuReading("power", ("power_w",), (("nvmlDeviceGetPowerUsage", _power),)),
    # The energy counter is the costly read (milliseconds on an H200:
    # benchmarks/records/2026-11-29-h200-telemetry-check.txt); a job's energy is its
    # counter delta, so a read a second plus its boundaries suffices.
    GpuReading("energy", ("energy_mj",),
               (("nvmlDeviceGetTotalEnergyConsumption", _energy),), per_second=True),
    GpuReading("temperature", ("temp_c",),
               (("nvmlDeviceGetTemperatureV", _temperature_v),
                ("nvmlDeviceGetTemperature", _temperature))),
    GpuReading("sm_clock", ("sm_clock_mhz",), (("nvmlDeviceGetClockInfo(SM)", _sm_clock),)),
    GpuReading("mem_clock", ("mem_clock_mhz",), (("nvmlDeviceGetClockInfo(MEM)", _mem_clock),)),
    GpuReading("throttle_reasons", ("throttle_reasons",),
               (("nvmlDeviceGetCurrentClocksEventReasons", _event_reasons),
                ("nvmlDeviceGetCurrentClocksThrottleReasons", _throttle_reasons))),
    # nvmlDeviceGetPcieThroughput counts bytes over a 20 ms window inside the call (NVML
    # docs), so rx + tx block the thread ~40 ms per GPU: too long for every 100 ms pass.
    GpuReading("pcie", ("pcie_rx_kb_s", "pcie_tx_kb_s"),
               (("nvmlDeviceGetPcieThroughput", _pcie),), slow=True),
)  # fmt: skip


def _text(value: Any) -> str:
    # Old bindings return bytes, nvidia-ml-py returns str.
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


class GpuDevice:
    """One GPU: its handle, the readings it supports (probed once), warn-once bookkeeping.

    Not thread-safe: only the sampler thread reads it after `open_gpus`.
    """

    def __init__(self, nvml: Any, index: int, handle: Any) -> None:
        self._nvml = nvml
        self.index = index
        self._handle = handle
        self._permanent = _codes(nvml, _PERMANENT_ERROR_NAMES)
        self._lost_codes = _codes(nvml, _LOST_ERROR_NAMES)
        self._readers: dict[str, tuple[GpuReading, Reader]] = {}
        self._unsupported: list[str] = []
        self._warned: set[str] = set()
        self.lost = False
        self.errors = 0
        self.name = self._info("nvmlDeviceGetName", _text, f"GPU {index}")
        self.uuid = self._info("nvmlDeviceGetUUID", _text, None)
        self.memory_total_mib = self._info(
            "nvmlDeviceGetMemoryInfo", lambda m: round(m.total / MIB, 1), None
        )

    def _info(self, fn_name: str, convert: Callable[[Any], Any], default: Any) -> Any:
        try:
            return convert(getattr(self._nvml, fn_name)(self._handle))
        except Exception:  # identity fields are nice to have; sampling goes on without them
            return default

    @property
    def info(self) -> GpuDeviceInfo:
        return GpuDeviceInfo(
            index=self.index,
            name=self.name,
            uuid=self.uuid,
            memory_total_mib=self.memory_total_mib,
            unsupported=tuple(self._unsupported),
        )

    def probe(self) -> None:
        """Try every reading once; keep the first candidate that answers."""
        for reading in GPU_READINGS:
            reasons: list[str] = []
            for label, reader in reading.candidates:
                try:
                    reader(self._nvml, self._handle)
                except self._nvml.NVMLError as exc:
                    code = nvml_error_code(exc)
                    if code in self._lost_codes:
                        self._mark_lost(exc)
                        return
                    if code in self._permanent:
                        reasons.append(f"{label}: {exc}")
                        continue
                    # A transient failure at probe time: keep the reading, it may answer later.
                    self._warn_once(reading.name, f"probe {label} failed: {exc}; will retry")
                except AttributeError:
                    reasons.append(f"{label}: not in this nvidia-ml-py")
                    continue
                except Exception as exc:
                    reasons.append(f"{label}: {type(exc).__name__}: {exc}")
                    continue
                self._readers[reading.name] = (reading, reader)
                break
            else:
                self._unsupported.append(reading.name)
                log.warning(
                    "GPU %d (%s): %s not available (%s); column(s) %s left empty",
                    self.index, self.name, reading.name, "; ".join(reasons),
                    ", ".join(reading.columns),
                )  # fmt: skip

    def _warn_once(self, key: str, message: str) -> None:
        if key in self._warned:
            log.debug("GPU %d: %s", self.index, message)
            return
        self._warned.add(key)
        log.warning("GPU %d (%s): %s (warned once)", self.index, self.name, message)

    def _mark_lost(self, exc: BaseException) -> None:
        self.lost = True
        self._readers.clear()
        log.warning(
            "GPU %d (%s): NVML says %s; no longer sampled (the run goes on)",
            self.index, self.name, exc,
        )  # fmt: skip

    def read(
        self, job_id: str | None, with_slow: bool, with_per_second: bool = True
    ) -> GpuSample | None:
        """One sample of every supported reading; None once the GPU is lost."""
        if self.lost:
            return None
        unix_s = time.time()
        perf_ns = time.perf_counter_ns()
        values: dict[str, float | int] = {}
        for name, (reading, reader) in list(self._readers.items()):
            if (reading.slow and not with_slow) or (reading.per_second and not with_per_second):
                continue
            try:
                values.update(reader(self._nvml, self._handle))
            except self._nvml.NVMLError as exc:
                code = nvml_error_code(exc)
                if code in self._lost_codes:
                    self._mark_lost(exc)
                    return None
                if code in self._permanent:
                    # Supported at probe time, refused now (e.g. a mode change): stop asking.
                    del self._readers[name]
                    self._unsupported.append(name)
                    self._warn_once(name, f"{name} now unsupported ({exc}); column left empty")
                    continue
                self.errors += 1
                self._warn_once(name, f"{name} read failed: {exc}")
            except Exception as exc:  # a binding bug must not end sampling either
                self.errors += 1
                self._warn_once(name, f"{name} read failed: {type(exc).__name__}: {exc}")
        return GpuSample(
            time_unix_s=unix_s, time_perf_ns=perf_ns, job_id=job_id, gpu_index=self.index,
            # Ignored below: values maps the sample's optional NVML fields by name (a read may
            # fail).
            **values,  # type: ignore[arg-type]
        )  # fmt: skip


def open_gpus(nvml: Any) -> list[GpuDevice]:
    """Every GPU NVML can see (after a successful nvmlInit), each probed once.

    NVML ignores CUDA_VISIBLE_DEVICES, so this is every GPU of the host: the engine may use
    any of them. A GPU whose handle cannot be had is skipped with a warning.
    """
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as exc:
        log.warning("NVML: cannot count GPUs (%s); sampling the host only", exc)
        return []
    devices: list[GpuDevice] = []
    for index in range(count):
        try:
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
        except Exception as exc:
            log.warning("NVML: GPU %d has no handle (%s); not sampled", index, exc)
            continue
        device = GpuDevice(nvml, index, handle)
        device.probe()
        devices.append(device)
    return devices
