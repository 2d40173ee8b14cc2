"""The one-request probe, as the seeds ran it.

Six fixed chat prompts, each sent alone `repeats` times with `output_tokens` forced; per
prompt the median, across prompts the geometric mean; "repeat" counts prompts whose greedy
text is byte-identical across repeats; then `at_once` requests together and their aggregate
over the one-request rate.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable

from agent.loadgen.client import ChatRequest, OpenAIClient
from agent.results import ResultWriter
from contract import metrics
from contract.results import ProbePrompt, ProbeSummary, RequestRecord
from contract.suite import ProbeSettings

__all__ = ["PROBE_PROMPTS", "run_probe"]

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


async def run_probe(
    client: OpenAIClient,
    settings: ProbeSettings,
    writer: ResultWriter,
    *,
    progress: ProgressHook | None = None,
) -> ProbeSummary:
    """Run the probe against a ready server; records are written as they arrive."""
    info = await client.server_info()
    started = time.time()
    await client.warm(settings.at_once)
    records: dict[int, list[RequestRecord]] = {}
    for repeat in range(settings.repeats):
        for index, prompt in enumerate(PROBE_PROMPTS):
            record = await client.send(
                ChatRequest(
                    prompt=prompt,
                    max_tokens=settings.output_tokens,
                    label=f"probe/p{index}/r{repeat}",
                    request_id=f"probe-p{index}-r{repeat}",
                    keep_text=True,
                )
            )
            writer.append_requests([record])
            records.setdefault(index, []).append(record)
            if record.error:
                log.warning("probe prompt %d repeat %d failed: %s", index, repeat, record.error)
            if progress:
                progress(1)
    dispatch = time.perf_counter_ns()
    together = await asyncio.gather(
        *(
            client.send(
                ChatRequest(
                    prompt=PROBE_PROMPTS[i % len(PROBE_PROMPTS)],
                    max_tokens=settings.output_tokens,
                    label=f"probe/at-once/{i}",
                    request_id=f"probe-at-once-{i}",
                ),
                dispatch_ns=dispatch,
            )
            for i in range(settings.at_once)
        )
    )
    writer.append_requests(together)
    if progress:
        progress(len(together))
    summary = summarise_probe(
        records,
        list(together),
        settings=settings,
        base_url=client.base_url,
        model=info.model,
        endpoint=client.settings.endpoint,
        started_unix_s=started,
    )
    writer.write_summary(summary)
    return summary


def summarise_probe(
    records: dict[int, list[RequestRecord]],
    at_once: list[RequestRecord],
    *,
    settings: ProbeSettings,
    base_url: str,
    model: str,
    endpoint: str,
    started_unix_s: float,
) -> ProbeSummary:
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
        finished_unix_s=time.time(),
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
        requests_failed=len(failed),
        errors=errors,
        spec_draft_tokens=sum(r.draft_tokens or 0 for r in drafted) if drafted else None,
        spec_accepted_tokens=sum(r.draft_accepted_tokens or 0 for r in drafted)
        if drafted
        else None,
    )
