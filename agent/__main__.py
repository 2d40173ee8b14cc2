"""`python -m agent`: what user data starts on a GPU instance (as root, in /var/lib/bench).

Who it is comes from the instance itself (IMDSv2 tags: campaign and shard); what to do from
the campaign spec in S3; the HF token from Secrets Manager into the engines' environment
only. Status goes to SSM at every phase change and as a heartbeat; each finished job is
uploaded at once; jobs S3 already has as done are restored and skipped (a relaunched shard
resumes). A spot notice stops the current job, uploads what is done and marks the shard
`interrupted`. At the end: the tarball and manifest, the status, then the end action, and
a watchdog powers off at the spec's max runtime whatever happens.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
from pathlib import Path

from agent.aws.imds import ImdsClient
from agent.aws.lifecycle import MaxRuntimeWatchdog, default_power_off, end_of_run
from agent.aws.secrets import SecretRedactingFilter, engine_env, read_hf_token
from agent.aws.spot import SpotWatcher
from agent.aws.status import StatusPublisher
from agent.aws.uploader import (
    ResultsUploader,
    download_spec,
    make_tarball,
    restore_done_jobs,
    results_uri,
)
from agent.gpu import detect_gpu
from agent.runner import CampaignRunner
from contract.jobs import MANIFEST_FILE
from contract.layout import TARBALL_FILE
from contract.spec import SpecError, load_campaign
from engines.campaign import check_campaign

log = logging.getLogger("agent")

UPLOAD_DRAIN_S = 600.0
SPOT_DRAIN_S = 90.0


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
    identity = imds.identity()
    campaign, shard_name = imds.campaign_and_shard()
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
    try:
        spec = check_campaign(load_campaign(download_spec(campaign, work_dir / "spec.toml")))
        shard = spec.shard(shard_name)
    except SpecError as exc:
        log.error("spec: %s", exc)
        status.set_phase("failed", error=str(exc))
        status.close()
        end_of_run("terminate", f"bad spec: {exc}", power_off)
        return 2
    MaxRuntimeWatchdog(spec.max_runtime_h * 3600, power_off).start()
    env = engine_env(read_hf_token())
    shard_dir = work_dir / "results" / campaign / shard_name
    restored = restore_done_jobs(campaign, shard_name, shard_dir)
    if restored:
        log.info("resuming: %d job(s) already done in S3: %s", len(restored), sorted(restored))
    uploader = ResultsUploader(
        campaign, shard_name, shard_dir, on_backlog=status.set_uploads
    ).start()
    interrupted = threading.Event()
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

    def on_spot_notice(notice: object) -> None:
        log.warning("spot interruption notice: %s; stopping the current job", notice)
        interrupted.set()
        runner.interrupt()

    # AWS posts the notice two minutes ahead and suggests polling every 5 s.
    SpotWatcher(
        imds, on_spot_notice, poll_s=float(os.environ.get("BENCH_SPOT_POLL_S", "5"))
    ).start()
    outcome = runner.run()
    status.set_phase("uploading")
    if interrupted.is_set():
        pending = uploader.drain(SPOT_DRAIN_S)
        status.set_phase("interrupted", error=f"spot notice; {len(pending)} upload(s) pending")
        status.close()
        log.info("END agent: interrupted")
        return 3
    tarball = make_tarball(shard_dir, work_dir / TARBALL_FILE)
    uploader.upload_final(shard_dir / MANIFEST_FILE, tarball)
    pending = uploader.close(UPLOAD_DRAIN_S)
    failed = [r.job_id for r in outcome.failed]
    if pending:
        status.set_phase("failed", error=f"results kept on disk: S3 uploads pending: {pending}")
    elif failed and len(failed) == len(outcome.records):
        status.set_phase("failed", error=f"every job failed: {outcome.failed[0].reason}")
    else:
        status.set_phase("done", error=f"failed jobs: {', '.join(failed)}" if failed else None)
    status.close()
    log.info("END agent: %d job(s), %d failed", len(outcome.records), len(failed))
    end_of_run(spec.end_action, "campaign shard finished", power_off)
    return 0 if not failed and not pending else 1


if __name__ == "__main__":
    raise SystemExit(main())
