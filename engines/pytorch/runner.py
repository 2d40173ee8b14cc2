"""One model step on the engine's slot KV cache: the prefill of one sequence (or a chunk of
it) and the decode of a batch of sequences, each returning next-token logits.

Batch invariance: a decode row's logits must not depend on which other rows share the
step, or batching would change greedy text. Attention already reads each row alone
(`kv_cache.ragged_attention`). The linear layers are the other half: a BLAS GEMM picks
its kernel, and so its summation order, by the number of rows (on this project's CPUs a
1-row product takes a matrix-vector path whose last bits differ from the same row inside
an 8-row product, and 2, 3, 5, 6 or 7 rows take remainder kernels that differ again).

Elementwise transcendental functions are the third: a CPU kernel runs the whole vectors
of a tensor through its SIMD code and the last few elements through scalar code, whose
last bits differ, so which path a row's element takes depends on the rows before it
(seen on a 2-CPU host: Gemma 4's GELU on a width-8 per-layer input). With
`batch_invariant` on, activation modules run each row on its own, and every linear layer
in decode uses one of two strategies, chosen per weight shape when the runner starts:
- tiled: pad the rows to a multiple of `TILE` and run one GEMM. Used only where a check
  at start-up shows that, for this shape, dtype and BLAS, a row's result is the same at
  every padded row count up to the largest batch and at every position in the batch.
  Near GEMM speed.
- rowwise: a batched product of 1-row problems (`torch.bmm` over a stride-0 view of the
  weight, not a copy), so every row runs the same 1-row kernel whatever the batch size.
  Invariant by construction, at the price of matrix-vector speed per row.
On CUDA the default is off: there the fast path matters more, and cuBLAS offers no such
guarantee cheaply. Prefill runs one sequence with its own row count, so it needs neither.

The CUDA fast path (`batched_decode`, `cuda_graphs`, `packed_prefill`; see `graphs`):
- batched decode: static pools at full length, one batched attention per layer over the
  slots 0 ... n - 1 (`kv_cache.DecodeLayout`), inputs in static buffers padded to a
  batch-size bucket, so the step has fixed shapes and addresses;
- CUDA graphs: that step captured once per (batch bucket, KV bucket) and replayed, so a
  step costs one launch instead of thousands (the eager step is host-bound: Python and
  launches cost several times its GPU work; figures in `benchmarks/records/`);
- packed prefill: several prompts' chunks in one forward (`kv_cache.PackedLayout`), so
  64 arriving requests cost a few forwards instead of 64;
- fused norms: each RMSNorm one kernel instead of about nine (`fused`);
- decode program (`programs`, Gemma 4): the batched step written directly on the
  model's weights instead of through transformers' modules, so that each kind of layer
  can be torch.compile'd once (`compile_mode`) and batch-1 projections can run the Triton
  kernels of `kernels` (`triton_gemv`). Prefill keeps transformers' modules;
- dependent launch: those kernels start while the kernel before them drains
  (`dependent_launch`, sm_90 and later).
A decode whose slots are not 0 ... n - 1 (the scheduler's one-row retry after a failed
step) takes the row-by-row path on the same pools instead.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from engines.pytorch import dependent_launch as launch
from engines.pytorch.fused import fuse_rms_norms
from engines.pytorch.graphs import (
    POSITIONS,
    SLOTS,
    TOKENS,
    DecodeGraphs,
    batch_buckets,
    kv_buckets,
    pad_step,
)
from engines.pytorch.kv_cache import (
    ENGINE_ATTENTION,
    BatchLayout,
    DecodeLayout,
    Layout,
    PackedLayout,
    SlotKVCache,
)
from engines.pytorch.model import LoadedModel
from engines.pytorch.programs import ProgramOptions, program_for

log = logging.getLogger(__name__)

TILE = 8


def _round_up(n: int, multiple: int) -> int:
    return -(-n // multiple) * multiple


@torch.inference_mode()
def tiling_is_invariant(weight: torch.Tensor, bias: torch.Tensor | None, max_rows: int) -> bool:
    """Does a row of `F.linear` give the same bits at every multiple-of-TILE row count up
    to `max_rows`, and wherever it sits in the batch? Checked with random rows."""
    top = _round_up(max(max_rows, TILE), TILE)
    gen = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(top, weight.shape[1], generator=gen).to(weight.device, weight.dtype)
    full = F.linear(x, weight, bias)
    for rows in range(TILE, top + 1, TILE):
        if not torch.equal(F.linear(x[:rows], weight, bias), full[:rows]):
            return False
    shifted = F.linear(torch.roll(x, 3, dims=0), weight, bias)
    return torch.equal(shifted, torch.roll(full, 3, dims=0))


def _is_activation(module: nn.Module) -> bool:
    """transformers' activation modules and torch's own (GELU, SiLU, Tanh, ...)."""
    return type(module).__module__ in ("transformers.activations", nn.modules.activation.__name__)


class BatchInvariantOps:
    """Switchable batch-invariant forward for every `nn.Linear` and activation module of
    a model."""

    def __init__(self, model: nn.Module, max_rows: int) -> None:
        self.active = False
        self.strategy: dict[tuple[int, ...], str] = {}
        for module in model.modules():
            if _is_activation(module):
                module.forward = functools.partial(self._rowwise, module.forward)
                continue
            if type(module) is not nn.Linear:
                continue
            key = self._key(module)
            if key not in self.strategy:
                tiled = tiling_is_invariant(module.weight, module.bias, max_rows)
                self.strategy[key] = "tiled" if tiled else "rowwise"
            # Replacing the bound method on the instance is the point: every nn.Linear of
            # the model goes through the batch-invariant product.
            module.forward = functools.partial(self._forward, module)  # type: ignore[method-assign]
        log.info(
            "batch-invariant linears: %d shapes tiled, %d row-wise",
            sum(v == "tiled" for v in self.strategy.values()),
            sum(v == "rowwise" for v in self.strategy.values()),
        )

    def _rowwise(
        self, forward: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor
    ) -> torch.Tensor:
        # Each row alone, as its own tensor: the same SIMD and scalar split whatever the batch.
        if not self.active or x.dim() < 2 or x.shape[0] == 1:
            return forward(x)
        return torch.cat([forward(row) for row in x.split(1)])

    @staticmethod
    def _key(module: nn.Linear) -> tuple[int, ...]:
        w = module.weight
        return (*w.shape, hash(w.dtype), hash(w.device), module.bias is not None)

    def _forward(self, module: nn.Linear, x: torch.Tensor) -> torch.Tensor:
        if not self.active:
            return F.linear(x, module.weight, module.bias)
        rows = x.reshape(-1, x.shape[-1])
        n = rows.shape[0]
        if self.strategy[self._key(module)] == "tiled":
            padded = _round_up(n, TILE)
            if padded != n:
                rows = torch.cat([rows, rows.new_zeros(padded - n, rows.shape[1])])
            out = F.linear(rows, module.weight, module.bias)[:n]
        else:
            weight_t = module.weight.t().unsqueeze(0).expand(n, -1, -1)
            out = torch.bmm(rows.unsqueeze(1), weight_t).squeeze(1)
            if module.bias is not None:
                out = out + module.bias
        return out.reshape(*x.shape[:-1], out.shape[-1])

    @contextmanager
    def enabled(self) -> Iterator[None]:
        self.active = True
        try:
            yield
        finally:
            self.active = False


class ModelRunner:
    """Owns the model's forward passes and the KV cache; not thread-safe (one caller)."""

    def __init__(
        self,
        loaded: LoadedModel,
        *,
        num_slots: int,
        batch_invariant: bool,
        batched_decode: bool = False,
        cuda_graphs: bool = False,
        packed_prefill: bool = False,
        fused_norms: bool = False,
        compile_mode: str | None = None,
        decode_program: bool = False,
        triton_gemv: bool = False,
        attention_form: str = "matmul",
        gemv_epilogues: bool = True,
        compile_without_program: bool = True,
        dependent_launch: bool = True,
    ) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.model.set_attn_implementation(ENGINE_ATTENTION)
        launch.configure(dependent_launch)
        if fused_norms:  # changes the model in place, for every later forward
            fuse_rms_norms(self.model)
        self.batched_decode = batched_decode
        self.packed_prefill = packed_prefill
        # The batched step reads whole static pools: allocate them at full length once
        # (their addresses must not move under a captured graph), plus the scratch slot.
        self.cache = SlotKVCache(
            num_slots,
            loaded.max_model_len,
            loaded.device,
            grow=not batched_decode,
            scratch_slot=batched_decode,
        )
        self.invariant = BatchInvariantOps(self.model, num_slots) if batch_invariant else None
        vocab = int(self.model.get_output_embeddings().out_features)  # also for int4 heads
        # Never choose ids past the tokenizer's vocabulary (padded embedding tables, or a
        # random model with a real model's vocabulary): they decode to nothing. A random
        # model is further held to its declared output ids (see tokenizer.generation_ids).
        allowed = loaded.output_ids or range(min(vocab, loaded.tokenizer_vocab_size))
        banned = torch.ones(vocab, dtype=torch.bool, device=self.device)
        banned[torch.tensor(list(allowed), dtype=torch.long, device=self.device)] = False
        self.banned_ids = banned if bool(banned.any()) else None
        self.buckets = batch_buckets(num_slots)
        # The static decode inputs (tokens, positions, slots); a step uses the first
        # `bucket` columns. One spare column, so that no bucket's slice is the whole
        # buffer: torch.compile would specialise (recompile) for that case.
        self.step_inputs = torch.zeros(
            3, self.buckets[-1] + 1, dtype=torch.long, device=self.device
        )
        self._pinned_turn = 0
        self._pinned = (
            [torch.zeros(self.step_inputs.numel(), dtype=torch.long).pin_memory() for _ in "ab"]
            if self.device.type == "cuda"
            else []
        )
        self._step_fn = self._static_step
        self.program = None
        if decode_program and batched_decode:
            options = ProgramOptions(
                compile_mode,
                triton_gemv,
                attention_form,
                gemv_epilogues=gemv_epilogues,
            )
            self.program = program_for(self.model, self.cache, loaded.max_model_len, options)
        if compile_mode is not None and self.program is None and compile_without_program:
            # No decode program: the whole transformers step, static shapes, one
            # compilation per (batch bucket, KV bucket): minutes each for Gemma 4 E2B,
            # and dynamic=True does not finish in a servable time. The program's
            # per-layer compilation is what makes compiling servable, so the server's
            # automatic compile skips models without one (`compile_without_program`).
            self._step_fn = torch.compile(self._static_step, mode=compile_mode, dynamic=False)
        if cuda_graphs and not (batched_decode and self.device.type == "cuda"):
            raise ValueError("CUDA graphs need batched decode on a CUDA device")
        self.graphs = DecodeGraphs(self._step_fn, self.device) if cuda_graphs else None
        log.info(
            "runner: %d slots, batch-invariant decode %s, decode %s%s, prefill %s, "
            "vocab %d (%d may be generated)",
            num_slots,
            "on" if self.invariant else "off",
            "batched" if batched_decode else "row by row",
            (" in CUDA graphs" if self.graphs else "")
            + (" by the model's decode program" if self.program else ""),
            "packed" if packed_prefill else "one prompt a forward",
            vocab,
            vocab - int(banned.sum()),
        )

    @property
    def requires_compact_slots(self) -> bool:
        """Does decode want the running sequences in slots 0 ... n - 1? (Any slots work,
        but others take the slow row-by-row path.)"""
        return self.batched_decode

    @torch.inference_mode()  # the pools are inference tensors: written only in this mode
    def swap_slots(self, a: int, b: int) -> None:
        """Exchange two slots' cached keys and values (the scheduler's slot compaction)."""
        self.cache.swap_slots(a, b)

    @torch.inference_mode()
    def clear_slot(self, slot: int) -> None:
        """Zero a freed slot's keys and values (see `SlotKVCache.clear_slot`)."""
        self.cache.clear_slot(slot)

    def _forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        layout: Layout,
        logits_to_keep: int | torch.Tensor = 1,
    ) -> torch.Tensor:
        self.cache.layout = layout
        try:
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=logits_to_keep,
                engine_layout=layout,
            )
        finally:
            self.cache.layout = None
        if isinstance(logits_to_keep, int):
            return self._choosable(out.logits[:, -1, :])
        return self._choosable(out.logits[0])  # a packed prefill: one row per kept position

    def _choosable(self, logits: torch.Tensor) -> torch.Tensor:
        """Logits in float32 with the ids that may not be generated at -inf."""
        logits = logits.float()
        if self.banned_ids is not None:
            logits.masked_fill_(self.banned_ids, float("-inf"))
        return logits

    @torch.inference_mode()
    def prefill(self, slot: int, token_ids: list[int], start: int = 0) -> torch.Tensor:
        """Run `token_ids` at positions start.. for the sequence in `slot`; logits (vocab,)
        for the token after the last one."""
        end = start + len(token_ids)
        self.cache.ensure_capacity(end)
        layout = BatchLayout.build([slot], [end], len(token_ids), self.device)
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        positions = torch.arange(start, end, dtype=torch.long, device=self.device)[None, :]
        return self._forward(ids, positions, layout)[0]

    @torch.inference_mode()
    def prefill_many(self, chunks: list[tuple[int, list[int], int]]) -> torch.Tensor:
        """Prompt chunks (slot, token_ids, start) of different sequences in one packed
        forward; logits (chunks, vocab), row i for the token after chunk i."""
        if len(chunks) == 1:
            slot, ids, start = chunks[0]
            return self.prefill(slot, ids, start)[None]
        layout = PackedLayout.build([(s, st, st + len(ids)) for s, ids, st in chunks])
        self.cache.ensure_capacity(max(layout.ends))
        flat = [t for _s, ids, _st in chunks for t in ids]
        positions = [p for _s, ids, st in chunks for p in range(st, st + len(ids))]
        last = [off + end - start - 1 for _s, start, end, off in layout.segments()]
        return self._forward(
            torch.tensor([flat], dtype=torch.long, device=self.device),
            torch.tensor([positions], dtype=torch.long, device=self.device),
            layout,
            logits_to_keep=torch.tensor(last, dtype=torch.long, device=self.device),
        )

    def _static_step(self, bucket: int, kv_len: int) -> torch.Tensor:
        """The batched decode step on the static buffers (what a CUDA graph captures)."""
        inputs = self.step_inputs[:, :bucket]
        if self.program is not None:
            return self._choosable(
                self.program.step(inputs[TOKENS], inputs[POSITIONS], inputs[SLOTS], kv_len)
            )
        layout = DecodeLayout(
            rows=bucket,
            kv_len=kv_len,
            slot_index=inputs[SLOTS],
            write_positions=inputs[POSITIONS],
        )
        return self._forward(inputs[TOKENS][:, None], inputs[POSITIONS][:, None], layout)

    @torch.inference_mode()
    def decode(
        self, slots: list[int], tokens: list[int] | torch.Tensor, positions: list[int]
    ) -> torch.Tensor:
        """One token for each row: `tokens[b]` at `positions[b]` in `slots[b]`; logits
        (rows, vocab) for each row's next token. `tokens` may be a device tensor (the
        scheduler's asynchronous decode feeds a step's chosen tokens straight back)."""
        lengths = [p + 1 for p in positions]
        self.cache.ensure_capacity(max(lengths))
        if self.batched_decode and sorted(slots) == list(range(len(slots))):
            return self._decode_batched(slots, tokens, positions)
        if isinstance(tokens, torch.Tensor):
            tokens = tokens.tolist()
        layout = BatchLayout.build(slots, lengths, 1, self.device)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)[:, None]
        if self.invariant is None:
            return self._forward(ids, pos, layout)
        with self.invariant.enabled():
            return self._forward(ids, pos, layout)

    def _decode_batched(
        self, slots: list[int], tokens: list[int] | torch.Tensor, positions: list[int]
    ) -> torch.Tensor:
        scratch = self.cache.scratch_slot
        assert scratch is not None
        on_device = isinstance(tokens, torch.Tensor)
        step = pad_step(
            slots,
            [0] * len(slots) if isinstance(tokens, torch.Tensor) else tokens,
            positions,
            buckets=self.buckets,
            capacity=self.cache.capacity,
            scratch_slot=scratch,
        )
        self._copy_inputs(step.host, queued=on_device)
        if isinstance(tokens, torch.Tensor):
            rows = self.step_inputs[TOKENS, : step.bucket]
            if step.in_order:
                rows[: len(slots)].copy_(tokens)
            else:
                rows.index_copy_(0, torch.tensor(step.rows, device=self.device), tokens)
        if self.graphs is not None:
            out = self.graphs.run(step.bucket, step.kv_len)
        elif self.invariant is not None:
            with self.invariant.enabled():
                out = self._step_fn(step.bucket, step.kv_len)
        else:
            out = self._step_fn(step.bucket, step.kv_len)
        if step.in_order:
            return out[: len(slots)]
        return out.index_select(0, torch.tensor(step.rows, device=out.device))

    def _copy_inputs(self, host: torch.Tensor, queued: bool) -> None:
        """One host-to-device copy of a step's rows. From pageable memory it returns
        once the device has taken the rows, after everything queued before it, so the
        host may refill its rows at once. `queued` (the step after one still running, fed
        its tokens on the device): from one of two pinned buffers, without waiting, so
        the step queues behind the running one; a buffer is refilled two steps later,
        after the step that used it has been read back."""
        n = host.shape[1]
        if not queued or self.device.type != "cuda":
            self.step_inputs[:, :n].copy_(host)
            return
        self._pinned_turn ^= 1
        staged = self._pinned[self._pinned_turn][: 3 * n].view(3, n)
        staged.copy_(host)
        self.step_inputs[:, :n].copy_(staged, non_blocking=True)

    @torch.inference_mode()
    def warmup_graphs(self, up_to_len: int) -> int:
        """Capture the decode graphs of every batch bucket for KV lengths up to
        `up_to_len` now, so serving does not pause to capture; returns how many.
        The captures' padding rows write only into the scratch slot."""
        if self.graphs is None:
            return 0
        scratch = self.cache.scratch_slot
        assert scratch is not None, "graphs are only built over a cache with a scratch slot"
        self.step_inputs.zero_()
        self.step_inputs[SLOTS] = scratch
        count = 0
        for kv_len in kv_buckets(self.cache.capacity, up_to_len):
            for bucket in self.buckets:
                if (bucket, kv_len) not in self.graphs:
                    self.graphs.capture(bucket, kv_len)
                    count += 1
        return count
