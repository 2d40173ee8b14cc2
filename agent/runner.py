"""The campaign runner: one shard's jobs, one engine on the machine at a time, unattended.

For each arm of the shard: install its engine (once, from its recipe), resolve its model,
start its server, wait until it is really ready, then run its jobs (the suite items:
probe, sweep, gsm8k, bfcl; `agent.items`), each into its `jobs/<arm>-<item>/` folder
(`agent.jobfolder`), with `done` when it ends well.
A job that fails (install, start-up, crash mid-sweep) is recorded with its reason and the
server log's tail, and the campaign goes on; a rerun skips jobs that are `done` and merges
its manifest with the earlier one (first start, last end, every engine build, each run).
Each server listens on its recipe's port when free, else on a free one (recorded per build).
The telemetry sampler runs the whole time, every row tagged with the job running.

Everything AWS-specific (status parameter, uploads, spot notice) reaches the runner
through the small `StatusSink` / `ResultSink` protocols; locally they do nothing.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from agent.gpu import GpuHost, gpu_memory_used_mib
from agent.installer import EngineInstallError, InstalledEngine, install_engine
from agent.items import IncompleteJob, SuiteItems
from agent.jobfolder import JobFolder
from agent.models import ModelResolveError, resolve_model
from agent.provenance import (
    AGENT_VERSION,
    arm_facts,
    earlier_manifest,
    git_sha,
    host_info,
    identify,
)
from agent.readiness import NotReadyError, ReadyResult, wait_ready_sync
from agent.supervisor import EngineError, EngineServer, choose_port, free_port, port_in_use
from agent.telemetry import TelemetrySampler
from contract.files import tail, write_atomic
from contract.jobs import MANIFEST_FILE, EngineServed, JobRecord, Manifest, RunSpan
from contract.layout import JOBS_DIR
from contract.spec import CampaignSpec, ShardSpec
from contract.status import Phase
from contract.suite import SuiteItem
from contract.telemetry import TELEMETRY_FILE
from engines.campaign import campaign_recipe
from engines.recipes import RecipeError, RenderedServe, render
from engines.recipes.render import GpuCC

__all__ = ["CampaignRunner", "Job", "ResultSink", "RunOutcome", "StatusSink"]

log = logging.getLogger(__name__)

_GPU_MEMORY_SLACK_MIB = 1024
LOG_TAIL_LINES = 40  # of a server log, kept on a failed job record
_PORT_ATTEMPTS = 3

_PHASE_OF_ITEM: Mapping[SuiteItem, Phase] = {
    "probe": "probing",
    "sweep": "sweeping",
    "gsm8k": "evaluating",
    "bfcl": "evaluating",
}


class StatusSink(Protocol):
    def set_phase(self, phase: Phase, *, error: str | None = None) -> None: ...

    def set_job(self, index: int, total: int, job: str) -> None: ...


class ResultSink(Protocol):
    def upload_job(self, job: str, job_dir: Path | None = None) -> None: ...


class _NoStatus:
    def set_phase(self, phase: Phase, *, error: str | None = None) -> None:
        log.info("phase: %s%s", phase, f" ({error})" if error else "")

    def set_job(self, index: int, total: int, job: str) -> None:
        log.info("job %d/%d: %s", index, total, job)


@dataclass(frozen=True)
class Job:
    arm: str
    item: SuiteItem

    @property
    def job_id(self) -> str:
        return f"{self.arm}-{self.item}"


@dataclass
class RunOutcome:
    shard_dir: Path
    manifest: Manifest
    records: list[JobRecord] = field(default_factory=list)

    @property
    def failed(self) -> list[JobRecord]:
        return [r for r in self.records if r.status == "failed"]


class CampaignRunner:
    """Runs one shard of a campaign into `shard_dir`; see the module docstring."""

    def __init__(
        self,
        spec: CampaignSpec,
        shard: ShardSpec,
        shard_dir: Path,
        work_dir: Path,
        *,
        gpu: GpuHost,
        engine_env: Mapping[str, str] | None = None,
        status: StatusSink | None = None,
        results: ResultSink | None = None,
        instance: dict[str, str] | None = None,
        should_stop: Callable[[], bool] = lambda: False,
        gsm8k_data: Path | None = None,
    ) -> None:
        self.spec = spec
        self.shard = shard
        self.shard_dir = shard_dir
        self.work_dir = work_dir
        self.gpu = gpu
        self.gpu_cc: GpuCC = gpu.compute_capability
        # The HF token lives here and in the engines' environment only.
        self._engine_env = dict(engine_env or {})
        self.status: StatusSink = status or _NoStatus()
        self.results = results
        self.instance = instance
        self.should_stop = should_stop
        self.items = SuiteItems(spec, shard_dir, work_dir, gsm8k_data)
        self.jobs = [Job(arm, item) for arm in shard.arms for item in spec.suite.items()]
        self._server: EngineServer | None = None
        self._server_lock = threading.Lock()
        self._interrupted = threading.Event()

    def interrupt(self) -> None:
        """Stop the server of the job in progress (from another thread: a spot notice).

        The job then fails fast and is recorded as failed (not done), so a relaunched shard
        runs it again; `should_stop` keeps the runner from starting another.
        """
        self._interrupted.set()
        with self._server_lock:
            server = self._server
        if server is not None:
            log.warning("interrupt: stopping %s", server.engine)
            try:
                server.stop(grace_s=5)
            except EngineError as exc:
                log.error("%s", exc)

    # -- bookkeeping -----------------------------------------------------------------

    def folder(self, job: Job, *, create: bool = False) -> JobFolder:
        return JobFolder(self.shard_dir / JOBS_DIR / job.job_id, create=create)

    def is_done(self, job: Job) -> bool:
        return self.folder(job).is_done

    def _write_record(self, job: Job, record: JobRecord) -> None:
        folder = self.folder(job)
        folder.finish(record)
        if self.results is not None:
            self.results.upload_job(job.job_id, folder.path)

    def _failed_on_disk(self) -> list[str]:
        """Jobs not done whose latest record says failed, whichever run wrote it."""
        failed = []
        for job in self.jobs:
            if self.is_done(job):
                continue
            try:
                record = self.folder(job).record()
            except (OSError, ValueError):
                failed.append(job.job_id)
                continue
            if record is not None and record.status == "failed":
                failed.append(job.job_id)
        return failed

    def _manifest(
        self,
        started: float,
        sampler: TelemetrySampler,
        engines: list[EngineServed],
        records: list[JobRecord],
        finished: float | None,
        earlier: Manifest | None = None,
    ) -> Manifest:
        this_run = RunSpan(
            started_unix_s=started,
            finished_unix_s=finished,
            jobs_run=[r.job_id for r in records],
        )
        runs = list(earlier.runs) if earlier else []
        if earlier and not runs:  # written before runs were listed: its own span
            runs = [
                RunSpan(
                    started_unix_s=earlier.started_unix_s,
                    finished_unix_s=earlier.finished_unix_s,
                )
            ]
        return Manifest(
            agent_version=AGENT_VERSION,
            git_sha=git_sha(),
            campaign=self.spec,
            shard=self.shard.name,
            host=host_info(),
            gpus=list(sampler.devices),
            nvidia_driver=self.gpu.driver,
            cuda=self.gpu.cuda,
            instance=self.instance,
            started_unix_s=earlier.started_unix_s if earlier else started,
            finished_unix_s=finished,
            engines=[*(earlier.engines if earlier else []), *engines],
            arms=[facts for arm in self.shard.arms if (facts := arm_facts(arm)) is not None],
            jobs=[j.job_id for j in self.jobs],
            jobs_ok=sorted({j.job_id for j in self.jobs if self.is_done(j)}),
            jobs_failed=self._failed_on_disk(),
            sampler=sampler.stats() if finished else None,
            runs=[*runs, this_run],
        )

    # -- the run ---------------------------------------------------------------------

    def run(self) -> RunOutcome:
        self.shard_dir.mkdir(parents=True, exist_ok=True)
        started = time.time()
        sampler = TelemetrySampler(self.shard_dir / TELEMETRY_FILE)
        sampler.start()
        engines: list[EngineServed] = []
        records: list[JobRecord] = []
        manifest_path = self.shard_dir / MANIFEST_FILE
        earlier = earlier_manifest(manifest_path, self.spec.name, self.shard.name)
        first = self._manifest(started, sampler, engines, records, None, earlier)
        write_atomic(manifest_path, first.model_dump_json(indent=2).encode())
        try:
            for arm in self.shard.arms:
                pending = [j for j in self.jobs if j.arm == arm and not self.is_done(j)]
                if not pending:
                    log.info("arm %s: every job done already; skipped", arm)
                    continue
                if self.should_stop():
                    break
                for job in pending:
                    aside = self.folder(job).set_aside_earlier_attempt()
                    if aside is not None:
                        log.info("job %s: earlier attempt's files moved to %s", job.job_id, aside)
                records += self._run_arm(arm, pending, sampler, engines)
        finally:
            stats = sampler.stop()
            log.info("telemetry: sampler CPU %.3f s per minute", stats.cpu_s_per_min)
            manifest = self._manifest(started, sampler, engines, records, time.time(), earlier)
            write_atomic(manifest_path, manifest.model_dump_json(indent=2).encode())
        return RunOutcome(shard_dir=self.shard_dir, manifest=manifest, records=records)

    def _index(self, job: Job) -> int:
        return self.jobs.index(job) + 1

    def _fail_all(
        self, jobs: list[Job], reason: str, engine: EngineServed | None, log_tail: str | None = None
    ) -> list[JobRecord]:
        now = time.time()
        out = []
        for job in jobs:
            record = JobRecord(
                job_id=job.job_id,
                arm=job.arm,
                item=job.item,
                status="failed",
                reason=reason,
                started_unix_s=now,
                finished_unix_s=now,
                engine=engine,
                server_log_tail=log_tail,
            )
            self._write_record(job, record)
            out.append(record)
        log.error("arm %s: %d job(s) failed: %s", jobs[0].arm, len(jobs), reason)
        self.status.set_phase("serving", error=reason)
        return out

    def _run_arm(
        self, arm: str, jobs: list[Job], sampler: TelemetrySampler, engines: list[EngineServed]
    ) -> list[JobRecord]:
        self.status.set_job(self._index(jobs[0]), len(self.jobs), jobs[0].job_id)
        try:
            recipe = campaign_recipe(self.spec, arm)
        except RecipeError as exc:
            return self._fail_all(jobs, str(exc), None)
        self.status.set_phase("installing")
        log.info("START install %s for %s", recipe.name, arm)
        try:
            installed = install_engine(
                recipe, self.gpu_cc, self.work_dir, should_stop=self._interrupted.is_set
            )
        except EngineInstallError as exc:
            return self._fail_all(jobs, str(exc), None, exc.log_tail)
        log.info("END install %s (%.1f s)", recipe.name, installed.install_s)
        source = self.spec.model.source_for(recipe.name)
        drafter_source = self.spec.drafter.source_for(recipe.name) if self.spec.drafter else None
        try:
            models = functools.partial(
                resolve_model,
                cache_dir=self.work_dir / "models",
                env=self._engine_env,
                should_stop=self._interrupted.is_set,
            )
            model = models(source or "")
            drafter = models(drafter_source) if drafter_source else None
            rerender = functools.partial(
                render,
                recipe,
                arm,
                self.gpu_cc,
                model,
                settings=self.spec.arm_settings(arm),
                drafter=drafter,
                python=installed.python,
                workdir=installed.folder,
            )
            served = rerender(port=choose_port(recipe.port))
        except (ModelResolveError, RecipeError) as exc:
            return self._fail_all(jobs, str(exc), None)
        version_text, binary_sha256 = identify(served, installed)
        engine = EngineServed(
            arm=arm,
            engine=served.engine,
            version=served.version,
            build_id=served.build_id,
            variant=served.variant,
            argv=list(served.argv),
            settings=dict(served.settings),
            model=model,
            drafter=served.drafter,
            install_s=installed.install_s,
            port=served.port,
            version_text=version_text,
            binary_sha256=binary_sha256,
            patches=list(installed.patches),
            extra_packages=list(installed.extra_packages),
            built_from_source=installed.built_from_source,
        )
        engines.append(engine)
        before_mib = gpu_memory_used_mib()
        records = self._serve_and_run(jobs, served, engines, installed, sampler, rerender)
        after_mib = gpu_memory_used_mib()
        if before_mib is not None and after_mib is not None:
            released = after_mib - before_mib < _GPU_MEMORY_SLACK_MIB
            if not released:
                log.error(
                    "%s: GPU memory not released after stop: %.0f MiB -> %.0f MiB",
                    served.engine,
                    before_mib,
                    after_mib,
                )
            engines[-1] = engines[-1].model_copy(update={"gpu_memory_released": released})
        return records

    def _start(
        self, served: RenderedServe, installed: InstalledEngine, log_path: Path
    ) -> tuple[EngineServer, ReadyResult]:
        for path, content in served.files.items():
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            Path(path).write_text(content)
        if port_in_use(served.port, "127.0.0.1"):
            raise EngineError(served.engine, f"port {served.port} is already in use")
        env = {
            **served.env,
            **{
                n: v
                for n in served.env_names
                if (v := self._engine_env.get(n) or os.environ.get(n))
            },
            "PATH": installed.path_env(),
        }
        server = EngineServer(
            served.engine, served.argv, log_path=log_path, env=env, port=served.port
        )
        server.start()
        # Registered before it is ready, so an interrupt during start-up stops it too.
        with self._server_lock:
            self._server = server
        if self._interrupted.is_set():
            server.stop(grace_s=5)
            raise EngineError(served.engine, "interrupted before it was ready")
        try:
            health_s = server.wait_healthy(served.health_url, served.ready.health_timeout_s)
            ready = wait_ready_sync(
                served.base_url,
                engine=served.engine,
                timeout_s=served.ready.first_completion_timeout_s,
                settings=served.request_settings(),
                health_s=health_s,
                alive=lambda: server.running,
            ).require()
        except (EngineError, NotReadyError):
            server.stop()
            raise
        return server, ready

    def _start_on_a_free_port(
        self,
        served: RenderedServe,
        installed: InstalledEngine,
        log_path: Path,
        rerender: Callable[..., RenderedServe],
    ) -> tuple[RenderedServe, EngineServer, ReadyResult]:
        """Start the server; when another process takes its port first, again on a free one.

        On a shared host the recipe's port can be free when chosen and taken before the
        engine binds it (a model loads before the socket opens).
        """
        for attempt in range(_PORT_ATTEMPTS):
            if port_in_use(served.port):
                served = rerender(port=free_port())
            try:
                server, ready = self._start(served, installed, log_path)
                return served, server, ready
            except (EngineError, NotReadyError):
                # Our group is stopped by now: a port still in use is someone else's.
                if attempt + 1 == _PORT_ATTEMPTS or not port_in_use(served.port):
                    raise
                log.warning("port %d was taken during start-up; again on a free port", served.port)
        raise AssertionError("unreachable")

    def _serve_and_run(
        self,
        jobs: list[Job],
        served: RenderedServe,
        engines: list[EngineServed],
        installed: InstalledEngine,
        sampler: TelemetrySampler,
        rerender: Callable[..., RenderedServe],
    ) -> list[JobRecord]:
        engine = engines[-1]
        log_path = self.shard_dir / "servers" / f"{engine.arm}.log"
        log_path.parent.mkdir(parents=True, exist_ok=True)
        records: list[JobRecord] = []
        server: EngineServer | None = None
        ready: ReadyResult | None = None
        try:
            for job in jobs:
                if self.should_stop():
                    break
                self.status.set_job(self._index(job), len(self.jobs), job.job_id)
                if server is None or not server.running:
                    self.status.set_phase("serving")
                    log.info("START serve %s", engine.arm)
                    try:
                        served, server, ready = self._start_on_a_free_port(
                            served, installed, log_path, rerender
                        )
                    except (EngineError, NotReadyError) as exc:
                        log_tail = getattr(exc, "log_tail", None) or tail(log_path, LOG_TAIL_LINES)
                        records += self._fail_all(
                            jobs[jobs.index(job) :], str(exc), engine, log_tail
                        )
                        break
                    if served.port != engine.port:
                        engine = engine.model_copy(
                            update={"port": served.port, "argv": list(served.argv)}
                        )
                        engines[-1] = engine
                    with self._server_lock:
                        self._server = server
                    sampler.track_process(server.pid)
                records.append(self._run_job(job, served, engine, server, ready, log_path, sampler))
        finally:
            with self._server_lock:
                self._server = None
            if server is not None:
                log.info("END serve %s", engine.arm)
                try:
                    server.stop()
                except EngineError as exc:
                    log.error("%s", exc)
            sampler.track_process(None)
        return records

    def _run_job(
        self,
        job: Job,
        served: RenderedServe,
        engine: EngineServed,
        server: EngineServer,
        ready: ReadyResult | None,
        log_path: Path,
        sampler: TelemetrySampler,
    ) -> JobRecord:
        folder = self.folder(job, create=True)
        offset = log_path.stat().st_size if log_path.exists() else 0
        self.status.set_phase(_PHASE_OF_ITEM[job.item])
        log.info("START job %s", job.job_id)
        started = time.time()
        sampler.set_job(job.job_id)
        reason: str | None = None
        output_tokens: int | None = None
        try:
            output_tokens = asyncio.run(self.items.run(job.job_id, job.item, served, folder))
        except IncompleteJob as exc:
            reason = str(exc)
        except Exception as exc:  # a job's failure is data; the campaign goes on
            reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        finally:
            sampler.set_job(None)
        if not server.running:
            # Whatever the job recorded, a server that died under it makes the job not done.
            died = f"server exited during the job (code {server.returncode})"
            reason = f"{died}; {reason}" if reason else died
        if self._interrupted.is_set():
            reason = "interrupted (the machine is being taken away); rerun to measure"
        folder.copy_server_log(log_path, offset)
        telemetry = sampler.summary(job.job_id, output_tokens)
        record = JobRecord(
            job_id=job.job_id,
            arm=job.arm,
            item=job.item,
            status="failed" if reason else "ok",
            reason=reason,
            started_unix_s=started,
            finished_unix_s=time.time(),
            engine=engine,
            health_s=ready.health_s if ready else None,
            first_completion_s=ready.first_completion_s if ready else None,
            ready_s=ready.ready_s if ready else None,
            output_tokens=output_tokens,
            server_log_tail=folder.server_log_tail(LOG_TAIL_LINES) if reason else None,
            telemetry=telemetry,
        )
        self._write_record(job, record)
        log.info("END job %s: %s%s", job.job_id, record.status, f" ({reason})" if reason else "")
        return record
