"""The JAX engine's model runner: loading (random, folder or hub id), the bucket ladder,
compiling every bucket before serving, and the two steps with the token choice.

Shapes are fixed by buckets so each program compiles once: a prefill chunk is padded to
the smallest prompt bucket that holds it and reads the smallest KV bucket that holds its
last position; a decode step takes the running slots padded to the smallest batch bucket
that holds them (padding rows write nothing) and reads the smallest KV bucket that holds
the longest running sequence. `compile_all` builds every (prompt, KV) and (batch, KV)
pair ahead of time, so no request ever waits for XLA.

The greedy choice (with each row's banned ids) happens on the device inside the decode
program; sampled rows (temperature > 0) are drawn on the host from their logits with the
request's own numpy generator, seeded when the request gives a seed. When every running
row is greedy, `decode_steps` runs `steps` decode steps in one device call (a loop on the
device that feeds each step's tokens to the next), so the host's cost of a call (argument
handling, launching the program, waiting for its tokens) is paid once per `steps` tokens;
`start_greedy` queues such a call without waiting for it, fed the tokens of the call
before it on the device, so the scheduler can prepare one call while another runs.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from transformers import AutoTokenizer, PreTrainedTokenizerBase

from engines.jax import model as gemma
from engines.jax.config import ATTENTION_CHOICES
from engines.serving.random_models import DEFAULT_MAX_MODEL_LEN, RANDOM_MODELS, RANDOM_PREFIX
from engines.serving.requests import SamplingParams
from engines.serving.tokenizer import build_byte_tokenizer, generation_ids, stop_token_ids

log = logging.getLogger(__name__)

BANNED_PER_ROW = 8  # banned ids a row may have for the on-device greedy choice
# A decode program has at least 2 rows: XLA's GPU compiler rewrites a dot whose one side
# is a vector (one row) and whose operands hold under 10M elements into multiply + reduce
# fusions, which read a weight at a third to a half of the bandwidth its GEMM kernels
# reach (profiled on an H200: benchmarks/records/2026-12-02-h200-jax-decode.md).
MIN_DECODE_ROWS = 2
RANDOM_STD = 0.05  # as the PyTorch engine's random models: text varies with the context

DTYPES = {
    "float32": jnp.float32,
    "fp32": jnp.float32,
    "bfloat16": jnp.bfloat16,
    "bf16": jnp.bfloat16,
    "float16": jnp.float16,
    "fp16": jnp.float16,
    "half": jnp.float16,
}


def resolve_device(spec: str) -> jax.Device:
    """`auto`: the first GPU when JAX has one, else the CPU."""
    if spec == "auto":
        return jax.devices()[0]
    kind, _, index = spec.partition(":")
    if kind not in ("cpu", "cuda", "gpu"):
        raise ValueError(f"--device: unknown device {spec!r}; use auto, cpu, cuda or cuda:N")
    try:
        devices = jax.devices("cpu" if kind == "cpu" else "gpu")
    except RuntimeError as e:
        raise ValueError(f"--device {spec}: JAX has no such backend ({e})") from None
    return devices[int(index or 0)]


def _compute_capability(device: jax.Device) -> int:
    return int(str(getattr(device, "compute_capability", "8.0")).split(".")[0])


def resolve_dtype(spec: str, device: jax.Device) -> Any:
    """`auto`: bf16 on sm_80+, fp16 on older GPUs (sm_75 has no bf16 datapath), fp32 on CPU."""
    if spec == "auto":
        if device.platform == "gpu":
            return jnp.bfloat16 if _compute_capability(device) >= 8 else jnp.float16
        return jnp.float32
    if spec not in DTYPES:
        raise ValueError(f"--dtype: unknown dtype {spec!r}; use auto or one of {sorted(DTYPES)}")
    return DTYPES[spec]


def resolve_attention(spec: str, device: jax.Device) -> str:
    """`--decode-attention` as `model.decode` takes it: `auto` is the Pallas kernel on an
    sm_80+ GPU and XLA's kernels elsewhere; `pallas` on a CPU runs the kernel in the
    interpreter."""
    if spec not in ATTENTION_CHOICES:
        raise ValueError(f"--decode-attention: {spec!r}; use one of {', '.join(ATTENTION_CHOICES)}")
    if spec == "auto":
        # The kernel's tiles take 75-83 KB of shared memory on an H200, past the 64 KB a
        # Turing block may have (the T4G of seed 002's G5g): sm_75 keeps XLA's kernels.
        gpu = device.platform == "gpu" and _compute_capability(device) >= 8
        spec = "pallas" if gpu else "xla"
    if spec == "pallas" and device.platform != "gpu":
        return "pallas-interpret"
    return spec


def ladder(max_len: int, smallest: int) -> list[int]:
    """Powers of two from `smallest` up to and including `max_len`."""
    out, size = [], smallest
    while size < max_len:
        out.append(size)
        size *= 2
    return [*out, max_len]


@dataclass
class LoadedGemma:
    name: str
    spec: gemma.GemmaSpec
    params: gemma.Params
    tokenizer: PreTrainedTokenizerBase
    device: jax.Device
    dtype: Any
    max_model_len: int
    eos_token_ids: list[int] = field(default_factory=list)
    output_ids: list[int] | None = None


def _folder_eos(folder: Path, tokenizer: PreTrainedTokenizerBase) -> list[int]:
    import json

    ids: list[int] = []
    gen = folder / "generation_config.json"
    candidates: list[Any] = []
    if gen.exists():
        candidates.append(json.loads(gen.read_text()).get("eos_token_id"))
    candidates.append(tokenizer.eos_token_id)
    for c in candidates:
        for i in c if isinstance(c, list) else [c]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def load(
    spec: str,
    *,
    dtype: str,
    device: str,
    seed: int,
    max_model_len: int | None,
    served_name: str | None,
) -> LoadedGemma:
    """`random:<name>`, a local Hugging Face folder, or a hub id, on the device."""
    dev = resolve_device(device)
    jdtype = resolve_dtype(dtype, dev)
    output_ids: list[int] | None = None
    with jax.default_device(dev):
        if spec.startswith(RANDOM_PREFIX):
            name = spec.removeprefix(RANDOM_PREFIX)
            if name not in RANDOM_MODELS:
                known = ", ".join(f"{RANDOM_PREFIX}{n}" for n in RANDOM_MODELS)
                raise ValueError(f"--model: unknown random model {spec}; known: {known}")
            random_spec = RANDOM_MODELS[name]
            byte_tokenizer = build_byte_tokenizer()
            tokenizer: PreTrainedTokenizerBase = byte_tokenizer
            mspec = gemma.spec_from_config(random_spec.build_config(tokenizer))
            on_host = dev.platform == "cpu"
            params = gemma.random_params(mspec, jdtype, seed, RANDOM_STD, on_host)
            native_len = random_spec.max_model_len
            eos = stop_token_ids(byte_tokenizer)
            output_ids = generation_ids(byte_tokenizer)
        else:
            folder = Path(spec).expanduser()
            if not folder.exists():
                from huggingface_hub import snapshot_download

                patterns = ["*.json", "*.safetensors", "tokenizer*", "*.model", "*.jinja"]
                folder = Path(snapshot_download(spec, allow_patterns=patterns))
            config = gemma.read_config(folder)
            mspec = gemma.spec_from_config(config)
            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            params = gemma.load_params(folder, mspec, jdtype)
            native_len = min(mspec.max_positions, DEFAULT_MAX_MODEL_LEN)
            eos = _folder_eos(folder, tokenizer)
    limit = native_len if max_model_len is None else max_model_len
    if limit > max(native_len, mspec.max_positions):
        raise ValueError(f"--max-model-len {limit} exceeds the model's {native_len} positions")
    log.info(
        "loaded %s: Gemma 4 text, %.1fM params, %s on %s, max_model_len %d, eos %s",
        served_name or spec,
        gemma.param_count(params) / 1e6,
        jnp.dtype(jdtype).name,
        dev,
        limit,
        eos,
    )
    return LoadedGemma(
        name=served_name or spec,
        spec=mspec,
        params=params,
        tokenizer=tokenizer,
        device=dev,
        dtype=jdtype,
        max_model_len=limit,
        eos_token_ids=eos,
        output_ids=output_ids,
    )


def _choose_greedy(logits: jax.Array, banned: jax.Array) -> jax.Array:
    rows = jnp.arange(logits.shape[0])[:, None]
    return jnp.argmax(logits.at[rows, banned].set(-jnp.inf, mode="drop"), axis=-1)


def greedy_steps(
    p: Any,
    cache: Any,
    tokens: jax.Array,
    positions: jax.Array,
    slots: jax.Array,
    bias: jax.Array,
    always: jax.Array,
    until: jax.Array,
    min_left: jax.Array,
    *,
    spec: gemma.GemmaSpec,
    kv_len: int,
    steps: int,
    attention: str = "xla",
) -> tuple[Any, jax.Array]:
    """`steps` greedy decode steps, each fed the tokens of the one before: tokens
    [steps, rows]. Row r bans `always[r]` at every step and `until[r]` at its first
    `min_left[r]` steps (stop ids before `min_tokens`); padding rows (position -1) stay
    padding."""
    active = positions >= 0

    def body(j: jax.Array, carry: tuple[Any, jax.Array, jax.Array]) -> Any:
        cache, fed, out = carry
        at = jnp.where(active, positions + j, -1)
        cache, logits = gemma.decode(p, spec, cache, fed, at, slots, bias, kv_len, attention)
        gated = jnp.where((j < min_left)[:, None], until, spec.vocab_size)
        chosen = _choose_greedy(logits, jnp.concatenate([always, gated], axis=1))
        chosen = chosen.astype(jnp.int32)
        return cache, chosen, out.at[j].set(chosen)

    out = jnp.zeros((steps, tokens.shape[0]), jnp.int32)
    cache, _, out = jax.lax.fori_loop(0, steps, body, (cache, tokens, out))
    return cache, out


def sample_host(
    logits: np.ndarray, params: SamplingParams, banned: Sequence[int], rng: np.random.Generator
) -> int:
    """One token from one row of logits (float32) on the host: temperature, top-k, top-p."""
    row = logits.astype(np.float64)
    if banned:
        row[list(banned)] = -np.inf
    if params.greedy:
        return int(np.argmax(row))
    row = row / params.temperature
    if 0 < params.top_k < row.shape[0]:
        kth = np.partition(row, -params.top_k)[-params.top_k]
        row[row < kth] = -np.inf
    row = np.exp(row - row.max())
    probs = row / row.sum()
    if params.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        sorted_probs = probs[order]
        drop = np.cumsum(sorted_probs) - sorted_probs >= params.top_p
        sorted_probs[drop] = 0.0
        probs = np.zeros_like(probs)
        probs[order] = sorted_probs
        probs /= probs.sum()
    return int(rng.choice(probs.shape[0], p=probs))


class JaxRunner:
    """The compiled programs over one model and its slot cache."""

    def __init__(
        self,
        loaded: LoadedGemma,
        *,
        num_slots: int,
        prefill_buckets: Sequence[int],
        kv_buckets: Sequence[int],
        batch_buckets: Sequence[int] = (1, 8),
        decode_steps: int = 1,
        decode_attention: str = "auto",
    ) -> None:
        self.loaded = loaded
        self.attention = resolve_attention(decode_attention, loaded.device)
        self.spec = loaded.spec
        self.num_slots = num_slots
        self.max_len = loaded.max_model_len
        self.prefill_buckets = sorted(set(prefill_buckets))
        self.kv_buckets = sorted({*(b for b in kv_buckets if b < self.max_len), self.max_len})
        if self.prefill_buckets[-1] > self.kv_buckets[-1]:
            raise ValueError("--prefill-buckets: a prompt bucket is longer than --max-model-len")
        self.chunk = self.prefill_buckets[-1]
        sizes = [*(b for b in batch_buckets if b < num_slots), num_slots]
        self.batch_buckets = sorted({max(b, MIN_DECODE_ROWS) for b in sizes})
        self.steps = max(1, decode_steps)
        dev = loaded.device
        bias = np.zeros(self.spec.vocab_size, np.float32)
        if loaded.output_ids is not None:
            bias[:] = -np.inf
            bias[loaded.output_ids] = 0.0
        self.bias = jax.device_put(jnp.asarray(bias), dev)
        self.cache = jax.device_put(
            gemma.new_cache(self.spec, num_slots, self.max_len, loaded.dtype), dev
        )
        self._prefill: dict[tuple[int, int], Callable[..., Any]] = {}
        self._decode: dict[tuple[int, int], Callable[..., Any]] = {}
        self._steps: dict[tuple[int, int], Callable[..., Any]] = {}
        self.compile_s = 0.0

    # -- compiling ----------------------------------------------------------------

    def programs(self) -> list[tuple[str, int, int]]:
        """Every program the ladder needs: ("prefill", T, K) for K >= T, ("decode", B, K),
        and ("steps", B, K) when several greedy steps run in one call."""
        out = [("decode", b, k) for b in self.batch_buckets for k in self.kv_buckets]
        if self.steps > 1:
            out += [("steps", b, k) for b in self.batch_buckets for k in self.kv_buckets]
        out += [
            ("prefill", t, k) for t in self.prefill_buckets for k in self.kv_buckets if k >= t
        ]
        return out

    def compile_program(self, kind: str, t: int, k: int) -> Any:
        """One program of the ladder, compiled (not kept: `compile_all` keeps them)."""
        spec, params = self.spec, self.loaded.params
        i32 = jnp.int32
        if kind == "decode":

            def step(
                p: Any, cache: Any, tokens: Any, positions: Any, slots: Any, bias: Any, banned: Any
            ) -> Any:
                cache, logits = gemma.decode(
                    p, spec, cache, tokens, positions, slots, bias, k, self.attention
                )
                return cache, logits, _choose_greedy(logits, banned)

            rows = jnp.zeros(t, i32)
            banned = jnp.zeros((t, BANNED_PER_ROW), i32)
            args = (params, self.cache, rows, rows, rows, self.bias, banned)
            return jax.jit(step, donate_argnums=(1,)).lower(*args).compile()
        if kind == "steps":
            rows = jnp.zeros(t, i32)
            banned = jnp.zeros((t, BANNED_PER_ROW), i32)
            run = functools.partial(
                greedy_steps, spec=spec, kv_len=k, steps=self.steps, attention=self.attention
            )
            lowered = jax.jit(run, donate_argnums=(1,)).lower(
                params, self.cache, rows, rows, rows, self.bias, banned, banned, rows
            )
            return lowered.compile()

        def fill(
            p: Any, cache: Any, tokens: Any, start: Any, length: Any, slot: Any, bias: Any
        ) -> Any:
            return gemma.prefill(p, spec, cache, tokens, start, length, slot, bias, k)

        scalar = jnp.zeros((), i32)
        args = (params, self.cache, jnp.zeros(t, i32), scalar, scalar, scalar, self.bias)
        return jax.jit(fill, donate_argnums=(1,)).lower(*args).compile()

    def compile_all(
        self, threads: int = 2, progress: Callable[[int, int], None] | None = None
    ) -> int:
        """Compile every bucket; returns how many. `progress(done, total)` after each."""
        todo = self.programs()
        t0 = time.monotonic()
        done = 0
        with jax.default_device(self.loaded.device), ThreadPoolExecutor(max(1, threads)) as pool:
            futures = {pool.submit(self.compile_program, *p): p for p in todo}
            for future in futures:
                kind, t, k = futures[future]
                compiled = future.result()
                {"decode": self._decode, "steps": self._steps, "prefill": self._prefill}[kind][
                    (t, k)
                ] = compiled
                done += 1
                if progress is not None:
                    progress(done, len(todo))
        self.compile_s = time.monotonic() - t0
        return done

    @property
    def compiled(self) -> int:
        return len(self._decode) + len(self._steps) + len(self._prefill)

    # -- steps --------------------------------------------------------------------

    def _kv_bucket(self, needed: int) -> int:
        for k in self.kv_buckets:
            if k >= needed:
                return k
        raise ValueError(f"{needed} positions exceed the largest KV bucket {self.kv_buckets[-1]}")

    def prefill(self, slot: int, tokens: Sequence[int], start: int) -> jax.Array:
        """Prefill one chunk (at most `chunk` tokens) at `start`; the last token's logits."""
        n = len(tokens)
        t = next(b for b in self.prefill_buckets if b >= n)
        k = self._kv_bucket(max(start + n, t))
        program = self._prefill[(t, k)]
        padded = np.zeros(t, np.int32)
        padded[:n] = tokens
        self.cache, logits = program(
            self.loaded.params,
            self.cache,
            jnp.asarray(padded),
            np.int32(start),
            np.int32(n),
            np.int32(slot),
            self.bias,
        )
        return logits

    def _rows(
        self, slots: Sequence[int], tokens: Sequence[int], positions: Sequence[int]
    ) -> tuple[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """The batch bucket for these rows, and their tokens, positions and slots (the
        decode programs' order) padded to it (a padding row: position -1, the slot past
        the last)."""
        n = len(slots)
        b = next(size for size in self.batch_buckets if size >= n)
        pad_slots = np.full(b, self.num_slots, np.int32)
        pad_slots[:n] = slots
        pad_tokens = np.zeros(b, np.int32)
        pad_tokens[:n] = tokens
        pad_positions = np.full(b, -1, np.int32)
        pad_positions[:n] = positions
        return b, (pad_tokens, pad_positions, pad_slots)

    def _bans(self, rows: int, banned: Sequence[Sequence[int]]) -> np.ndarray:
        """Each row's banned ids, padded with an id past the vocabulary (dropped)."""
        pad = np.full((rows, BANNED_PER_ROW), self.spec.vocab_size, np.int32)
        for row, ids in enumerate(banned):
            pad[row, : len(ids)] = ids[:BANNED_PER_ROW]
        return pad

    def decode(
        self,
        slots: Sequence[int],
        tokens: Sequence[int],
        positions: Sequence[int],
        banned: Sequence[Sequence[int]],
    ) -> tuple[jax.Array, np.ndarray]:
        """One step for the running `slots` (their last tokens, positions and banned ids):
        logits [rows, V] (on the device, padded rows at the end) and each row's greedy
        choice with its banned ids masked (on the host)."""
        b, rows = self._rows(slots, tokens, positions)
        k = self._kv_bucket(max(positions) + 1)
        program = self._decode[(b, k)]
        self.cache, logits, greedy = program(
            self.loaded.params, self.cache, *rows, self.bias, self._bans(b, banned)
        )
        return logits, np.asarray(greedy)[: len(slots)]

    def decode_greedy(
        self,
        slots: Sequence[int],
        tokens: Sequence[int],
        positions: Sequence[int],
        always: Sequence[Sequence[int]],
        until: Sequence[Sequence[int]],
        min_left: Sequence[int],
    ) -> np.ndarray:
        """`steps` greedy steps for the running `slots` in one call (see `greedy_steps`):
        tokens [steps, len(slots)] on the host. A row may pass its `max_tokens` or the
        KV's end inside the call: those tokens are the caller's to drop."""
        return self.start_greedy(slots, tokens, positions, always, until, min_left).tokens()

    def start_greedy(
        self,
        slots: Sequence[int],
        tokens: Sequence[int] | jax.Array,
        positions: Sequence[int],
        always: Sequence[Sequence[int]],
        until: Sequence[Sequence[int]],
        min_left: Sequence[int],
    ) -> PendingSteps:
        """`decode_greedy`'s call, queued on the device and not waited for. `tokens` may be
        an earlier call's `PendingSteps.last` for the same slots: the call then follows
        that one on the device, so the host prepares it while the device runs the other."""
        fed: tuple[Any, ...]
        if isinstance(tokens, jax.Array):
            b, rows = self._rows(slots, [0] * len(slots), positions)
            fed = (tokens, *rows[1:])
        else:
            b, fed = self._rows(slots, tokens, positions)
        k = self._kv_bucket(min(max(positions) + self.steps, self.max_len))
        pad_left = np.zeros(b, np.int32)
        pad_left[: len(slots)] = min_left
        bans = (self._bans(b, always), self._bans(b, until))
        program = self._steps[(b, k)]
        self.cache, out = program(self.loaded.params, self.cache, *fed, self.bias, *bans, pad_left)
        return PendingSteps(out, len(slots))


@dataclass(frozen=True)
class PendingSteps:
    """A queued `greedy_steps` call: its tokens [steps, padded rows] on the device, of
    which the first `rows` columns are real."""

    out: jax.Array
    rows: int

    @property
    def last(self) -> jax.Array:
        """Every row's last token, still on the device (to feed the next call)."""
        return self.out[-1]

    def tokens(self) -> np.ndarray:
        """Waits for the call: its tokens [steps, rows] on the host."""
        return np.asarray(self.out)[:, : self.rows]


@functools.lru_cache(maxsize=1)
def backend_versions() -> dict[str, str]:
    import jaxlib

    return {"jax": jax.__version__, "jaxlib": jaxlib.__version__}
