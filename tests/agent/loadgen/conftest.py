"""Shared helpers for load-generator tests against the scripted reference server."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from agent.loadgen.client import ChatRequest, OpenAIClient
from contract.results import RequestRecord
from contract.suite import RequestSettings
from refserver import ReferenceServer, reference_server


@pytest.fixture(scope="module")
def paced_server() -> Iterator[ReferenceServer]:
    """The L4-like pace of the benchmark: 50 ms to the first token, then 7 ms gaps."""
    with reference_server(ttft_ms=50, itl_ms=7) as server:
        yield server


def send_many(
    url: str,
    prompts: list[str],
    *,
    max_tokens: int,
    transport: str = "fast",
    settings: RequestSettings | None = None,
) -> list[RequestRecord]:
    """All prompts released at once, one connection each; records in prompt order."""

    async def run() -> list[RequestRecord]:
        async with OpenAIClient(
            url, settings=settings, transport=transport, max_connections=len(prompts)
        ) as client:
            await client.server_info()
            await client.warm(len(prompts))
            return list(
                await asyncio.gather(
                    *(
                        client.send(
                            ChatRequest(
                                prompt=p, max_tokens=max_tokens, label="t", request_id=p.split()[0]
                            )
                        )
                        for i, p in enumerate(prompts)
                    )
                )
            )

    return asyncio.run(run())
