"""One report over several results folders: `bench report A B [C...] [--label l4,t4]`.

Each folder is read as `report.load` reads one (a campaign, a shard, or a standalone sweep
or probe folder with its `summary.json` and no manifest), then tagged with its label: its
shards become `shard@label` and its arms `arm@label`, so the tables tell them apart and the
per-GPU tables group by label. Labels default to the folder names, made unique.
"""

from __future__ import annotations

import platform
import re
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from pydantic import ValidationError

from contract.jobs import HostInfo, Manifest
from contract.results import SUMMARY_FILE, ProbeSummary, SweepSummary
from contract.spec import CampaignSpec, ModelSpec, ShardSpec, SuiteSpec
from report.load import (
    ArmResults,
    CampaignResults,
    ResultsError,
    ShardResults,
    find_shards,
    load_campaign_results,
)

__all__ = ["load_folders", "load_standalone"]

_LABEL = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")


def _slug(text: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-.") or "run"
    return cleaned[:40]


def load_standalone(folder: Path) -> CampaignResults:
    """A `bench sweep` or `bench probe` folder without a manifest: one arm, named after the
    folder, on this machine ("local"), its settings from its summary.

    Raises:
        ResultsError: no readable summary.json in the folder.
    """
    path = folder / SUMMARY_FILE
    if not path.is_file():
        raise ResultsError(f"{folder}: no manifest.json below it and no {SUMMARY_FILE} in it")
    text = path.read_bytes()
    sweep: SweepSummary | None = None
    probe: ProbeSummary | None = None
    try:
        if b'"kind":"probe"' in text.replace(b" ", b""):
            probe = ProbeSummary.model_validate_json(text)
        else:
            sweep = SweepSummary.model_validate_json(text)
    except (ValidationError, ValueError) as exc:
        first = (str(exc).splitlines() or ["unreadable"])[0]
        raise ResultsError(f"{path}: not a sweep or probe summary ({first})") from exc
    summary: SweepSummary | ProbeSummary = sweep or probe  # type: ignore[assignment]
    arm = _slug(folder.resolve().name)
    item = "sweep" if sweep else "probe"
    spec = CampaignSpec(
        name=re.sub(r"[^a-z0-9-]+", "-", f"standalone-{arm}".lower())[:48].strip("-"),
        description=f"standalone `bench {item}` against {summary.base_url}",
        model=ModelSpec(name=summary.model, sources={"default": summary.model}),
        shards=(ShardSpec(name="here", instance_type="local", arms=(arm,)),),
        suite=SuiteSpec(
            probe=probe.settings if probe else None, sweep=sweep.settings if sweep else None
        ),
    )
    manifest = Manifest(
        agent_version="standalone",
        git_sha=None,
        campaign=spec,
        shard="here",
        host=HostInfo(
            hostname="-", os="-", python=platform.python_version(), cpu="-", cpus=0, memory_mib=0
        ),
        gpus=[],
        started_unix_s=summary.started_unix_s,
        finished_unix_s=summary.finished_unix_s,
    )
    results = ArmResults(
        shard="here",
        arm=arm,
        label=arm,
        engine=None,
        instance_type="local",
        job_dirs={item: folder},
        probe=probe,
        sweep=sweep,
    )
    shard = ShardResults(path=folder, manifest=manifest, arms=[results])
    return CampaignResults(root=folder, shards=[shard])


def _load_one(folder: Path) -> CampaignResults:
    if folder.is_dir() and not find_shards(folder) and (folder / SUMMARY_FILE).is_file():
        return load_standalone(folder)
    return load_campaign_results(folder)


def _labels(folders: Sequence[Path], labels: Sequence[str] | None) -> list[str]:
    if labels:
        if len(labels) != len(folders):
            raise ResultsError(
                f"--label gives {len(labels)} labels for {len(folders)} folders: one per folder"
            )
        bad = [label for label in labels if not _LABEL.match(label)]
        if bad:
            raise ResultsError(f"--label {bad[0]!r}: use letters, digits, '.', '_' or '-'")
        if len(set(labels)) != len(labels):
            raise ResultsError("--label: each folder needs its own label")
        return list(labels)
    out: list[str] = []
    for folder in folders:
        base = _slug(folder.resolve().name)
        label, n = base, 2
        while label in out:
            label, n = f"{base}-{n}", n + 1
        out.append(label)
    return out


def load_folders(folders: Sequence[Path], labels: Sequence[str] | None = None) -> CampaignResults:
    """One folder read as it is; several read each, tagged with their labels, joined.

    Raises:
        ResultsError: a folder that is not results, or labels that do not fit the folders.
    """
    if len(folders) == 1 and not labels:
        return _load_one(folders[0])
    tags = _labels(folders, labels)
    shards: list[ShardResults] = []
    problems: list[str] = []
    for folder, tag in zip(folders, tags, strict=True):
        results = _load_one(folder)
        problems += [f"[{tag}] {p}" for p in results.problems]
        for shard in results.shards:
            tagged = replace(shard, site=tag, arms=[])
            tagged.arms.extend(
                replace(a, shard=tagged.name, label=f"{a.label}@{tag}", site=tag)
                for a in shard.arms
            )
            shards.append(tagged)
    return CampaignResults(
        root=folders[0],
        shards=shards,
        problems=problems,
        folders=list(zip(tags, folders, strict=True)),
    )
