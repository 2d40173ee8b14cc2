"""What `bench plan` expects each step to take: the seeds' measured timings, each named.

Every figure here was measured by a seed on the GPU it is keyed by (seed 000: one L4 on a
g6.4xlarge; seed 001: one Tesla T4; seed 002: boot and install on a g5g) or is an assumption,
and says which in its source. A GPU the seeds never ran takes the L4's figures, and the plan
says so. Figures are per engine (the recipes' names) and, where the drafter changed them, per
drafter arm; throughput at a load level is interpolated between the seeds' 1, 8 and 64
request measurements (log of the level), for the shape whose output share is nearest.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = [
    "BFCL_QUESTIONS",
    "BOOT",
    "GSM8K_QUESTIONS",
    "UPLOAD",
    "Prior",
    "bfcl_per_question",
    "gsm8k_per_question",
    "install",
    "ready",
    "single_tok_s",
    "sweep_tok_s",
]

L4 = "NVIDIA L4"
T4 = "NVIDIA T4"
GSM8K_QUESTIONS = 1319  # the test split the seeds asked in full
BFCL_QUESTIONS = 400  # BFCL simple (Python), as the seeds


@dataclass(frozen=True, slots=True)
class Prior:
    """A duration or rate with where it comes from."""

    value: float
    source: str


BOOT = Prior(
    180.0,
    "assumption: DLAMI boot and the agent's own install (seed 002: a whole wheel install "
    "done a median 113.55 s after RunInstances on a g5g)",
)
UPLOAD = Prior(60.0, "assumption: the shard's tarball to S3 and power-off")

_INSTALL: Mapping[str, Prior] = {
    "llamacpp": Prior(492.0, "seed 000 setup.sh: llamacpp 18:48:44-18:56:56 (CMake, CUDA)"),
    "vllm": Prior(142.0, "seed 000 setup.sh: vllm 18:56:56-18:59:18 (pip wheel)"),
    "sglang": Prior(
        142.0,
        "seed 000: vLLM's 142 s (SGLang took 39 s after vLLM had pulled the shared wheels; "
        "here it has its own venv)",
    ),
    "mistralrs": Prior(
        1800.0, "assumption: cargo build with CUDA, 30 min (the seeds give no time)"
    ),
    "pytorch": Prior(114.0, "seed 002: PyTorch from wheels, a median 113.55 s"),
    "litert-lm": Prior(60.0, "assumption: one small wheel and its deps, 1 min (not timed)"),
}
_INSTALL_UNKNOWN = Prior(600.0, "assumption: 10 min (no seed timing for this engine)")

# Ready seconds: the largest of an engine's arms in the seeds' probe tables.
_READY: Mapping[tuple[str, str], Prior] = {
    (L4, "llamacpp"): Prior(6.1, "seed 000 probe table: llama ready 6.1 s"),
    (L4, "vllm"): Prior(167.3, "seed 000 probe table: vllm ready 167.3 s"),
    (L4, "sglang"): Prior(307.2, "seed 000 probe table: sglang ready 307.2 s"),
    (L4, "mistralrs"): Prior(24.1, "seed 000 probe table: mistralrs ready 24.1 s"),
    (L4, "pytorch"): Prior(236.2, "seed 000 probe table: pytorch ready 236.2 s"),
    (L4, "litert-lm"): Prior(9.4, "seed 000 probe table: litert-int248 ready 9.4 s"),
    (T4, "llamacpp"): Prior(8.3, "seed 001 probe table: llama ready 8.3 s"),
    (T4, "vllm"): Prior(299.8, "seed 001 probe table: vllm-d3 ready 299.8 s"),
    (T4, "sglang"): Prior(149.4, "seed 001 probe table: sglang4 ready 149.4 s"),
    (T4, "mistralrs"): Prior(46.2, "seed 001 probe table: mistralrs ready 46.2 s"),
    (T4, "pytorch"): Prior(94.3, "seed 001 probe table: pytorch ready 94.3 s"),
    (T4, "litert-lm"): Prior(20.6, "seed 001 probe table: litert-int248 ready 20.6 s"),
}
_READY_UNKNOWN = Prior(300.0, "assumption: 5 min (no seed timing for this engine)")

# One request, end to end tok/s (the seeds' probe tables); key: (gpu, engine, drafter arm).
_SINGLE: Mapping[tuple[str, str, bool], float] = {
    (L4, "llamacpp", False): 135.7, (L4, "llamacpp", True): 207.7,
    (L4, "vllm", False): 140.4, (L4, "vllm", True): 275.3,
    (L4, "sglang", False): 136.5, (L4, "sglang", True): 189.6,
    (L4, "mistralrs", False): 144.6, (L4, "pytorch", False): 134.7,
    (L4, "litert-lm", False): 98.4, (L4, "litert-lm", True): 112.8,
    (T4, "llamacpp", False): 104.8, (T4, "llamacpp", True): 123.5,
    (T4, "vllm", False): 108.4, (T4, "vllm", True): 193.0,
    (T4, "sglang", False): 97.8, (T4, "sglang", True): 70.7,
    (T4, "mistralrs", False): 113.5, (T4, "pytorch", False): 109.8,
    (T4, "litert-lm", False): 44.6, (T4, "litert-lm", True): 43.7,
}  # fmt: skip
_SEED_OF = {L4: "seed 000 (L4)", T4: "seed 001 (T4)"}

# Aggregate output tok/s at 1, 8 and 64 requests, no drafter: (gpu, engine, long replies?).
# Long replies: 128 in / 512 out; long prompts: 512 in / 128 out.
_SWEEP: Mapping[tuple[str, str, bool], tuple[float, float, float]] = {
    (L4, "vllm", True): (138.8, 991.0, 3715.7), (L4, "vllm", False): (132.8, 738.3, 1593.7),
    (L4, "sglang", True): (134.6, 967.4, 2967.1), (L4, "sglang", False): (129.6, 708.3, 1373.0),
    (L4, "mistralrs", True): (133.9, 626.5, 1825.2),
    (L4, "mistralrs", False): (133.1, 591.2, 1132.0),
    (L4, "llamacpp", True): (133.8, 597.5, 1056.3),
    (L4, "llamacpp", False): (125.4, 428.1, 630.8),
    (T4, "vllm", True): (101.5, 491.9, 871.8), (T4, "vllm", False): (85.4, 236.5, 295.3),
    (T4, "sglang", True): (88.2, 479.3, 908.6), (T4, "sglang", False): (65.3, 152.3, 175.0),
    (T4, "mistralrs", True): (96.9, 238.6, 237.3),
    (T4, "mistralrs", False): (97.2, 218.9, 196.7),
    (T4, "llamacpp", True): (86.9, 240.2, 381.3), (T4, "llamacpp", False): (91.8, 204.2, 281.9),
}  # fmt: skip

# GSM8K, all 1,319 questions, seconds: (gpu, engine, drafter arm).
_GSM8K_S: Mapping[tuple[str, str, bool], float] = {
    (L4, "vllm", False): 3918, (L4, "vllm", True): 1270,
    (L4, "sglang", False): 4035, (L4, "sglang", True): 1956,
    (L4, "llamacpp", False): 3971, (L4, "llamacpp", True): 2007,
    (L4, "mistralrs", False): 3918, (L4, "pytorch", False): 3991,
    (L4, "litert-lm", False): 5018,
    (T4, "llamacpp", False): 1.50 * 3600, (T4, "llamacpp", True): 1.15 * 3600,
    (T4, "vllm", False): 1.49 * 3600, (T4, "vllm", True): 0.61 * 3600,
    (T4, "mistralrs", False): 1.49 * 3600, (T4, "pytorch", False): 1.41 * 3600,
    (T4, "sglang", False): 1.66 * 3600, (T4, "litert-lm", False): 2.74 * 3600,
}  # fmt: skip
_GSM8K_TABLE = {L4: "seed 000 GSM8K time table", T4: "seed 001 'GSM8K hours' column"}
# BFCL replies are one function call: a quarter of a GSM8K reply's time is assumed.
_BFCL_SHARE = 0.25


def _gpu(gpu: str) -> tuple[str, str]:
    """The seeds' GPU whose figures stand for `gpu`, and how the source says so."""
    if gpu in _SEED_OF:
        return gpu, ""
    if gpu == "NVIDIA T4G":
        return T4, "; the T4's figure (the T4G is the same Turing chip)"
    return L4, f"; {gpu} never ran in the seeds: the L4's figure"


