"""The probe's digest of its greedy texts: equal between runs that wrote the same text,
absent where a prompt's text did not repeat within the run."""

from __future__ import annotations

import hashlib

from agent.loadgen.probe import summarise_probe
from contract.results import RequestRecord
from contract.suite import ProbeSettings

SETTINGS = ProbeSettings(output_tokens=4, repeats=2, at_once=2)


def _record(index: int, repeat: int, text: str) -> RequestRecord:
    return RequestRecord(
        request_id=f"probe-p{index}-r{repeat}",
        label=f"probe/p{index}/r{repeat}",
        endpoint="chat",
        dispatch_ns=0,
        send_ns=0,
        first_token_ns=1_000_000,
        last_token_ns=4_000_000,
        end_ns=4_000_000,
        chunk_ns=[1_000_000, 2_000_000, 3_000_000, 4_000_000],
        chunk_tokens=[1, 1, 1, 1],
        completion_tokens=4,
        text=text,
        text_sha256=hashlib.sha256(text.encode()).hexdigest(),
    )


def _summary(texts: dict[int, list[str]]):
    records = {i: [_record(i, r, t) for r, t in enumerate(runs)] for i, runs in texts.items()}
    return summarise_probe(
        records, [], settings=SETTINGS, base_url="http://127.0.0.1:1", model="m",
        endpoint="chat", started_unix_s=0.0,
    )  # fmt: skip


def test_two_runs_with_the_same_texts_share_a_digest_and_another_text_changes_it():
    first = _summary({0: ["a b", "a b"], 1: ["c", "c"]})
    second = _summary({0: ["a b", "a b"], 1: ["c", "c"]})
    other = _summary({0: ["a b", "a b"], 1: ["d", "d"]})
    assert first.repeat_identical == 2
    assert first.texts_sha256 and first.texts_sha256 == second.texts_sha256
    assert other.texts_sha256 != first.texts_sha256


def test_no_digest_where_a_prompt_did_not_repeat_within_the_run():
    summary = _summary({0: ["a b", "a b"], 1: ["c", "d"]})
    assert summary.repeat_identical == 1
    assert summary.texts_sha256 is None
