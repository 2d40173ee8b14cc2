"""The in-process step timer runs end to end on the tiny model."""

from __future__ import annotations

from engines.pytorch.stepbench import main


def test_stepbench_on_tiny() -> None:
    result = main(
        [
            "--model",
            "random:tiny",
            "--device",
            "cpu",
            "--batches",
            "1,2",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--prompt-len",
            "8",
            "--generate-tokens",
            "4",
            "--profile",
            "--profile-prefill",
            "3",
        ]
    )
    assert [r["batch"] for r in result["decode"]] == [1, 2]
    assert all(r["decode_tok_s"] > 0 and r["decode_step_ms_queued"] > 0 for r in result["decode"])
    assert result["weight_bytes_streamed"] > 0
    assert result["generate_batch1"]["new_tokens"] == 4
    assert [p["batch"] for p in result["profiles"]] == [1, 2]
    assert result["profiles"][0]["host_ops"] > 0
    assert result["profiles"][0]["step_wall_ms"] > 0
    prefill = result["prefill_profile"]
    assert prefill["prompts"] == 3 and prefill["wall_ms"] > 0 and prefill["host_ops"] > 0


def test_stepbench_batched_decode_on_tiny() -> None:
    result = main(
        [
            "--model",
            "random:tiny-gemma4",
            "--device",
            "cpu",
            "--batches",
            "1,3",
            "--steps",
            "2",
            "--warmup",
            "1",
            "--prompt-len",
            "20",
            "--decode-attention",
            "batched",
        ]
    )
    assert result["decode_attention"] == "batched"
    assert all(r["decode_tok_s"] > 0 for r in result["decode"])


def test_greedy_trace_gives_each_token_its_logits_digest_and_top_gap() -> None:
    argv = ["--model", "random:tiny-gemma4", "--device", "cpu", "--batches", "1", "--steps", "1",
            "--warmup", "1", "--prompt-len", "12", "--check-tokens", "5"]  # fmt: skip
    first, second = main(argv), main(argv)
    assert len(first["greedy_tokens_batch1"]) == 5
    assert len(set(first["greedy_logits_sha256_batch1"])) == 5
    assert all(gap >= 0 for gap in first["greedy_top_gap_batch1"])
    # The same model and step on the CPU: the same logits, to the bit.
    keys = ("greedy_tokens_batch1", "greedy_logits_sha256_batch1", "greedy_top_gap_batch1")
    assert all(first[k] == second[k] for k in keys)
    assert first["greedy_in_process_first_differ"] is None
    assert first["greedy_in_process_third_first_differ"] is None
