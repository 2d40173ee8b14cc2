"""The cloud path rehearsed end to end, as an instance runs it, against moto on loopback.

moto (server mode, 127.0.0.1) holds the synthesized BenchStack; the agent asset, zipped from
the folder CDK staged, is put where the rendered user data fetches it. `bench launch` starts a
two-shard campaign: s0 runs llama.cpp on a tiny generated model and our PyTorch engine on
`random:tiny-gemma4`, s1 runs llama.cpp; every arm gets the probe, a one-cell sweep and two
BFCL questions (bfcl-eval, installed `--no-deps` by `agent/install.sh`, checks the answers).
For each instance the user data's own commands, taken from the launch template moto holds,
fetch the asset (the system Python's boto3, as on the AMI), unzip it and run
`agent/install.sh` into a fresh virtual environment; the agent starts with the unit's
ExecStart arguments and the environment file's lines, its identity and tags served by a fake
IMDSv2 with the instance's id. The PyTorch engine's environment is created by its recipe from
nothing, under the rehearsal's own cache root. One shard gets a spot notice during its
engine's start-up and publishes `interrupted`; `bench cleanup` leaves its relaunched instance
alone while the new agent boots; the relaunch resumes and both shards end `done`; `bench
fetch` verifies the tarballs, which carry the logs (agent, each engine's install log,
llama.cpp's build log); `bench report` renders the campaign; `bench cleanup` leaves nothing
running and deletes the status parameters, after which `bench status` still shows both shards
done (from the manifests in S3).

What the user data does that cannot run here, and how it is checked instead:
- CDK publishing the asset at deploy: the staged folder is zipped and put at the asset URI
  the rendered user data names (tests/infra/test_stack.py checks the key is the asset's).
- cloud-init, systemd and the unit file: the unit's ExecStart and the environment file are
  parsed out of the rendered user data and used as they stand; tests/infra/test_user_data.py
  shellchecks the script and verifies the units with systemd-analyze where present.
- apt-get (python3-venv, boto3, cmake, cuRAND's dev package), rustup, the max-lifetime
  shutdown: not run; shellcheck and the tests of the rendered text cover them, and
  tests/infra/test_user_data.py runs `ensure_curand_dev` against toolkit trees with a
  recording apt-get.
- The AMI's python3: this machine's python3 builds the agent's environment; the fetch runs
  with an interpreter that has boto3, as the DLAMI's system Python does.
- The llama.cpp CUDA build: the recipe's cached CPU build is reused (LLAMA_SERVER_BIN),
  which is what its build cache would give a second instance; its build log is the one
  beside that binary (tests/engines/builds/test_llamacpp.py copies a failed build's log).
- The pip cache on the instance store (`PIP_CACHE_DIR` under the cache root, filled by the
  first pip engine and reused by the next arm): here pip's cache of this machine, so the torch
  CPU wheel is fetched once per machine, not once per run (on a fresh CI machine
  tests/infra/test_agent_install.py, which runs first, has fetched it); the environment
  itself is built from nothing every run.
- A hub model download: the campaign's models are generated or built in code (no hub here);
  tests/agent/aws/test_agent_process.py downloads through huggingface_hub from a fake hub and
  stops it with a spot notice.
- Power-off: BENCH_POWEROFF_FILE records it; terminating the instance is done in moto.
- The two agents run one after the other here (one shared 2-core host).
- moto's CloudFormation does not keep the HF-token secret it answers for: the test makes it
  and points the agents at it.

Time, on the shared 2-core host with other builds running: 389 s in all, of which the agent's
environment from the asset about 1.5 min and the PyTorch engine's environment 204 s (torch
from pip's cache; the longest part); every job of both shards about a minute; llama.cpp is
not rebuilt.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Any

import boto3
import pytest

from contract.layout import TAG_SHARD, status_parameter_name
from control.stack import StackOutputs
from tests.control.conftest import live_instances, moto_template, run_bench, stack, tags_of
from tests.fixtures.fake_imds import fake_imds
from tests.fixtures.moto_server import MotoServer
from tests.fixtures.processes import ended_at_exit

__all__ = ["ended_at_exit", "moto_template", "stack"]  # fixtures used here

# Past pytest's 600 s default: the PyTorch environment alone took 204 s on a loaded host.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1500)]

CAMPAIGN = "rehearsal"
SPEC = f"""
name = "{CAMPAIGN}"
end_action = "terminate"
max_runtime_h = 2
[model]
name = "tiny"
sources = {{ llamacpp = "generated:tiny-llama", pytorch = "random:tiny-gemma4" }}
[[shards]]
name = "s0"
instance_type = "g6.xlarge"
arms = ["llama", "pytorch"]
[[shards]]
name = "s1"
instance_type = "g6.xlarge"
arms = ["llama"]
[arms.llama]
settings = {{ n_gpu_layers = "0", flash_attn = "off", parallel = 2, ctx_size = 4096 }}
[arms.pytorch]
settings = {{ max_running = 4 }}
[suite.probe]
output_tokens = 8
repeats = 1
at_once = 2
[suite.sweep]
shapes = ["32/8"]
levels = [1]
repeats = 1
[suite.bfcl]
limit = 2
max_tokens = 16
"""


def _clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in {"PYTHONPATH", "VIRTUAL_ENV"}}
    return {**env, **extra}


def _section(user_data: str, pattern: str) -> str:
    match = re.search(pattern, user_data, re.MULTILINE | re.DOTALL)
    assert match, f"user data has no {pattern!r}"
    return match.group(1) if match.groups() else match.group(0)


def _status(shard: str) -> dict[str, Any]:
    value = boto3.client("ssm").get_parameter(Name=status_parameter_name(CAMPAIGN, shard))
    return json.loads(value["Parameter"]["Value"])


def _wait(predicate: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_rehearsal(
    aws: MotoServer,
    stack: StackOutputs,
    synth_with: Any,
    llama_server_build: Any,
    tmp_path: Path,
    ended_at_exit: Any,
) -> None:
    ec2, s3 = boto3.client("ec2"), boto3.client("s3")
    template = ec2.describe_launch_template_versions(
        LaunchTemplateId=stack.launch_template("x86_64", "spot"), Versions=["$Latest"]
    )["LaunchTemplateVersions"][0]["LaunchTemplateData"]
    user_data = base64.b64decode(template["UserData"]).decode()
    asset_uri = _section(user_data, r"^readonly ASSET_URI='(s3://[^']+)'$")

    # cdk deploy's part: publish the staged asset folder as the zip the user data fetches.
    synthesized = synth_with(azs="us-east-1a,us-east-1b,us-east-1c")
    staged = synthesized.outdir / synthesized.stack.agent_asset.asset.asset_path
    archive = tmp_path / "published.zip"
    with zipfile.ZipFile(archive, "w", zipfile.ZIP_DEFLATED) as zipped:
        for path in sorted(staged.rglob("*")):
            zipped.write(path, path.relative_to(staged))
    asset_bucket, asset_key = asset_uri.removeprefix("s3://").split("/", 1)
    s3.create_bucket(Bucket=asset_bucket)
    s3.upload_file(str(archive), asset_bucket, asset_key)

    # The user data's fetch, unzip and install, as rendered.
    home = tmp_path / "opt-bench"
    home.mkdir()
    fetch = _section(user_data, r'^(python3 - "\$\{ASSET_URI\}".*?^PY)$')
    unzip = _section(user_data, r"^(python3 -m zipfile -e [^\n]*)$")
    install = _section(user_data, r"^(PYTHON=python3 bash [^\n]*install\.sh[^\n]*)$")
    system_python = Path(shutil.which("python3") or sys.executable).parent
    variables = (
        f"ASSET_URI='{asset_uri}'\nREGION=us-east-1\nBENCH_HOME='{home}'\n"
        f"APP_DIR='{home}/app'\nVENV_DIR='{home}/venv'\n"
    )
    boto3_python = Path(sys.executable).parent  # the AMI's python3 has boto3; this one does
    subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{variables}{fetch}\n"],
        env=_clean_env(**aws.env(), PATH=f"{boto3_python}:{os.environ['PATH']}"),
        check=True,
        timeout=120,
    )
    boot = subprocess.run(
        ["bash", "-c", f"set -euo pipefail\n{variables}{unzip}\n{install}\n"],
        env=_clean_env(PATH=f"{system_python}:{os.environ['PATH']}"),
        capture_output=True,
        text=True,
        timeout=1500,
    )
    assert boot.returncode == 0, boot.stderr[-3000:]
    exec_start = _section(user_data, r"^ExecStart=\$\{VENV_DIR\}/bin/python3 (-m agent [^\n]*)$")
    agent_args = exec_start.replace("${CACHE_ROOT}", str(tmp_path / "cache")).split()
    # The unit's working directory is its state directory, not the work dir: an agent
    # started inside the work dir would find its `engines/` install folders as a namespace
    # package ahead of the project's own (`python -m engines.pytorch` fails there).
    assert _section(user_data, r"^WorkingDirectory=(\S+)$") == "/var/lib/bench"
    env_file = _section(user_data, r"cat >\"\$\{ENV_FILE\}\" <<'EOF'\n(.*?)\nEOF")
    unit_env = dict(line.split("=", 1) for line in env_file.splitlines() if line)

    # The user's part: the token in the stack's secret, then the campaign launched.
    secrets = boto3.client("secretsmanager")
    listed = secrets.list_secrets()["SecretList"]
    if not listed:
        # moto's CloudFormation answers for the secret without keeping it: make it here, and
        # point the agents at it as the deployed user data would.
        listed = [secrets.create_secret(Name="BenchHfToken")]
    unit_env["BENCH_HF_SECRET_ID"] = listed[0]["ARN"]
    secrets.put_secret_value(
        SecretId=listed[0]["ARN"], SecretString="hf_rehearsalTOKEN0123456789"
    )
    spec = tmp_path / "rehearsal.toml"
    spec.write_text(SPEC)
    launched = run_bench("launch", str(spec))
    assert launched.returncode == 0, launched.stderr

    def instances() -> dict[str, dict[str, Any]]:
        return {tags_of(i)[TAG_SHARD]: i for i in live_instances(CAMPAIGN)}

    def agent(instance: dict[str, Any], work: Path) -> tuple[subprocess.Popen[str], Any]:
        imds = fake_imds(
            instance_id=instance["InstanceId"],
            instance_type=instance["InstanceType"],
            availability_zone=instance["Placement"]["AvailabilityZone"],
            lifecycle=instance.get("InstanceLifecycle", "on-demand"),
            tags={k: v for k, v in tags_of(instance).items() if not k.startswith("aws:")},
        )
        server = imds.__enter__()
        work.mkdir(parents=True)
        state_dir = work.with_name(f"{work.name}-var-lib-bench")  # StateDirectory=bench
        state_dir.mkdir()
        args = [a.replace(str(tmp_path / "cache") + "/work", str(work)) for a in agent_args]
        process = subprocess.Popen(
            [str(home / "venv" / "bin" / "python3"), *args],
            env={
                **_clean_env(),
                **aws.env(),
                **unit_env,
                "BENCH_IMDS_ENDPOINT": server.url,
                "BENCH_POWEROFF_FILE": str(work / "poweroff.txt"),
                "BENCH_CACHE_DIR": str(tmp_path / "cache"),
                "LLAMA_SERVER_BIN": str(llama_server_build.binary),
                "BENCH_SPOT_POLL_S": "0.2",
            },
            cwd=state_dir,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        return ended_at_exit(process), (imds, server)

    first = instances()
    assert set(first) == {"s0", "s1"}

    # s1: a spot notice while its engine starts.
    process, (imds, server) = agent(first["s1"], tmp_path / "s1-a")
    server_log = tmp_path / "s1-a" / "results" / CAMPAIGN / "s1" / "servers" / "llama.log"
    _wait(lambda: server_log.exists() or process.poll() is not None, 600, "llama start-up")
    server.issue_spot_notice()
    output = process.communicate(timeout=300)[0]
    imds.__exit__(None, None, None)
    assert process.returncode == 3, output[-4000:]
    assert _status("s1")["phase"] == "interrupted"
    ec2.terminate_instances(InstanceIds=[first["s1"]["InstanceId"]])  # EC2 takes it back

    relaunched = run_bench("launch", str(spec))
    assert relaunched.returncode == 0, relaunched.stderr
    second = instances()
    assert second["s0"]["InstanceId"] == first["s0"]["InstanceId"]
    assert second["s1"]["InstanceId"] != first["s1"]["InstanceId"]
    # The relaunched shard boots; its record is still the old instance's: cleanup keeps it.
    kept = run_bench("cleanup", "--yes")
    assert kept.returncode == 0, kept.stderr
    assert set(instances()) == {"s0", "s1"}

    for shard, work in (("s0", tmp_path / "s0"), ("s1", tmp_path / "s1-b")):
        process, (imds, _) = agent(second[shard], work)
        output = process.communicate(timeout=900)[0]
        imds.__exit__(None, None, None)
        assert process.returncode == 0, output[-4000:]
        status = _status(shard)
        assert status["phase"] == "done", status
        assert status["instance_id"] == second[shard]["InstanceId"]
        assert "campaign shard finished" in (work / "poweroff.txt").read_text()

    shown = run_bench("status", CAMPAIGN)
    assert shown.returncode == 0 and shown.stdout.count("done") >= 2, shown.stdout
    out = tmp_path / "fetched"
    fetched = run_bench("fetch", CAMPAIGN, str(out), timeout_s=300)
    assert fetched.returncode == 0, fetched.stderr
    for shard in ("s0", "s1"):
        tarballs = list(out.rglob(f"{shard}/results.tar.gz")) or list(out.rglob("*.tar.gz"))
        assert tarballs, sorted(str(p) for p in out.rglob("*"))
        names = set()
        for tarball in tarballs:
            with tarfile.open(tarball) as opened:
                names |= set(opened.getnames())
        logs = {n.rsplit("/logs/", 1)[-1] for n in names if "/logs/" in f"/{n}"}
        assert {"agent.log", "llamacpp-install.log", "llamacpp-build.log"} <= logs, names
        if shard == "s0":
            assert "pytorch-install.log" in logs, sorted(logs)
    # Every job of both shards ran: BFCL answered and scored, our engine served.
    for shard, arms in (("s0", ("llama", "pytorch")), ("s1", ("llama",))):
        for arm in arms:
            for item in ("probe", "sweep", "bfcl"):
                record = json.loads(
                    next(out.rglob(f"{shard}/jobs/{arm}-{item}/job.json")).read_text()
                )
                assert record["status"] == "ok", (shard, arm, item, record.get("reason"))
        answers = next(out.rglob(f"{shard}/jobs/llama-bfcl/answers.jsonl")).read_text()
        assert len(answers.splitlines()) == 2
    reported = run_bench("report", str(out), "--out", str(tmp_path / "report"))
    assert reported.returncode == 0, reported.stderr
    ended = run_bench("cleanup", "--yes")
    assert ended.returncode == 0, ended.stderr
    assert live_instances(CAMPAIGN) == []
    # The status parameters went with the instances; the uploaded manifests still tell.
    after = run_bench("status", CAMPAIGN)
    assert after.returncode == 0, after.stderr
    for shard in ("s0", "s1"):
        row = next(line for line in after.stdout.splitlines() if f" {shard} " in f" {line} ")
        assert "done" in row, after.stdout
