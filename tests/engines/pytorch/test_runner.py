"""Model steps on the slot cache: decode rows are bitwise independent of the batch they
run in, and the cache path computes what transformers' own forward computes."""

from __future__ import annotations

import pytest
import torch

from engines.pytorch.fused import fuse_rms_norms
from engines.pytorch.model import LoadedModel, load_model
from engines.pytorch.runner import ModelRunner

NEW_TOKENS = 24


@pytest.fixture(scope="module", params=["tiny", "tiny-gemma4"])
def loaded(request: pytest.FixtureRequest) -> LoadedModel:
    torch.set_num_threads(1)
    return load_model(f"random:{request.param}", device="cpu", seed=0)


def _prompts(n: int) -> list[list[int]]:
    # Different lengths, some past tiny-gemma4's 16-token sliding window.
    return [[257, *[(31 * i + 7 * j) % 250 + 1 for j in range(3 + 5 * i)]] for i in range(n)]


def _greedy(runner: ModelRunner, prompts: dict[int, list[int]]) -> dict[int, list[int]]:
    """Prefill each prompt in its own slot, then decode all of them together."""
    out = {s: [int(runner.prefill(s, p).argmax())] for s, p in prompts.items()}
    slots = list(prompts)
    for _ in range(NEW_TOKENS - 1):
        logits = runner.decode(
            slots,
            [out[s][-1] for s in slots],
            [len(prompts[s]) + len(out[s]) - 1 for s in slots],
        )
        for row, s in enumerate(slots):
            out[s].append(int(logits[row].argmax()))
    return out


def test_batch_of_8_equals_batch_of_1_bitwise(loaded: LoadedModel) -> None:
    runner = ModelRunner(loaded, num_slots=8, batch_invariant=True)
    prompts = _prompts(8)
    together = _greedy(runner, dict(enumerate(prompts)))
    alone = {}
    for i, p in enumerate(prompts):
        alone.update(_greedy(runner, {7 - i: p}))  # another slot than before, on purpose
    assert [together[i] for i in range(8)] == [alone[7 - i] for i in range(8)]
    # and the logits themselves, not just their arg-max
    runner.prefill(0, prompts[3])
    runner.prefill(5, prompts[4])
    pos = [len(prompts[3]), len(prompts[4])]
    both = runner.decode([0, 5], [9, 9], pos)
    one = runner.decode([5], [9], pos[1:])
    assert torch.equal(both[1], one[0])


def test_cache_path_matches_transformers_forward(loaded: LoadedModel) -> None:
    runner = ModelRunner(loaded, num_slots=4, batch_invariant=True)
    prompts = _prompts(4)
    generated = _greedy(runner, dict(enumerate(prompts)))
    reference = loaded.model
    previous = reference.config._attn_implementation
    reference.set_attn_implementation("sdpa")
    try:
        with torch.inference_mode():
            for i, p in enumerate(prompts):
                seq = p + generated[i]
                logits = reference(input_ids=torch.tensor([seq])).logits[0]
                if runner.banned_ids is not None:  # the ids a random model may not generate
                    logits = logits.masked_fill(runner.banned_ids, float("-inf"))
                predicted = logits[len(p) - 1 : -1].argmax(-1).tolist()
                assert predicted == generated[i], f"prompt {i}"
    finally:
        reference.set_attn_implementation(previous)


def test_chunked_prefill_matches_one_shot(loaded: LoadedModel) -> None:
    runner = ModelRunner(loaded, num_slots=2, batch_invariant=True)
    prompt = _prompts(8)[7]  # 39 tokens
    whole = runner.prefill(0, prompt)
    runner.prefill(1, prompt[:10])
    runner.prefill(1, prompt[10:25], start=10)
    chunked = runner.prefill(1, prompt[25:], start=25)
    torch.testing.assert_close(chunked, whole, rtol=1e-4, atol=1e-4)


def test_cache_grows_and_keeps_contents(loaded: LoadedModel) -> None:
    runner = ModelRunner(loaded, num_slots=2, batch_invariant=True)
    runner.cache.capacity = 8  # force growth before any pool exists
    prompt = _prompts(8)[6]
    first = runner.prefill(0, prompt[:6])
    assert runner.cache.capacity == 8
    logits = runner.prefill(0, prompt[6:], start=6)
    assert runner.cache.capacity >= len(prompt)
    fresh = ModelRunner(loaded, num_slots=2, batch_invariant=True)
    torch.testing.assert_close(logits, fresh.prefill(1, prompt), rtol=1e-4, atol=1e-4)
    assert first.shape == logits.shape


