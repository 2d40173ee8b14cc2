"""`bench run`: a campaign on this machine, with no cloud: every shard in turn, here.

The embedded default (`agent/campaigns/local.toml`) serves tiny generated models with our
PyTorch engine and llama.cpp; any campaign spec runs the same way. Results go to
`<out>/<campaign>/<shard>/`, laid out exactly as an instance uploads them (with the agent's
log, START/END per step, as `agent.log`); installs and models go to a work dir that outlives
runs (llama.cpp's build is cached there). A spec with arms that need a GPU is refused before
anything runs on a host without one.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.campaigns import LOCAL_DEFAULT
from agent.gpu import detect_gpu
from agent.runner import CampaignRunner, RunOutcome
from contract.jobs import AGENT_LOG_FILE
from contract.spec import SpecError, load_campaign
from engines.campaign import arms_needing_gpu, check_campaign

__all__ = ["default_work_dir", "run_campaign_here"]

log = logging.getLogger(__name__)


def default_work_dir() -> Path:
    root = os.environ.get("BENCH_CACHE_DIR") or Path.home() / ".cache" / "llm-serving-bench"
    return Path(root) / "work"


def run_campaign_here(
    spec_path: Path | None,
    out_root: Path,
    *,
    work_dir: Path | None = None,
    gsm8k_data: Path | None = None,
) -> list[RunOutcome]:
    spec = check_campaign(load_campaign(spec_path or LOCAL_DEFAULT))
    gpu = detect_gpu()
    if gpu.compute_capability is None and (needing := arms_needing_gpu(spec)):
        raise SpecError(
            f"{spec.name}: arm(s) {', '.join(needing)} need an NVIDIA GPU and this machine "
            "has none; run the spec with `bench launch`, or drop those arms"
        )
    log.info(
        "campaign %s: %d shard(s) here; GPU: %s",
        spec.name,
        len(spec.shards),
        f"{gpu.name} (cc {gpu.compute_capability})" if gpu.compute_capability else "none",
    )
    outcomes = []
    for shard in spec.shards:
        runner = CampaignRunner(
            spec,
            shard,
            out_root / spec.name / shard.name,
            work_dir or default_work_dir(),
            gpu=gpu,
            gsm8k_data=gsm8k_data,
        )
        outcomes.append(_with_agent_log(runner))
    return outcomes


def _with_agent_log(runner: CampaignRunner) -> RunOutcome:
    """Run one shard with the agent's log also written to `<shard>/agent.log`, as on AWS."""
    runner.shard_dir.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(runner.shard_dir / AGENT_LOG_FILE)
    handler.setLevel(logging.INFO)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    previous_level = root.level
    if root.level > logging.INFO or root.level == logging.NOTSET:
        root.setLevel(logging.INFO)
    root.addHandler(handler)
    try:
        return runner.run()
    finally:
        root.removeHandler(handler)
        root.setLevel(previous_level)
        handler.close()
