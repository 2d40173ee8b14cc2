"""`bench report DIR` over standalone folders: `bench probe|sweep|eval` results shown as a
one-shard campaign, so the report's tables and plots need nothing of their own for them.

DIR is one standalone folder (it holds `standalone.json`) or a folder right above several.
Each server+model measured becomes one arm, named after the model; each folder becomes that
arm's job for its item (probe, sweep, gsm8k, bfcl). The view is built in a scratch folder
of links and a synthesised `manifest.json`; the results themselves are never touched.
"""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from contract.evals import EvalSummary
from contract.jobs import MANIFEST_FILE, Manifest
from contract.layout import JOBS_DIR
from contract.results import SUMMARY_FILE
from contract.spec import CampaignSpec, ModelSpec, ShardSpec, SuiteSpec
from contract.standalone import STANDALONE_FILE, StandaloneManifest
from report.load import ResultsError

__all__ = ["standalone_folders", "standalone_view"]

_SHARD = "standalone"
_EVAL_ITEMS = {"gsm8k": "gsm8k", "bfcl_simple": "bfcl"}


def standalone_folders(root: Path) -> list[Path]:
    """`root` itself when it is a standalone folder, else the standalone folders right in it."""
    if (root / MANIFEST_FILE).is_file():
        return []
    if (root / STANDALONE_FILE).is_file():
        return [root]
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if (p / STANDALONE_FILE).is_file())


def _arm_name(model: str, base_url: str, taken: dict[tuple[str, str], str]) -> str:
    key = (base_url, model)
    if key not in taken:
        slug = re.sub(r"[^a-z0-9-]+", "-", model.lower().split("/")[-1]).strip("-") or "server"
        name = slug
        n = 2
        while name in taken.values():
            name = f"{slug}-{n}"
            n += 1
        taken[key] = name
    return taken[key]


def _item(folder: Path, manifest: StandaloneManifest) -> str:
    if manifest.kind != "eval":
        return manifest.kind
    summary = EvalSummary.model_validate_json((folder / SUMMARY_FILE).read_bytes())
    return _EVAL_ITEMS[summary.eval]


def standalone_view(root: Path, scratch: Path) -> Path | None:
    """A campaign-shaped view of the standalone folders under `root` (None if there are none).

    Raises ResultsError (one line) when two folders are the same item of the same server.
    """
    folders = standalone_folders(root)
    if not folders:
        return None
    arms: dict[tuple[str, str], str] = {}
    jobs: dict[str, Path] = {}
    manifests: list[StandaloneManifest] = []
    for folder in folders:
        manifest = StandaloneManifest.model_validate_json((folder / STANDALONE_FILE).read_bytes())
        if not (folder / SUMMARY_FILE).is_file():
            continue
        manifests.append(manifest)
        model = manifest.models[0] if manifest.models else "server"
        arm = _arm_name(model, manifest.base_url, arms)
        job = f"{arm}-{_item(folder, manifest)}"
        if job in jobs:
            raise ResultsError(f"{folder} and {jobs[job]} are both {job}; report them apart")
        jobs[job] = folder
    if not manifests:
        return None
    first = manifests[0]
    suite: dict[str, object] = {"probe": None, "sweep": None}
    for job, folder in jobs.items():
        item = job.rsplit("-", 1)[1]
        settings = StandaloneManifest.model_validate_json(
            (folder / STANDALONE_FILE).read_bytes()
        ).settings
        suite.setdefault(item, settings)
        if suite[item] is None:
            suite[item] = settings
    spec = CampaignSpec(
        name="standalone",
        description="bench probe/sweep/eval runs against servers already running",
        model=ModelSpec(name=first.models[0] if first.models else "server", sources={"-": "-"}),
        shards=(
            ShardSpec(
                name=_SHARD, instance_type="local", arms=tuple(dict.fromkeys(arms.values()))
            ),
        ),
        suite=SuiteSpec.model_validate(suite),
    )
    started = min(m.written_unix_s for m in manifests)
    shard_manifest = Manifest(
        agent_version=first.tool_version,
        git_sha=first.git_sha,
        campaign=spec,
        shard=_SHARD,
        host=first.host,
        gpus=[],
        started_unix_s=started,
        finished_unix_s=max(m.written_unix_s for m in manifests),
        jobs=list(jobs),
        jobs_ok=list(jobs),
    )
    view = scratch / _SHARD
    (view / JOBS_DIR).mkdir(parents=True, exist_ok=True)
    (view / MANIFEST_FILE).write_bytes(orjson.dumps(shard_manifest.model_dump(mode="json")))
    for job, folder in jobs.items():
        (view / JOBS_DIR / job).symlink_to(folder.resolve(), target_is_directory=True)
    return view
