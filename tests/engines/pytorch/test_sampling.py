"""Token choice: greedy, seeded sampling, top-k/top-p truncation, min_tokens and ignore_eos."""

from __future__ import annotations

import torch

from engines.pytorch.sampling import SamplerState, SamplingParams, choose_token, choose_tokens

CPU = torch.device("cpu")
EOS = [3]


def _state(**kw: object) -> SamplerState:
    return SamplerState.create(SamplingParams(max_tokens=10, **kw), EOS, CPU)  # type: ignore[arg-type]


def test_greedy_is_argmax() -> None:
    logits = torch.tensor([0.0, 2.0, 1.0, 0.5])
    assert choose_token(logits.clone(), _state(temperature=0.0), 0) == 1


def test_min_tokens_and_ignore_eos_ban_eos() -> None:
    logits = torch.tensor([0.0, 1.0, 1.0, 9.0])
    assert choose_token(logits.clone(), _state(temperature=0.0), 0) == 3
    assert choose_token(logits.clone(), _state(temperature=0.0, min_tokens=2), 1) != 3
    assert choose_token(logits.clone(), _state(temperature=0.0, min_tokens=2), 2) == 3
    assert choose_token(logits.clone(), _state(temperature=0.0, ignore_eos=True), 5) != 3
    banned = _state(temperature=0.0, min_tokens=5, stop_token_ids=(1,)).banned_ids(0)
    assert banned == [1, 3]


def test_seeded_sampling_repeats() -> None:
    logits = torch.randn(50, generator=torch.Generator().manual_seed(1))
    draws = [
        [choose_token(logits.clone(), state, i) for i in range(20)]
        for state in (_state(seed=7), _state(seed=7))
    ]
    assert draws[0] == draws[1]
    assert len(set(draws[0])) > 1


def test_top_k_and_top_p_truncate() -> None:
    logits = torch.tensor([5.0, 4.9, 0.0, -1.0, -2.0])
    k = _state(seed=0, top_k=2)
    assert {choose_token(logits.clone(), k, i) for i in range(50)} <= {0, 1}
    p = _state(seed=0, top_p=0.5)
    assert {choose_token(logits.clone(), p, i) for i in range(50)} == {0}


def test_choose_tokens_equals_choose_token_row_by_row() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(5, 8, generator=gen)
    logits[:, 3] = 50.0  # EOS is everyone's favourite
    states = [
        _state(temperature=0.0),
        _state(temperature=0.0, ignore_eos=True),
        _state(temperature=0.8, seed=1),  # sampled: left to choose_token
        _state(temperature=0.0, min_tokens=4, stop_token_ids=(5,)),
        _state(temperature=0.0, min_tokens=1),
    ]
    generated = [0, 2, 0, 1, 3]
    expected = [
        choose_token(row.clone(), s, n) for row, s, n in zip(logits, states, generated, strict=True)
    ]
    got = choose_tokens(logits.clone(), states, generated)
    assert got[2] is None
    assert [g for i, g in enumerate(got) if i != 2] == [e for i, e in enumerate(expected) if i != 2]
    assert got[0] == 3 and got[1] != 3 and got[3] not in (3, 5) and got[4] == 3
    assert choose_tokens(logits.clone(), [states[2]], [0]) == [None]
