"""The one-request probe, as the seeds ran it.

Six fixed chat prompts, each sent alone `repeats` times with `output_tokens` forced; per
prompt the median, across prompts the geometric mean; "repeat" counts prompts whose greedy
text is byte-identical across repeats, and where all are, a digest of the texts says whether
another run wrote the same; then `at_once` requests together and their aggregate
over the one-request rate. The summary is rewritten (unfinished) after each request, so an
interrupted probe can be resumed: its finished requests are kept and only the rest are sent
(the at-once batch only as a whole, since its figure is their aggregate).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable

from agent.jobfolder import JobFolder
from agent.loadgen.client import ChatRequest, OpenAIClient
from contract import metrics
from contract.results import ProbePrompt, ProbeSummary, RequestRecord
from contract.suite import ProbeSettings

__all__ = ["PROBE_PROMPTS", "probe_request_count", "resumable", "run_probe"]

log = logging.getLogger(__name__)

PROBE_PROMPTS: tuple[str, ...] = (
    "Explain how a hash map handles collisions, with a short example in Python.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List the main causes of the French Revolution and explain each in one or two sentences.",
    "A train leaves at 9:40 and travels 210 km at 84 km/h. When does it arrive? Show the steps.",
    "Summarise the difference between TCP and UDP for a new network engineer.",
    "Give a recipe for a simple vegetable soup, with quantities and steps.",
)

ProgressHook = Callable[[int], None]


def _one_id(index: int, repeat: int) -> str:
    return f"probe-p{index}-r{repeat}"


def _at_once_ids(settings: ProbeSettings) -> list[str]:
    return [f"probe-at-once-{i}" for i in range(settings.at_once)]


def probe_request_count(settings: ProbeSettings) -> int:
    return settings.repeats * len(PROBE_PROMPTS) + settings.at_once


def resumable(records: Iterable[RequestRecord], settings: ProbeSettings) -> list[RequestRecord]:
    """Of an interrupted probe's records, those a resume keeps: each one-request record once,
    and the at-once batch only when all of it is there.
    """
    ones = {_one_id(i, r) for r in range(settings.repeats) for i in range(len(PROBE_PROMPTS))}
    by_id = {r.request_id: r for r in records if r.request_id in ones}
    at_once = {r.request_id: r for r in records if r.request_id in _at_once_ids(settings)}
    if len(at_once) == settings.at_once:
        by_id |= at_once
    return list(by_id.values())


async def run_probe(
    client: OpenAIClient,
    settings: ProbeSettings,
    writer: JobFolder,
    *,
    progress: ProgressHook | None = None,
    previous: ProbeSummary | None = None,
    done: Iterable[RequestRecord] = (),
) -> ProbeSummary:
    """Run the probe against a ready server; records are written as they arrive.

    `previous` and `done`: an interrupted probe of the same settings and the records of it
    that `resumable` keeps; they are reused, not sent again.
    """
    info = await client.server_info()
    started = previous.started_unix_s if previous else time.time()
    kept = {r.request_id: r for r in done}
    records: dict[int, list[RequestRecord]] = {}

    def summary(at_once: list[RequestRecord], finished: bool) -> ProbeSummary:
        return summarise_probe(
            records,
            at_once,
            settings=settings,
            base_url=client.base_url,
            model=info.model,
            endpoint=client.settings.endpoint,
            started_unix_s=started,
            finished=finished,
        )

    await client.warm(settings.at_once)
    for repeat in range(settings.repeats):
        for index, prompt in enumerate(PROBE_PROMPTS):
            record = kept.get(_one_id(index, repeat))
            if record is None:
                record = await client.send(
                    ChatRequest(
                        prompt=prompt,
                        max_tokens=settings.output_tokens,
                        label=f"probe/p{index}/r{repeat}",
                        request_id=_one_id(index, repeat),
                        keep_text=True,
                    )
                )
                writer.append_requests([record])
                if record.error:
                    log.warning("probe prompt %d repeat %d failed: %s", index, repeat, record.error)
            records.setdefault(index, []).append(record)
            writer.write_summary(summary([], finished=False))
            if progress:
                progress(1)
    together = [kept[i] for i in _at_once_ids(settings) if i in kept]
    if len(together) != settings.at_once:
        dispatch = time.perf_counter_ns()
        together = await asyncio.gather(
            *(
                client.send(
                    ChatRequest(
                        prompt=PROBE_PROMPTS[i % len(PROBE_PROMPTS)],
                        max_tokens=settings.output_tokens,
                        label=f"probe/at-once/{i}",
                        request_id=request_id,
                    ),
                    dispatch_ns=dispatch,
                )
                for i, request_id in enumerate(_at_once_ids(settings))
            )
        )
        writer.append_requests(together)
    if progress:
        progress(len(together))
    final = summary(list(together), finished=True)
    writer.write_summary(final)
    return final


def _digest(text_digests: list[str | None]) -> str:
    return hashlib.sha256(" ".join(map(str, text_digests)).encode()).hexdigest()


def summarise_probe(
    records: dict[int, list[RequestRecord]],
    at_once: list[RequestRecord],
    *,
    settings: ProbeSettings,
    base_url: str,
    model: str,
    endpoint: str,
    started_unix_s: float,
    finished: bool = True,
) -> ProbeSummary:
    """The probe's summary of these records; `finished` False while the probe runs."""
    prompts: list[ProbePrompt] = []
    for index, runs in sorted(records.items()):
        ok = [r for r in runs if r.ok]
        texts = {r.text for r in runs}
        prompts.append(
            ProbePrompt(
                index=index,
                e2e_tok_s_median=metrics.median(
                    v for r in ok if (v := metrics.e2e_tok_s(r)) is not None
                ),
                decode_tok_s_median=metrics.median(
                    v for r in ok if (v := metrics.decode_tok_s(r)) is not None
                ),
                ttft_ms_median=metrics.median(
                    v for r in ok if (v := metrics.ttft_ms(r)) is not None
                ),
                repeats_ok=len(ok),
                repeat_identical=len(ok) == len(runs) and len(texts) == 1,
            )
        )
    # A digest only of a whole probe: every prompt sent, every text repeated.
    whole = finished and len(prompts) == len(PROBE_PROMPTS)
    repeated = whole and all(p.repeat_identical for p in prompts)
    digests = [runs[0].text_sha256 for _, runs in sorted(records.items())]
    e2e = metrics.geometric_mean(p.e2e_tok_s_median for p in prompts if p.e2e_tok_s_median)
    together = metrics.window_stats(at_once, repeat=0, mode="burst", concurrency=len(at_once))
    every = [r for runs in records.values() for r in runs]
    failed = [r for r in every + at_once if not r.ok]
    errors = sorted({r.error or "no output tokens" for r in failed})[:5]
    aggregate = together.aggregate_output_tok_s
    # One request at a time: the drafter's acceptance where the responses report it.
    drafted = [r for r in every if r.ok and r.draft_tokens is not None]
    return ProbeSummary(
        base_url=base_url,
        model=model,
        endpoint="chat" if endpoint == "chat" else "completions",
        started_unix_s=started_unix_s,
        finished_unix_s=time.time() if finished else None,
        settings=settings,
        prompts=prompts,
        e2e_tok_s=e2e,
        decode_tok_s=metrics.geometric_mean(
            p.decode_tok_s_median for p in prompts if p.decode_tok_s_median
        ),
        ttft_ms=metrics.median(v for r in every if r.ok and (v := metrics.ttft_ms(r)) is not None),
        at_once_aggregate_tok_s=aggregate,
        at_once_x_one=(aggregate / e2e) if aggregate and e2e else None,
        repeat_identical=sum(1 for p in prompts if p.repeat_identical),
        texts_sha256=_digest(digests) if repeated and None not in digests else None,
        requests_failed=len(failed),
        errors=errors,
        spec_draft_tokens=sum(r.draft_tokens or 0 for r in drafted) if drafted else None,
        spec_accepted_tokens=sum(r.draft_accepted_tokens or 0 for r in drafted)
        if drafted
        else None,
    )
