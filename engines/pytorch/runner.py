"""One model step on the engine's slot KV cache: the prefill of one sequence (or a chunk of
it) and the decode of a batch of sequences, each returning next-token logits.

Batch invariance: a decode row's logits must not depend on which other rows share the
step, or batching would change greedy text. Attention already reads each row alone
(`kv_cache.ragged_attention`). The linear layers are the other half: a BLAS GEMM picks
its kernel, and so its summation order, by the number of rows (on this project's CPUs a
1-row product takes a matrix-vector path whose last bits differ from the same row inside
an 8-row product, and 2, 3, 5, 6 or 7 rows take remainder kernels that differ again).

With `batch_invariant` on, every linear layer in decode uses one of two strategies,
chosen per weight shape when the runner starts:
- tiled: pad the rows to a multiple of `TILE` and run one GEMM. Used only where a check
  at start-up shows that, for this shape, dtype and BLAS, a row's result is the same at
  every padded row count up to the largest batch and at every position in the batch.
  Near GEMM speed.
- rowwise: a batched product of 1-row problems (`torch.bmm` over a stride-0 view of the
  weight, not a copy), so every row runs the same 1-row kernel whatever the batch size.
  Invariant by construction, at the price of matrix-vector speed per row.
On CUDA the default is off: there the fast path (static cache, CUDA graphs) matters
more, and cuBLAS offers no such guarantee cheaply. Prefill always runs one sequence with
its own row count, so it needs neither.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

from engines.pytorch.kv_cache import ENGINE_ATTENTION, BatchLayout, SlotKVCache
from engines.pytorch.model import LoadedModel

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


class BatchInvariantLinears:
    """Switchable batch-invariant forward for every `nn.Linear` of a model."""

    def __init__(self, model: nn.Module, max_rows: int) -> None:
        self.active = False
        self.strategy: dict[tuple[int, ...], str] = {}
        for module in model.modules():
            if type(module) is not nn.Linear:
                continue
            key = self._key(module)
            if key not in self.strategy:
                tiled = tiling_is_invariant(module.weight, module.bias, max_rows)
                self.strategy[key] = "tiled" if tiled else "rowwise"
            module.forward = functools.partial(self._forward, module)
        log.info(
            "batch-invariant linears: %d shapes tiled, %d row-wise",
            sum(v == "tiled" for v in self.strategy.values()),
            sum(v == "rowwise" for v in self.strategy.values()),
        )

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

    def __init__(self, loaded: LoadedModel, *, num_slots: int, batch_invariant: bool) -> None:
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.model.set_attn_implementation(ENGINE_ATTENTION)
        self.cache = SlotKVCache(num_slots, loaded.max_model_len, loaded.device)
        self.invariant = BatchInvariantLinears(self.model, num_slots) if batch_invariant else None
        vocab = self.model.get_output_embeddings().weight.shape[0]
        # Never choose ids past the tokenizer's vocabulary (padded embedding tables, or a
        # random model with a real model's vocabulary): they decode to nothing. A random
        # model is further held to its declared output ids (see tokenizer.generation_ids).
        allowed = loaded.output_ids or range(min(vocab, loaded.tokenizer_vocab_size))
        banned = torch.ones(vocab, dtype=torch.bool, device=self.device)
        banned[torch.tensor(list(allowed), dtype=torch.long, device=self.device)] = False
        self.banned_ids = banned if bool(banned.any()) else None
        log.info(
            "runner: %d slots, batch-invariant decode %s, vocab %d (%d may be generated)",
            num_slots,
            "on" if self.invariant else "off",
            vocab,
            vocab - int(banned.sum()),
        )

    def _forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, layout: BatchLayout
    ) -> torch.Tensor:
        self.cache.layout = layout
        try:
            out = self.model(
                input_ids=input_ids,
                position_ids=positions,
                past_key_values=self.cache,
                use_cache=True,
                logits_to_keep=1,
                engine_layout=layout,
            )
        finally:
            self.cache.layout = None
        logits = out.logits[:, -1, :].float()
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
    def decode(self, slots: list[int], tokens: list[int], positions: list[int]) -> torch.Tensor:
        """One token for each row: `tokens[b]` at `positions[b]` in `slots[b]`; logits
        (rows, vocab) for each row's next token."""
        lengths = [p + 1 for p in positions]
        self.cache.ensure_capacity(max(lengths))
        layout = BatchLayout.build(slots, lengths, 1, self.device)
        ids = torch.tensor(tokens, dtype=torch.long, device=self.device)[:, None]
        pos = torch.tensor(positions, dtype=torch.long, device=self.device)[:, None]
        if self.invariant is None:
            return self._forward(ids, pos, layout)
        with self.invariant.enabled():
            return self._forward(ids, pos, layout)