def test_batched_decode_and_packed_prefill_match_the_reference_path(
    loaded: LoadedModel,
) -> None:
    """The fast path's batched attention over static pools (padded to a bucket, rows in
    any order, windows crossed) and its packed prefill compute what the row-by-row path
    computes, within float32 rounding; a non-compact set of slots falls back to it."""
    ref = ModelRunner(loaded, num_slots=8, batch_invariant=False)
    fast = ModelRunner(
        loaded, num_slots=8, batch_invariant=False, batched_decode=True, packed_prefill=True
    )
    assert fast.requires_compact_slots and fast.graphs is None and fast.cache.scratch_slot == 8
    assert fast.warmup_graphs(1024) == 0  # no graphs on CPU
    prompts = _prompts(5)
    want = torch.stack([ref.prefill(s, p) for s, p in enumerate(prompts)])
    got = fast.prefill_many([(s, p, 0) for s, p in enumerate(prompts)])
    assert torch.equal(got.isinf(), want.isinf())
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    slots = [3, 1, 0, 2, 4]  # 5 rows: padded to the bucket of 8
    tokens = [int(want[s].argmax()) for s in slots]
    for step in range(20):  # past tiny-gemma4's 16-token window
        positions = [len(prompts[s]) + step for s in slots]
        a = ref.decode(slots, tokens, positions)
        b = fast.decode(slots, tokens, positions)
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)
        tokens = a.argmax(-1).tolist()
    positions = [len(prompts[s]) + 20 for s in (4, 1)]
    torch.testing.assert_close(
        fast.decode([4, 1], tokens[-1:] + tokens[1:2], positions),
        ref.decode([4, 1], tokens[-1:] + tokens[1:2], positions),
        rtol=1e-4,
        atol=1e-4,
    )


def test_swap_slots_moves_a_sequence(loaded: LoadedModel) -> None:
    fast = ModelRunner(loaded, num_slots=4, batch_invariant=False, batched_decode=True)
    prompt = _prompts(3)[2]
    fast.prefill(3, prompt)
    before = fast.decode([3], [9], [len(prompt)])
    fast.prefill(3, prompt)  # rewrite position len(prompt) as it was
    fast.swap_slots(3, 0)
    after = fast.decode([0], [9], [len(prompt)])  # now on the batched path
    torch.testing.assert_close(after, before, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["tiny", "tiny-gemma4"])
def test_fused_norms_compute_the_same_step(name: str) -> None:
    """RMSNorm as one torch.rms_norm call: every norm of the model is replaced, and the
    logits equal the unfused ones within float32 rounding."""
    fresh = load_model(f"random:{name}", device="cpu", seed=0)  # fusing changes the model
    prompt = _prompts(4)[3]
    plain = ModelRunner(fresh, num_slots=2, batch_invariant=False).prefill(0, prompt)
    norms = sum(type(m).__name__.endswith("RMSNorm") for m in fresh.model.modules())
    assert fuse_rms_norms(fresh.model) == norms > 0
    fused = ModelRunner(fresh, num_slots=2, batch_invariant=False).prefill(0, prompt)
    torch.testing.assert_close(fused, plain, rtol=1e-4, atol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_queued_cuda_step_and_its_greedy_choice_never_wait_for_the_device() -> None:
    """What the scheduler's asynchronous decode queues behind a running step (the step
    fed the previous tokens where they lie, then the greedy choice with EOS banned) must
    not synchronise: one wait makes the host sit out the whole step and the device the
    host's work after it."""
    from engines.pytorch.sampling import SamplerState, SamplingParams, greedy_token_tensor

    cuda = load_model("random:tiny-gemma4", device="cuda", seed=0)
    runner = ModelRunner(
        cuda, num_slots=2, batch_invariant=False, batched_decode=True, cuda_graphs=True
    )
    prompt = _prompts(2)[1]
    states = [
        SamplerState.create(SamplingParams(max_tokens=9, ignore_eos=True), {2}, torch.device("cpu"))
    ]
    tokens = runner.prefill(0, prompt).argmax(dim=-1, keepdim=True)
    for k in range(3):  # the last one with the graph captured and the ban's index built
        if k == 2:
            torch.cuda.set_sync_debug_mode("error")
        try:
            logits = runner.decode([0], tokens, [len(prompt) + k])
            tokens = greedy_token_tensor(logits, states, [k + 1])
        finally:
            torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
