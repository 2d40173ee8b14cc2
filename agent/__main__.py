"""`python -m agent`: what user data starts on a GPU instance (as root, in /var/lib/bench).

Who it is comes from the instance itself (IMDSv2 tags: campaign and shard); what to do from
the campaign spec in S3; the HF token from Secrets Manager into the engines' environment
only. Status goes to SSM at every phase change and as a heartbeat; each finished job is
uploaded at once; jobs S3 already has as done are restored and skipped (a relaunched shard
resumes). A spot notice or SIGTERM stops whatever phase runs (install, download, start-up,
a job), uploads what is done and marks the shard `interrupted`. A failure before the jobs
(the spec missing or unreadable, the HF token unset, the restore from S3) is published as
`failed` with its reason. At the end: the tarball and manifest, uploads retried while the
instance stays up (bounded) if S3 is unreachable, the status, then the end action: the
agent owns the power-off (at once when done, after a grace period when failed, never with
`end_action = "stay"`), and a watchdog publishes `failed` and powers off at the spec's max
runtime whatever happens. The systemd unit powers off only if the agent itself crashes.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path

from agent.aws.bucket import UploadError, results_uri
from agent.aws.imds import ImdsClient, ImdsError
from agent.aws.lifecycle import EndAction, MaxRuntimeWatchdog, default_power_off, end_of_run
from agent.aws.restore import download_spec, restore_done_jobs
from agent.aws.secrets import SecretError, SecretRedactingFilter, engine_env, read_hf_token
from agent.aws.spot import SpotWatcher
from agent.aws.status import StatusPublisher
from agent.aws.tarball import make_tarball
from agent.aws.uploader import ResultsUploader
from agent.gpu import detect_gpu
from agent.runner import CampaignRunner
from contract.jobs import MANIFEST_FILE
from contract.layout import FAILURE_GRACE_MIN, TARBALL_FILE
from contract.spec import SpecError, load_campaign
from engines.campaign import check_campaign

log = logging.getLogger("agent")

UPLOAD_DRAIN_S = 600.0
SPOT_DRAIN_S = 90.0
# Uploads still pending after the drain: the instance stays up this long, retrying.
PENDING_KEEP_S = float(os.environ.get("BENCH_PENDING_KEEP_S", "3600"))
UPLOAD_RETRY_S = 300.0


def _logging(work_dir: Path) -> None:
    work_dir.mkdir(parents=True, exist_ok=True)
    handlers: list[logging.Handler] = [
        logging.FileHandler(work_dir / "agent.log"),
        logging.StreamHandler(sys.stderr),
    ]
    for handler in handlers:
        handler.addFilter(SecretRedactingFilter())
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=handlers, force=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agent", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--work-dir",
        type=Path,
        default=Path.cwd(),
        help="where installs, models, results and agent.log go (cwd)",
    )
    args = parser.parse_args(argv)
    work_dir: Path = args.work_dir
    _logging(work_dir)

    imds = ImdsClient()
    try:
        identity = imds.identity()
        campaign, shard_name = imds.campaign_and_shard()
    except ImdsError as exc:
        # No campaign, no status to publish: the unit's OnFailure powers off after the grace.
        log.error("cannot tell which campaign and shard this instance runs: %s", exc)
        return 2
    log.info(
        "START agent: campaign %s shard %s on %s (%s, %s)",
        campaign,
        shard_name,
        identity.instance_id,
        identity.instance_type,
        identity.market,
    )
    status = StatusPublisher(
        campaign,
        shard_name,
        instance_id=identity.instance_id,
        market=identity.market,
        results_uri=results_uri(campaign, shard_name),
    ).start()
    status.set_phase("booting")
    power_off = default_power_off()
    end_action: EndAction = "terminate"

    def give_up(reason: str) -> int:
        """Publish `failed` with the reason, then the end action after the grace period."""
        log.error("%s", reason)
        status.set_phase("failed", error=reason)
        status.close()
        end_of_run(end_action, reason, power_off, delay_min=FAILURE_GRACE_MIN)
        return 0

    try:
        spec = check_campaign(load_campaign(download_spec(campaign, work_dir / "spec.toml")))
        shard = spec.shard(shard_name)
    except (SpecError, UploadError, OSError) as exc:
        return give_up(f"spec: {exc}")
    end_action = spec.end_action
    try:
        env = engine_env(read_hf_token())
    except SecretError as exc:
        return give_up(f"HF token: {exc}")
    shard_dir = work_dir / "results" / campaign / shard_name
    try:
        restored = restore_done_jobs(campaign, shard_name, shard_dir)
    except (UploadError, OSError) as exc:
        return give_up(f"resuming: {exc}")
    if restored:
        log.info("resuming: %d job(s) already done in S3: %s", len(restored), sorted(restored))
    uploader = ResultsUploader(
        campaign, shard_name, shard_dir, on_backlog=status.set_uploads
    ).start()

    def on_max_runtime() -> None:
        # The watchdog powers off after this, whatever the end action.
        pending = uploader.drain(SPOT_DRAIN_S)
        status.set_phase(
            "failed",
            error=f"max runtime {spec.max_runtime_h:g} h reached; "
            f"{len(pending)} upload(s) pending; powering off",
        )
        status.close()

    watchdog = MaxRuntimeWatchdog(
        spec.max_runtime_h * 3600, power_off, on_expire=on_max_runtime
    ).start()
    interrupted = threading.Event()
    interrupt_published = threading.Event()
    interrupt_lock = threading.Lock()
    runner = CampaignRunner(
        spec,
        shard,
        shard_dir,
        work_dir,
        gpu=detect_gpu(),
        engine_env=env,
        status=status,
        results=uploader,
        instance={**identity.model_dump(), "market": identity.market},
        should_stop=interrupted.is_set,
    )

    def interrupt(reason: str) -> None:
        """Stop whatever phase runs, upload what is done (bounded), publish `interrupted`.

        Runs on the spot watcher's thread or a signal's helper thread, so the status is
        right even while the main thread is still inside an install or a download.
        """
        with interrupt_lock:
            if interrupted.is_set():
                return
            interrupted.set()
        log.warning("%s; stopping the current phase", reason)
        runner.interrupt()
        # No tarball comes after an interruption: the logs go up loose, in a folder of this
        # instance's own, so a relaunched shard's tarball never disagrees with them.
        logs = shard_dir / "logs" / f"interrupted-{identity.instance_id}"
        _collect_logs(work_dir, logs, secrets=[v for v in env.values() if v])
        uploader.upload_logs(logs)
        pending = uploader.drain(SPOT_DRAIN_S)
        status.set_phase("interrupted", error=f"{reason}; {len(pending)} upload(s) pending")
        status.close()
        interrupt_published.set()

    # AWS posts the notice two minutes ahead and suggests polling every 5 s.
    SpotWatcher(
        imds,
        lambda notice: interrupt(f"spot notice ({notice.action})"),
        poll_s=float(os.environ.get("BENCH_SPOT_POLL_S", "5")),
    ).start()
    # systemd stops the unit with SIGTERM when the machine shuts down (a spot termination
    # included); a signal handler must return quickly, so a thread does the work.
    signal.signal(
        signal.SIGTERM,
        lambda signum, frame: threading.Thread(
            target=interrupt, args=("SIGTERM: the instance is stopping",), daemon=True
        ).start(),
    )
    outcome = runner.run()
    if interrupted.is_set():
        interrupt_published.wait(SPOT_DRAIN_S + 30)
        watchdog.cancel()
        log.info("END agent: interrupted")
        return 3
    if watchdog.expired:
        return 0
    status.set_phase("uploading")
    _collect_logs(work_dir, shard_dir / "logs", secrets=[v for v in env.values() if v])
    tarball = make_tarball(shard_dir, work_dir / TARBALL_FILE)
    uploader.upload_final(shard_dir / MANIFEST_FILE, tarball)
    pending = _upload_or_keep_trying(uploader, status, interrupted)
    failed = [r.job_id for r in outcome.failed]
    failed_run = True
    if pending:
        reason = (
            f"results kept on disk only, S3 uploads pending after {PENDING_KEEP_S:.0f} s of "
            f"retries: {pending}"
        )
        status.set_phase("failed", error=reason)
    elif failed and len(failed) == len(outcome.records):
        reason = f"every job failed: {outcome.failed[0].reason}"
        status.set_phase("failed", error=reason)
    else:
        failed_run = False
        reason = "campaign shard finished"
        status.set_phase("done", error=f"failed jobs: {', '.join(failed)}" if failed else None)
    status.close()
    watchdog.cancel()
    log.info("END agent: %d job(s), %d failed", len(outcome.records), len(failed))
    end_of_run(end_action, reason, power_off, delay_min=FAILURE_GRACE_MIN if failed_run else 0)
    return 0


# Logs that live outside the shard folder and would go with the instance; copied into
# `<shard>/logs/` so the tarball carries them.
CLOUD_INIT_LOG = Path("/var/log/cloud-init-output.log")


def _collect_logs(work_dir: Path, dest: Path, *, secrets: list[str]) -> None:
    """Copy the agent log, each engine's install.log and build.log (llama.cpp's CMake output)
    and cloud-init's output into dest, as `<engine>-install.log` and `<engine>-build.log`,
    with every secret value replaced (the agent log is redacted as written already)."""
    sources = [work_dir / "agent.log", CLOUD_INIT_LOG]
    engines = work_dir / "engines"
    sources += sorted([*engines.glob("*/install.log"), *engines.glob("*/build.log")])
    for source in sources:
        try:
            text = source.read_text(errors="replace")
        except OSError:
            continue
        for secret in secrets:
            text = text.replace(secret, "***")
        in_engine = source.parent.parent == engines
        name = f"{source.parent.name}-{source.name}" if in_engine else source.name
        try:  # a log that cannot be copied must not cost the results' upload or the status
            dest.mkdir(parents=True, exist_ok=True)
            (dest / name).write_text(text)
        except OSError as exc:
            log.warning("logs: cannot copy %s to %s: %s", source, dest, exc)


def _upload_or_keep_trying(
    uploader: ResultsUploader, status: StatusPublisher, interrupted: threading.Event
) -> list[str]:
    """Drain the uploads; while some stay pending, keep the instance up and retrying, bounded.

    The root volume goes with the instance, so results left on disk at power-off are lost:
    waiting (at most `PENDING_KEEP_S`, within the max-runtime watchdog) costs minutes of
    instance time, losing them costs the run.
    """
    deadline = time.monotonic() + PENDING_KEEP_S
    pending = uploader.drain(min(UPLOAD_DRAIN_S, PENDING_KEEP_S))
    while pending and not interrupted.is_set():
        left = deadline - time.monotonic()
        if left <= 0:
            break
        status.set_error(f"S3 uploads pending, instance kept up and retrying: {pending}")
        pending = uploader.drain(min(UPLOAD_RETRY_S, left))
    return uploader.close(0.0) if pending else uploader.close(UPLOAD_DRAIN_S)


if __name__ == "__main__":
    raise SystemExit(main())
