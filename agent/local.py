"""`bench run`: a campaign on this machine, with no cloud: every shard in turn, here.

The embedded default (`agent/campaigns/local.toml`) serves tiny generated models with our
PyTorch engine and llama.cpp; any campaign spec runs the same way. Results go to
`<out>/<campaign>/<shard>/`, laid out exactly as an instance uploads them; installs and
models go to a work dir that outlives runs (llama.cpp's build is cached there).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from agent.campaigns import LOCAL_DEFAULT
from agent.gpu import detect_gpu
from agent.runner import CampaignRunner, RunOutcome
from contract.spec import load_campaign
from engines.campaign import check_campaign

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
        outcomes.append(runner.run())
    return outcomes