def install(engine: str) -> Prior:
    return _INSTALL.get(engine, _INSTALL_UNKNOWN)


def ready(gpu: str, engine: str) -> Prior:
    seed_gpu, note = _gpu(gpu)
    found = _READY.get((seed_gpu, engine))
    return Prior(found.value, found.source + note) if found else _READY_UNKNOWN


def _lookup(
    table: Mapping[tuple[str, str, bool], float], gpu: str, engine: str, drafter: bool
) -> tuple[float, str] | None:
    seed_gpu, note = _gpu(gpu)
    if (seed_gpu, engine, drafter) in table:
        return table[(seed_gpu, engine, drafter)], note
    if (seed_gpu, engine, False) in table:
        return table[(seed_gpu, engine, False)], note + "; the no-drafter figure"
    return None


def single_tok_s(gpu: str, engine: str, drafter: bool) -> Prior:
    """One request's end-to-end output tok/s."""
    found = _lookup(_SINGLE, gpu, engine, drafter)
    if found is None:
        return Prior(100.0, "assumption: 100 tok/s (no seed figure for this engine)")
    value, note = found
    seed_gpu, _ = _gpu(gpu)
    return Prior(value, f"{_SEED_OF[seed_gpu]} probe table: {value:g} tok/s{note}")


def sweep_tok_s(gpu: str, engine: str, level: int, long_replies: bool) -> Prior:
    """Aggregate output tok/s at `level` requests at once, no drafter (a drafter arm is
    planned at its engine's no-drafter rate: slower, so the plan errs long).

    An engine the seeds did not sweep (PyTorch and LiteRT-LM served one request at a time)
    is planned at its one-request rate at every level.
    """
    seed_gpu, note = _gpu(gpu)
    points = _SWEEP.get((seed_gpu, engine, long_replies))
    shape = "128/512" if long_replies else "512/128"
    if points is None:
        one = single_tok_s(gpu, engine, False)
        return Prior(one.value, f"one request at a time: {one.source}")
    at = ((1, points[0]), (8, points[1]), (64, points[2]))
    x = math.log2(max(1, level))
    if level <= 8:
        (l0, v0), (l1, v1) = at[0], at[1]
    else:
        (l0, v0), (l1, v1) = at[1], at[2]
    t = min(1.0, (x - math.log2(l0)) / (math.log2(l1) - math.log2(l0)))
    value = v0 + (v1 - v0) * t
    source = f"{_SEED_OF[seed_gpu]} sweep table {shape} at 1/8/64, interpolated{note}"
    return Prior(value, source)


def gsm8k_per_question(gpu: str, engine: str, drafter: bool) -> Prior:
    found = _lookup(_GSM8K_S, gpu, engine, drafter)
    if found is None:
        return Prior(4000.0 / GSM8K_QUESTIONS, "assumption: 4,000 s per 1,319 questions")
    value, note = found
    seed_gpu, _ = _gpu(gpu)
    return Prior(
        value / GSM8K_QUESTIONS, f"{_GSM8K_TABLE[seed_gpu]}: {value:,.0f} s / 1,319{note}"
    )


def bfcl_per_question(gpu: str, engine: str, drafter: bool) -> Prior:
    gsm8k = gsm8k_per_question(gpu, engine, drafter)
    return Prior(
        gsm8k.value * _BFCL_SHARE,
        f"assumption: 1/4 of a GSM8K question, not timed by the seeds ({gsm8k.source})",
    )
