"""The probe's digest of its greedy texts: equal between runs that wrote the same text,
absent where a prompt's text did not repeat within the run."""

from __future__ import annotations

import hashlib

from agent.loadgen.probe import PROBE_PROMPTS, summarise_probe
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


def _summary(texts: dict[int, list[str]], *, finished: bool = True):
    records = {i: [_record(i, r, t) for r, t in enumerate(runs)] for i, runs in texts.items()}
    return summarise_probe(
        records, [], settings=SETTINGS, base_url="http://127.0.0.1:1", model="m",
        endpoint="chat", started_unix_s=0.0, finished=finished,
    )  # fmt: skip


def _texts(last: list[str]) -> dict[int, list[str]]:
    """Each prompt's two repeats: 'p0', 'p0', ... and `last` for the last prompt."""
    texts = {i: [f"p{i}", f"p{i}"] for i in range(len(PROBE_PROMPTS))}
    texts[len(PROBE_PROMPTS) - 1] = last
    return texts


def test_two_runs_with_the_same_texts_share_a_digest_and_another_text_changes_it():
    first = _summary(_texts(["a b", "a b"]))
    second = _summary(_texts(["a b", "a b"]))
    other = _summary(_texts(["a c", "a c"]))
    assert first.repeat_identical == len(PROBE_PROMPTS)
    assert first.texts_sha256 and first.texts_sha256 == second.texts_sha256
    assert other.texts_sha256 != first.texts_sha256


def test_no_digest_where_a_prompt_did_not_repeat_within_the_run():
    summary = _summary(_texts(["a b", "a c"]))
    assert summary.repeat_identical == len(PROBE_PROMPTS) - 1
    assert summary.texts_sha256 is None


def test_no_digest_of_a_probe_still_running_or_missing_a_prompt():
    assert _summary(_texts(["a b", "a b"]), finished=False).texts_sha256 is None
    assert _summary({0: ["a", "a"]}).texts_sha256 is None
