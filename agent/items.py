"""One suite item against a served engine: probe, sweep, gsm8k or bfcl, from the campaign's
settings with the engine's own request settings merged in, into the job's folder.

A table of handlers, one per item (`contract.suite.SuiteItem`). A handler returns the output
tokens the job generated where it counts them (for energy per token), raises
`IncompleteJob` when it ran to its end but lost requests or cells (results kept, the job not
done), and any other exception when it could not measure at all.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from agent.evals.runner import load_task, run_eval
from agent.jobfolder import JobFolder
from agent.loadgen.arrivals import connections_for
from agent.loadgen.client import OpenAIClient
from agent.loadgen.probe import run_probe
from agent.loadgen.sweep import run_sweep
from agent.loadgen.text_sources import load_source
from agent.telemetry.server_metrics import SERVER_METRICS_FILE, ServerMetricsPoller, polling
from contract.errors import BenchError
from contract.spec import CampaignSpec
from contract.suite import SuiteItem
from engines.recipes import RenderedServe

__all__ = ["IncompleteJob", "SuiteItems"]


class IncompleteJob(BenchError):
    """The job ran to its end but lost requests or cells: results kept, the job not done."""


_Handler = Callable[
    [str, SuiteItem, RenderedServe, JobFolder, ServerMetricsPoller], Awaitable[int | None]
]


@dataclass(frozen=True)
class SuiteItems:
    """Runs a campaign's suite items; every job's server metrics go to `shard_dir`, data to
    `work_dir/data` (GSM8K from `gsm8k_data` when given)."""

    spec: CampaignSpec
    shard_dir: Path
    work_dir: Path
    gsm8k_data: Path | None = None

    async def run(
        self, job_id: str, item: SuiteItem, served: RenderedServe, folder: JobFolder
    ) -> int | None:
        """Run one suite item; returns the output tokens it generated, where it counts them."""
        handlers: Mapping[SuiteItem, _Handler] = {
            "probe": self._probe,
            "sweep": self._sweep,
            "gsm8k": self._eval,
            "bfcl": self._eval,
        }
        # Every job, not only sweeps, leaves the server's own view in server_metrics.csv.
        with polling(
            served.base_url, self.shard_dir / SERVER_METRICS_FILE, job_id
        ) as server_metrics:
            return await handlers[item](job_id, item, served, folder, server_metrics)

    async def _probe(
        self,
        job_id: str,
        item: SuiteItem,
        served: RenderedServe,
        folder: JobFolder,
        _: ServerMetricsPoller,
    ) -> int | None:
        if self.spec.suite.probe is None:
            raise ValueError(f"suite item {item!r} is not configured")
        request = served.request_settings(self.spec.suite.probe.request)
        settings = self.spec.suite.probe.model_copy(update={"request": request})
        async with OpenAIClient(
            served.base_url, settings=request, max_connections=settings.at_once
        ) as client:
            probe = await run_probe(client, settings, folder)
        if probe.e2e_tok_s is None:
            raise RuntimeError(f"no probe request succeeded: {'; '.join(probe.errors)}")
        if probe.requests_failed:
            raise IncompleteJob(
                f"probe lost {probe.requests_failed} request(s): {'; '.join(probe.errors)}"
            )
        return None

    async def _sweep(
        self,
        job_id: str,
        item: SuiteItem,
        served: RenderedServe,
        folder: JobFolder,
        server_metrics: ServerMetricsPoller,
    ) -> int | None:
        if self.spec.suite.sweep is None:
            raise ValueError(f"suite item {item!r} is not configured")
        request = served.request_settings(self.spec.suite.sweep.request)
        settings = self.spec.suite.sweep.model_copy(update={"request": request})
        async with OpenAIClient(
            served.base_url, settings=request, max_connections=connections_for(settings)
        ) as client:
            source = load_source(
                settings.prompts, gsm8k_data=self.gsm8k_data, data_dir=self.work_dir / "data"
            )
            sweep = await run_sweep(
                client, settings, folder, source=source, server_metrics=server_metrics
            )
        if sweep.counts["measured"] == 0:
            raise RuntimeError(f"no cell measured ({sweep.counts})")
        lossy = [c for c in sweep.cells if c.status in ("partial", "failed")]
        if lossy:
            first = lossy[0]
            raise IncompleteJob(
                f"{len(lossy)} cell(s) partial or failed, e.g. {first.shape} "
                f"c={first.concurrency}: {first.status} ({first.reason}); results kept"
            )
        return sum(w.output_tokens for c in sweep.cells for w in c.repeats)

    async def _eval(
        self,
        job_id: str,
        item: SuiteItem,
        served: RenderedServe,
        folder: JobFolder,
        _: ServerMetricsPoller,
    ) -> int | None:
        suite = self.spec.suite
        eval_settings = suite.gsm8k if item == "gsm8k" else suite.bfcl
        if eval_settings is None:
            raise ValueError(f"suite item {item!r} is not configured")
        extras = {**served.extra_body, **eval_settings.request.extra_body}
        request = eval_settings.request.model_copy(update={"extra_body": extras})
        eval_settings = eval_settings.model_copy(update={"request": request})
        task = await asyncio.to_thread(
            load_task,
            eval_settings,
            data_path=self.gsm8k_data if item == "gsm8k" else None,
            cache_dir=self.work_dir / "data",
        )
        summary = await run_eval(task, served.base_url, folder.path, model=served.served_model)
        return summary.completion_tokens
