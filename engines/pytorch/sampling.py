"""Sampling: each request's parameters and the choice of its next token from the logits.

Greedy is the arg-max; `choose_tokens` takes the arg-max of a whole decode batch in one
kernel and one device-to-host copy (per-row `.item()` calls cost a sync each).
Otherwise temperature, then top-k and top-p truncation, then a draw from the request's own
generator: seeded when the request gives a seed, so a seeded request draws the same
tokens whatever else runs beside it. `min_tokens` hides the stop
tokens (EOS and `stop_token_ids`) until that many tokens exist; `ignore_eos` hides EOS.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import torch

from engines.serving.requests import SamplingParams as SamplingParams


@dataclass
class SamplerState:
    """One request's sampling state: its parameters, generator and the ids that stop it."""

    params: SamplingParams
    eos_token_ids: tuple[int, ...]
    generator: torch.Generator | None = None
    stop_ids: frozenset[int] = field(init=False)

    def __post_init__(self) -> None:
        eos = () if self.params.ignore_eos else self.eos_token_ids
        self.stop_ids = frozenset((*eos, *self.params.stop_token_ids))

    @classmethod
    def create(
        cls, params: SamplingParams, eos_token_ids: list[int], device: torch.device
    ) -> SamplerState:
        generator = None
        if not params.greedy:
            generator = torch.Generator(device=device)
            if params.seed is not None:
                generator.manual_seed(params.seed)
            else:
                generator.seed()
        return cls(params=params, eos_token_ids=tuple(eos_token_ids), generator=generator)

    def banned_ids(self, num_generated: int) -> list[int]:
        """Ids this request may not draw now."""
        return self.params.banned_ids(num_generated, self.eos_token_ids, self.stop_ids)


def _sample_row(logits: torch.Tensor, state: SamplerState) -> int:
    params = state.params
    logits = logits / params.temperature
    if params.top_k > 0 and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        cumulative = torch.cumsum(sorted_probs, dim=-1)
        # Keep the smallest prefix whose mass reaches top_p (the first token always stays).
        drop = cumulative - sorted_probs >= params.top_p
        sorted_probs = sorted_probs.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter_(-1, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=state.generator).item())


@torch.inference_mode()
def choose_token(logits: torch.Tensor, state: SamplerState, num_generated: int) -> int:
    """Next token from one row of logits (vocab,), float32; the row may be modified.

    The scheduler calls this row by row, so one request's failure (say, NaN logits)
    stays its own and a row's choice never depends on the other rows.
    """
    banned = state.banned_ids(num_generated)
    if banned:
        logits[banned] = float("-inf")
    if state.params.greedy:
        return int(logits.argmax().item())
    return _sample_row(logits, state)


@functools.lru_cache(maxsize=256)
def _ban_index(
    device: str, rows: tuple[int, ...], cols: tuple[int, ...]
) -> tuple[torch.Tensor, ...]:
    """Device index tensors of a batch's banned (row, id) pairs, kept: a batch bans the
    same ids step after step (EOS under ignore_eos or min_tokens), and building them
    anew costs two synchronous host-to-device copies per step."""
    return (
        torch.tensor(rows, dtype=torch.long, device=device),
        torch.tensor(cols, dtype=torch.long, device=device),
    )


@functools.lru_cache(maxsize=8)
def _minus_inf(device: str, dtype: torch.dtype) -> torch.Tensor:
    """-inf as a device scalar, kept. Written as a Python float, the value is a host
    tensor that index_put_ copies to the device with a synchronous copy, which waits for
    everything queued: the whole of an asynchronous decode's next step (the host then
    idle, and the device after it)."""
    return torch.tensor(float("-inf"), dtype=dtype, device=device)


@torch.inference_mode()
def greedy_token_tensor(
    logits: torch.Tensor, states: list[SamplerState], num_generated: list[int]
) -> torch.Tensor:
    """The greedy choice of every row, as a device tensor (rows,): each row's banned ids
    masked in one indexed write, then one arg-max. Nothing is copied to the host, so a
    caller can feed the tokens to the next step before reading them."""
    rows: list[int] = []
    cols: list[int] = []
    for i, (state, n) in enumerate(zip(states, num_generated, strict=True)):
        banned = state.banned_ids(n)
        rows.extend([i] * len(banned))
        cols.extend(banned)
    if rows:
        device = str(logits.device)
        logits.index_put_(
            _ban_index(device, tuple(rows), tuple(cols)), _minus_inf(device, logits.dtype)
        )
    return logits.argmax(dim=-1)


@torch.inference_mode()
def choose_tokens(
    logits: torch.Tensor, states: list[SamplerState], num_generated: list[int]
) -> list[int | None]:
    """Next tokens of a decode batch (rows, vocab), float32; the rows may be modified.

    Greedy rows are chosen here, all at once (`greedy_token_tensor`), with one copy to
    the host. The arg-max of a row does not depend on the other rows, so this equals
    `choose_token` row by row. Sampled rows come back as None, for `choose_token` to draw
    one by one with their own generators.
    """
    greedy = [i for i, state in enumerate(states) if state.params.greedy]
    out: list[int | None] = [None] * len(states)
    if not greedy:
        return out
    chosen = greedy_token_tensor(
        logits[greedy] if len(greedy) < len(states) else logits,
        [states[i] for i in greedy],
        [num_generated[i] for i in greedy],
    ).tolist()
    for i, token in zip(greedy, chosen, strict=True):
        out[i] = int(token)
    return out
