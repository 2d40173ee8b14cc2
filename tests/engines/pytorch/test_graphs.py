"""The CUDA-graph bookkeeping, on CPU: batch and KV buckets, and how a decode step is
padded and laid out for the batched attention (the capture itself needs a GPU)."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch.graphs import (
    BATCH_BUCKETS,
    POSITIONS,
    SLOTS,
    TOKENS,
    batch_buckets,
    bucket_for,
    kv_bucket,
    kv_buckets,
    pad_step,
)


def test_batch_buckets_end_at_max_rows() -> None:
    assert batch_buckets(64) == BATCH_BUCKETS == (1, 2, 4, 8, 16, 32, 64)
    assert batch_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert batch_buckets(1) == (1,)
    assert batch_buckets(100) == (1, 2, 4, 8, 16, 32, 64, 100)
    with pytest.raises(ValueError):
        batch_buckets(0)


def test_bucket_for_pads_up() -> None:
    buckets = batch_buckets(64)
    assert [bucket_for(n, buckets) for n in (1, 2, 3, 5, 8, 9, 33, 64)] == [
        1,
        2,
        4,
        8,
        8,
        16,
        64,
        64,
    ]
    with pytest.raises(ValueError, match="exceed"):
        bucket_for(65, buckets)


def test_kv_buckets_are_powers_of_two_within_capacity() -> None:
    assert kv_bucket(1, 8192) == 256
    assert kv_bucket(256, 8192) == 256
    assert kv_bucket(257, 8192) == 512
    assert kv_bucket(700, 8192) == 1024
    assert kv_bucket(5000, 6000) == 6000  # capped at the capacity
    assert kv_bucket(10, 100) == 100  # a capacity below the minimum bucket
    with pytest.raises(ValueError, match="capacity"):
        kv_bucket(101, 100)
    assert kv_buckets(8192, 1024) == [256, 512, 1024]
    assert kv_buckets(600, 8192) == [256, 512, 600]
    assert kv_buckets(8192, 0) == []


def test_pad_step_places_rows_by_slot_and_pads_into_scratch() -> None:
    step = pad_step(
        [2, 0, 1], [7, 8, 9], [10, 300, 20], buckets=(1, 2, 4, 8), capacity=4096, scratch_slot=8
    )
    assert step.bucket == 4 and step.kv_len == 512  # longest row: 301 positions
    assert step.host.shape == (3, 4) and step.host.dtype == torch.long
    assert step.host[TOKENS].tolist() == [8, 9, 7, 0]
    assert step.host[POSITIONS].tolist() == [300, 20, 10, 0]
    assert step.host[SLOTS].tolist() == [0, 1, 2, 8]  # the padding row writes to scratch
    assert step.rows == [2, 0, 1] and not step.in_order
    ordered = pad_step([0, 1], [1, 2], [3, 4], buckets=(1, 2), capacity=64, scratch_slot=2)
    assert ordered.in_order and ordered.bucket == 2 and ordered.kv_len == 64


def test_pad_step_refuses_slots_that_are_not_compact() -> None:
    with pytest.raises(ValueError, match=r"slots 0\.\.1"):
        pad_step([0, 2], [1, 1], [1, 1], buckets=(2,), capacity=64, scratch_slot=3)
    with pytest.raises(ValueError):
        pad_step([], [], [], buckets=(2,), capacity=64, scratch_slot=3)
