"""`bench plan` and the pre-launch checks: priors, prices, and one line per problem.

The plan's arithmetic runs in-process on the shipped campaigns; the CLI runs as a real
subprocess, with no credentials (the dated table) and against the moto BenchStack (AWS
prices are not in moto: the Price List is answered from a recorded shape; quotas and zone
offerings moto lacks or answers differently are injected at botocore's `before-call`).
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.awsrequest import AWSResponse

from agent.campaigns import CAMPAIGNS_DIR
from agent.loadgen.probe import PROBE_PROMPTS
from cli.plan import arm_infos
from contract.prices import TablePrices
from contract.spec import load_campaign
from control.aws import AwsClients
from control.plan import plan_campaign
from control.preflight import SPOT_ROLE_COMMAND, preflight
from control.prices import AwsPlanPrices, TablePlanPrices
from control.stack import StackOutputs
from engines.campaign import check_campaign
from report.prices import DEFAULT_TABLE
from tests.control.conftest import live_instances, run_bench, write_spec
from tests.fixtures.moto_server import MotoServer

NO_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "",
    "AWS_SECRET_ACCESS_KEY": "",
    "AWS_SESSION_TOKEN": "",
    "AWS_PROFILE": "",
    "AWS_CONFIG_FILE": "/nonexistent",
    "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def _plan(name: str):
    spec = check_campaign(load_campaign(CAMPAIGNS_DIR / f"{name}.toml"))
    prices = TablePlanPrices(TablePrices(DEFAULT_TABLE))
    return plan_campaign(
        spec, arm_infos(spec), prices, region="us-east-1", probe_prompts=len(PROBE_PROMPTS)
    )


def test_the_g6_plan_lists_every_job_in_order_with_a_named_prior_and_its_dollars():
    plan = _plan("g6-six-engines")
    (shard,) = plan.shards
    steps = [s.what for s in shard.steps]
    assert steps[0] == "boot and agent setup" and steps[-1] == "upload and power-off"
    assert steps[1:8] == [
        "install llamacpp b11312-0c1e57098", "ready llama", "probe llama", "sweep llama",
        "gsm8k llama", "bfcl llama", "ready llama-d2",
    ]  # fmt: skip
    assert "install litert-lm 0.18.1" in steps
    assert sum(s.startswith("install ") for s in steps) == 6  # once per engine
    assert all(s.source and s.hours >= 0 for s in shard.steps)
    gsm8k = next(s for s in shard.steps if s.what == "gsm8k vllm-d4")
    assert "seed 000" in gsm8k.source and "1,270 s" in gsm8k.source
    # The seeds ran this suite in 12.2 h; the plan adds the installs and the single-stream
    # engines' sweeps the seeds did not run, and stays within the spec's limit.
    assert 11.0 < shard.hours < plan.max_runtime_h == 16
    assert shard.on_demand is not None and shard.on_demand.usd_per_hour == 1.3232
    assert "report/prices.toml" in shard.on_demand.source
    assert plan.usd_on_demand == pytest.approx(shard.hours * 1.3232)
    assert plan.usd_spot is None and any("spot price now" in n for n in plan.notes)
    assert plan.problems() == []


def test_the_t4_plan_uses_the_t4_figures_and_fits_two_shards_in_the_runtime():
    plan = _plan("t4-six-engines")
    for shard in plan.shards:
        assert shard.gpu == "NVIDIA T4" and shard.on_demand is not None
        sources = " ".join(s.source for s in shard.steps)
        assert "seed 001" in sources and "seed 000 probe table" not in sources
    assert plan.problems() == [] and plan.wall_hours < plan.instance_hours


def test_shards_run_in_parallel_wall_time_is_the_longest(tmp_path: Path):
    path = write_spec(
        tmp_path / "two.toml", "two", [("a", "g6.xlarge"), ("b", "g4dn.xlarge")],
        arms=("vllm", "llama"), max_runtime_h=0.1,
    )  # fmt: skip
    spec = check_campaign(load_campaign(path))
    prices = TablePlanPrices(TablePrices(DEFAULT_TABLE))
    plan = plan_campaign(spec, arm_infos(spec), prices, region="us-east-1", probe_prompts=6)
    a, b = plan.shards
    assert plan.wall_hours == max(a.hours, b.hours)
    assert plan.instance_hours == pytest.approx(a.hours + b.hours)
    assert plan.usd_on_demand == pytest.approx(a.hours * 0.8048 + b.hours * 0.526)
    problems = plan.problems()
    assert len(problems) == 2 and "beyond max_runtime_h 0.1" in problems[0]


def test_bench_plan_without_credentials_prices_from_the_named_table():
    result = run_bench(
        "plan", str(CAMPAIGNS_DIR / "g6-six-engines.toml"), "--no-pin-check",
        env=NO_CREDENTIALS,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "Shard g6: g6.4xlarge (NVIDIA L4)" in out and "sweep vllm-d4" in out
    assert "report/prices.toml, dated 2026-11-29" in out and "instance-hours" in out
    assert "pre-launch checks not run" in out and "nothing launched" in out


# --- with credentials: the moto BenchStack ---


def _answer(client: Any, operation: str, parsed: dict[str, Any]) -> None:
    """Answer `operation` on `client` with `parsed`, as if the service had (moto lacks it)."""

    def hook(**_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        return AWSResponse("https://injected.invalid/", 200, {}, None), parsed

    client.meta.events.register(f"before-call.{operation}", hook)


def _quota(clients: AwsClients, values: dict[str, float]) -> None:
    def hook(params: dict[str, Any], **_: Any) -> tuple[AWSResponse, dict[str, Any]]:
        code = json.loads(params["body"])["QuotaCode"]  # the serialized request
        return AWSResponse("https://injected.invalid/", 200, {}, None), {
            "Quota": {"QuotaCode": code, "ServiceCode": "ec2", "Value": values[code]}
        }

    clients.client("service-quotas").meta.events.register(
        "before-call.service-quotas.GetServiceQuota", hook
    )


def _spec(tmp_path: Path, **kwargs: Any):
    path = write_spec(tmp_path / "c.toml", "c", kwargs.pop("shards", [("s0", "g6.xlarge")]),
                      **kwargs)  # fmt: skip
    return check_campaign(load_campaign(path))


def _with_secret(stack: StackOutputs, value: str | None) -> StackOutputs:
    """The stack with its HF-token secret (moto's CloudFormation does not create it)."""
    sm = boto3.client("secretsmanager")
    arn = sm.create_secret(Name="BenchStack-HfToken")["ARN"]
    if value is not None:
        sm.put_secret_value(SecretId=arn, SecretString=value)
    return replace(stack, hf_secret_arn=arn)


def test_the_stack_outputs_give_the_backstop_role_and_ami(stack: StackOutputs):
    assert stack.max_hours == 24
    assert stack.instance_role_arn and ":role/" in stack.instance_role_arn
    assert set(stack.ami_parameters) == {"x86_64", "arm64"}
    assert all(p.startswith("/aws/service/") for p in stack.ami_parameters.values())


def test_preflight_of_a_launchable_campaign_has_no_problem(
    stack: StackOutputs, clients: AwsClients, tmp_path: Path
):
    _quota(clients, {"L-3819A6DF": 64, "L-DB2E81BA": 64})
    stack = _with_secret(stack, "hf_not_a_real_token")
    found = preflight(clients, stack.stack_name, _spec(tmp_path), stack=stack)
    assert found.problems == []
    assert any("offered in us-east-1a" in n for n in found.notes)
    assert "HF-token secret: has a value" in found.notes
    # moto has no spot service-linked role: a warning with the command, not a problem.
    (warning,) = found.warnings
    assert "AWSServiceRoleForEC2Spot" in warning and SPOT_ROLE_COMMAND in warning


def test_each_bad_input_is_one_line(
    stack: StackOutputs, clients: AwsClients, tmp_path: Path
):
    _quota(clients, {"L-3819A6DF": 0, "L-DB2E81BA": 2})  # g6.xlarge: 4 vCPUs
    _answer(clients.client("ec2"), "ec2.DescribeInstanceTypeOfferings", {
        "InstanceTypeOfferings": [
            {"InstanceType": "g6.xlarge", "LocationType": "availability-zone",
             "Location": "us-east-1d"}
        ]
    })  # fmt: skip
    stack = _with_secret(stack, None)
    found = preflight(clients, stack.stack_name, _spec(tmp_path, max_runtime_h=30), stack=stack)
    problems = {p.split(" ", 1)[0]: p for p in found.problems}
    assert all("\n" not in p for p in found.problems) and len(found.problems) == 4
    assert "L-DB2E81BA" in problems["quota:"] and "request-service-quota-increase" in (
        problems["quota:"]
    )
    assert "offered in none of the stack's zones" in problems["instance"]
    assert "us-east-1d" in problems["instance"]
    assert "max_hours=30" in problems["max_runtime_h"]
    assert "is empty" in problems["the"] and "--public-sources" in problems["the"]
    public = preflight(
        clients, stack.stack_name, _spec(tmp_path), public_sources=True, stack=stack
    )
    assert not any("is empty" in p for p in public.problems)


def test_no_stack_is_one_problem(aws: MotoServer, tmp_path: Path):
    clients = AwsClients.from_environment()
    found = preflight(clients, "NoSuchStack", _spec(tmp_path))
    assert len(found.problems) == 1 and "stack NoSuchStack not found" in found.problems[0]


def test_launch_stops_before_run_instances_on_a_problem(stack: StackOutputs, tmp_path: Path):
    spec = write_spec(tmp_path / "c.toml", "c", [("s0", "g6.xlarge")], max_runtime_h=30)
    result = run_bench("launch", str(spec))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert any("max_runtime_h 30 is beyond stack BenchStack's backstop" in x for x in lines)
    assert lines[-1].endswith("nothing launched (bench plan SPEC shows them with the plan)")
    assert live_instances() == []


def test_bench_plan_with_credentials_prices_from_aws_and_runs_the_checks(
    stack: StackOutputs, clients: AwsClients, tmp_path: Path
):
    product = {
        "product": {"attributes": {
            "instanceType": "g6.xlarge", "regionCode": "us-east-1", "operatingSystem": "Linux",
            "tenancy": "Shared", "preInstalledSw": "NA", "capacitystatus": "Used",
            "licenseModel": "No License required",
        }},
        "terms": {"OnDemand": {"t": {"priceDimensions": {"d": {
            "unit": "Hrs", "pricePerUnit": {"USD": "0.8048000000"}}}}}},
        "publicationDate": "2026-11-20T00:00:00Z",
    }  # fmt: skip
    prices = AwsPlanPrices(clients, TablePrices(DEFAULT_TABLE), zones=list(stack.subnets_by_az))
    prices.clients.session.events.register(
        "before-call.pricing.GetProducts",
        lambda **_: (AWSResponse("https://injected.invalid/", 200, {}, None),
                     {"PriceList": [json.dumps(product)], "FormatVersion": "aws_v1"}),
    )  # fmt: skip
    spec = _spec(tmp_path)
    plan = plan_campaign(spec, arm_infos(spec), prices, region="us-east-1", probe_prompts=6)
    (shard,) = plan.shards
    assert shard.on_demand is not None and "Price List API" in shard.on_demand.source
    assert shard.on_demand.as_of == "2026-11-20"
    # moto's spot price history is a placeholder, but it is read the way EC2's is.
    assert shard.spot is not None and shard.spot.availability_zone in stack.subnets_by_az
    result = run_bench("plan", str(tmp_path / "c.toml"), "--no-pin-check")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "WARNING: no spot service-linked role" in result.stdout


def test_launch_refuses_an_unpublished_engine_version(stack: StackOutputs, tmp_path: Path):
    spec = write_spec(tmp_path / "c.toml", "c", [("s0", "g6.xlarge")], arms=("litert-int248",))
    spec.write_text(spec.read_text() + '\n[engine_versions]\nlitert-lm = "0.19.0"\n')
    result = run_bench("launch", str(spec), "--public-sources")
    assert result.returncode == 2, result.stdout + result.stderr
    (line,) = [x for x in result.stderr.splitlines() if "pin " in x]
    assert "litert-lm 0.19.0 (pypi, x86_64): DOES NOT RESOLVE" in line
    assert live_instances() == []
