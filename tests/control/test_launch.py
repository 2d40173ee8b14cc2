"""The launcher's decisions, in-process: capacity errors injected at the HTTP layer of boto3,
everything else answered by the moto server holding the real BenchStack."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import boto3
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    ReadTimeoutError,
)
from botocore.stub import Stubber

from contract.layout import TAG_CAMPAIGN, TAG_SHARD, spec_key
from control.aws import CONTROL_CONFIG, LAUNCH_CONFIG, AwsClients
from control.errors import (
    LAUNCH_ERRORS,
    ControlError,
    LaunchAction,
    classify_launch_error,
)
from control.launch import RETRY_LIMIT, Attempt, launch_campaign, wait_for_agents
from control.quotas import check_quotas, quota_group
from control.spec import SpecError, load_spec_file
from control.stack import StackOutputs
from engines.campaign import check_campaign
from tests.control.conftest import (
    RunInstancesScript,
    count_sends,
    ec2_error_response,
    live_instances,
    put_status,
    tags_of,
    write_spec,
)

ICE = ("InsufficientInstanceCapacity", 500)  # EC2 answers capacity errors with HTTP 500


def _launch(clients: AwsClients, stack: StackOutputs, tmp_path: Path, shards, **kwargs):
    spec, data = load_spec_file(
        write_spec(tmp_path / "spec.toml", "c1", shards), check=check_campaign
    )
    lines: list[str] = []
    sleeps: list[float] = []
    result = launch_campaign(
        clients,
        stack,
        spec,
        data,
        on_attempt=lambda a: lines.append(a.line()),
        sleep=sleeps.append,
        **kwargs,
    )
    return result, lines, sleeps


def test_spot_refused_everywhere_then_on_demand_taken_in_the_second_subnet(
    stack: StackOutputs, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    # A user's AWS_MAX_ATTEMPTS must not bring botocore's retries back to the launch client.
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "5")
    clients = AwsClients.from_environment()
    script = RunInstancesScript(
        stack,
        {
            ("spot", "us-east-1a"): [ICE],
            ("spot", "us-east-1b"): [ICE],
            ("spot", "us-east-1c"): [ICE],
            ("on-demand", "us-east-1a"): [ICE],
        },
    ).install(clients.launch_ec2)
    result, lines, sleeps = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])

    # One HTTP request per attempt: botocore retried none of the 500s.
    assert [(s.market, s.zone) for s in script.sent] == [
        ("spot", "us-east-1a"),
        ("spot", "us-east-1b"),
        ("spot", "us-east-1c"),
        ("on-demand", "us-east-1a"),
        ("on-demand", "us-east-1b"),
    ]
    assert sleeps == []
    (shard,) = result.shards
    assert shard.outcome == "launched" and shard.market == "on-demand"
    assert shard.availability_zone == "us-east-1b" and len(shard.attempts) == 5
    assert all("❌ InsufficientInstanceCapacity: injected -> next subnet" in x for x in lines[:4])
    assert lines[4].startswith(f"s0: {stack.subnets_by_az['us-east-1b']} (us-east-1b) on-demand:")
    assert f"✅ launched {shard.instance_id} (g6.xlarge)" in lines[4]

    (instance,) = live_instances("c1")
    tags = tags_of(instance)
    assert instance["InstanceId"] == shard.instance_id
    assert instance["SubnetId"] == stack.subnets_by_az["us-east-1b"]
    assert instance["InstanceType"] == "g6.xlarge"
    assert tags[TAG_CAMPAIGN] == "c1" and tags[TAG_SHARD] == "s0" and tags["Name"] == "bench-c1-s0"
    assert tags["aws:ec2launchtemplate:id"] == stack.launch_template("x86_64", "on-demand")
    spec = boto3.client("s3").get_object(Bucket=stack.bucket, Key=spec_key("c1"))
    assert spec["Body"].read() == (tmp_path / "spec.toml").read_bytes()


def test_spot_quota_switches_market_and_on_demand_quota_stops_with_the_quota_to_raise(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    script = RunInstancesScript(
        stack,
        {
            ("spot", "us-east-1a"): [("MaxSpotInstanceCountExceeded", 400)],
            ("on-demand", "us-east-1a"): [("VcpuLimitExceeded", 400)],
        },
    ).install(clients.launch_ec2)
    result, lines, _ = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])

    assert [(s.market, s.zone) for s in script.sent] == [
        ("spot", "us-east-1a"),  # spot quota: the other spot subnets are not tried
        ("on-demand", "us-east-1a"),  # vCPU quota: no other subnet can help
    ]
    (shard,) = result.shards
    assert shard.outcome == "failed" and not result.ok
    assert "L-DB2E81BA" in shard.error and "request-service-quota-increase" in shard.error
    assert lines[0].endswith("-> switch market") and lines[1].endswith("-> stop: quota")
    assert live_instances() == []


def test_throttling_backs_off_and_retries_the_same_subnet(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    throttled = ("RequestLimitExceeded", 503)
    script = RunInstancesScript(stack, {("spot", "us-east-1a"): [throttled, throttled]}).install(
        clients.launch_ec2
    )
    result, lines, sleeps = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])

    assert [(s.market, s.zone) for s in script.sent] == [("spot", "us-east-1a")] * 3
    assert len(sleeps) == 2 and 0.5 <= sleeps[0] <= 1.0 and 1.0 <= sleeps[1] <= 2.0
    assert "⏳ RequestLimitExceeded: injected -> retry in" in lines[0]
    (shard,) = result.shards
    assert shard.outcome == "launched" and shard.market == "spot"
    assert shard.availability_zone == "us-east-1a"


def test_endless_throttling_gives_up_on_the_subnet_after_the_retry_limit(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    script = RunInstancesScript(
        stack, {("spot", "us-east-1a"): [("InternalError", 500)] * RETRY_LIMIT}
    ).install(clients.launch_ec2)
    result, lines, sleeps = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    assert len(script.sent) == RETRY_LIMIT + 1 and len(sleeps) == RETRY_LIMIT - 1
    assert lines[RETRY_LIMIT - 1].endswith(f"-> next subnet (gave up after {RETRY_LIMIT} tries)")
    assert result.shards[0].availability_zone == "us-east-1b"


def test_an_unknown_error_fails_fast(clients: AwsClients, stack: StackOutputs, tmp_path: Path):
    script = RunInstancesScript(
        stack, {("spot", "us-east-1a"): [("InvalidParameterValue", 400)]}
    ).install(clients.launch_ec2)
    result, lines, sleeps = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    assert len(script.sent) == 1 and sleeps == []
    assert result.shards[0].outcome == "failed"
    assert result.shards[0].error == "InvalidParameterValue: injected"
    assert lines == [
        f"s0: {stack.subnets_by_az['us-east-1a']} (us-east-1a) spot: "
        "❌ InvalidParameterValue: injected -> fail"
    ]
    assert live_instances() == []


@pytest.mark.parametrize(
    "code", ["AuthFailure.ServiceLinkedRoleCreationNotPermitted", "UnauthorizedOperation"]
)
def test_a_spot_only_authorization_error_tries_on_demand(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path, code: str
):
    # A fresh account without the spot service-linked role refuses spot requests only.
    script = RunInstancesScript(stack, {("spot", "us-east-1a"): [(code, 403)]}).install(
        clients.launch_ec2
    )
    result, lines, _ = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    assert [(s.market, s.zone) for s in script.sent] == [
        ("spot", "us-east-1a"),
        ("on-demand", "us-east-1a"),
    ]
    assert lines[0].endswith("-> switch market")
    assert result.shards[0].outcome == "launched" and result.shards[0].market == "on-demand"


def test_an_authorization_error_on_demand_too_fails(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    script = RunInstancesScript(
        stack,
        {
            ("spot", "us-east-1a"): [("UnauthorizedOperation", 403)],
            ("on-demand", "us-east-1a"): [("UnauthorizedOperation", 403)],
        },
    ).install(clients.launch_ec2)
    result, _, _ = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    assert len(script.sent) == 2 and result.shards[0].outcome == "failed"
    assert result.shards[0].error == "UnauthorizedOperation: injected"
    assert live_instances() == []


def test_only_subnets_whose_zone_offers_the_type_are_tried(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    # moto's offerings: p4de.24xlarge is in us-east-1b and us-east-1c, not us-east-1a.
    script = RunInstancesScript(
        stack, {("spot", "us-east-1b"): [ICE], ("spot", "us-east-1c"): [ICE]}
    ).install(clients.launch_ec2)
    result, _, _ = _launch(clients, stack, tmp_path, [("s0", "p4de.24xlarge")])
    assert [(s.market, s.zone) for s in script.sent] == [
        ("spot", "us-east-1b"),
        ("spot", "us-east-1c"),
        ("on-demand", "us-east-1b"),
    ]
    assert result.shards[0].availability_zone == "us-east-1b"


def test_a_type_offered_in_no_zone_of_the_stack_launches_nothing(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    script = RunInstancesScript(stack, {}).install(clients.launch_ec2)
    # g7.xlarge is not in moto's catalogue: offered nowhere in the region.
    with pytest.raises(ControlError, match=r"g7\.xlarge is offered in none of the stack's"):
        _launch(clients, stack, tmp_path, [("s0", "g6.xlarge"), ("s1", "g7.xlarge")])
    assert script.sent == [] and live_instances() == []
    listed = boto3.client("s3").list_objects_v2(Bucket=stack.bucket).get("KeyCount", 0)
    assert listed == 0  # the spec was not uploaded either


def test_shards_launch_in_parallel_and_relaunch_is_idempotent(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    shards = [("s0", "g6.xlarge"), ("s1", "g6e.xlarge"), ("s2", "g6.xlarge")]
    first, _, _ = _launch(clients, stack, tmp_path, shards)
    assert [s.outcome for s in first.shards] == ["launched"] * 3
    assert len(live_instances("c1")) == 3

    again, lines, _ = _launch(clients, stack, tmp_path, shards)
    assert [s.outcome for s in again.shards] == ["running"] * 3 and lines == []
    assert [s.instance_id for s in again.shards] == [s.instance_id for s in first.shards]

    gone = first.shards[1].instance_id
    boto3.client("ec2").terminate_instances(InstanceIds=[gone])
    third, _, _ = _launch(clients, stack, tmp_path, shards)
    assert [s.outcome for s in third.shards] == ["running", "launched", "running"]
    assert third.shards[1].instance_id != gone and len(live_instances("c1")) == 3


def test_local_shards_are_refused(tmp_path: Path):
    path = write_spec(tmp_path / "l.toml", "l", [("s0", "g6.xlarge"), ("here", "local")])
    with pytest.raises(SpecError, match=r"shards here: instance_type 'local' runs on this"):
        load_spec_file(path, check=check_campaign)


def test_a_changed_spec_is_refused_while_the_campaign_runs(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    with pytest.raises(ControlError, match="running with a different spec"):
        _launch(clients, stack, tmp_path, [("s0", "g6.xlarge"), ("s1", "g6.xlarge")])
    assert len(live_instances("c1")) == 1


def test_describe_calls_ride_out_throttling_with_botocores_retries(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    ec2 = clients.client("ec2")
    sends = count_sends(ec2, "before-send.ec2.DescribeInstanceTypeOfferings")
    throttled = [True]

    def throttle_once(**_):
        if throttled.pop() if throttled else False:
            return ec2_error_response("RequestLimitExceeded", 503)
        return None

    ec2.meta.events.register("before-send.ec2.DescribeInstanceTypeOfferings", throttle_once)
    result, _, _ = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    assert result.ok and sends[0] == 2


def test_wait_for_agents_returns_when_the_agent_is_installing(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    result, _, _ = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge"), ("s1", "g6.xlarge")])
    ids = {s.shard: s.instance_id for s in result.shards}
    # An earlier instance's record does not count as this one's progress.
    put_status("c1", "s0", phase="sweeping", instance_id="i-0earlier")
    boto3.client("ec2").terminate_instances(InstanceIds=[ids["s1"]])
    polls: list[float] = []
    seen: list[tuple[str, str | None]] = []

    def sleep(seconds: float) -> None:
        polls.append(seconds)
        put_status("c1", "s0", phase="installing", instance_id=ids["s0"])

    waits = wait_for_agents(
        clients,
        "c1",
        ids,
        timeout_s=60,
        poll_s=5,
        sleep=sleep,
        on_change=lambda shard, phase: seen.append((shard, phase)),
    )
    assert [(w.shard, w.outcome, w.phase) for w in waits] == [
        ("s0", "ready", "installing"),
        ("s1", "lost", None),
    ]
    assert polls == [5] and ("s0", "installing") in seen


def test_wait_for_agents_is_bounded(clients: AwsClients, stack: StackOutputs, tmp_path: Path):
    result, _, _ = _launch(clients, stack, tmp_path, [("s0", "g6.xlarge")])
    now = [0.0]
    waits = wait_for_agents(
        clients,
        "c1",
        {"s0": result.shards[0].instance_id},
        timeout_s=30,
        poll_s=10,
        sleep=lambda s: now.__setitem__(0, now[0] + s),
        clock=lambda: now[0],
    )
    assert waits[0].outcome == "timeout" and now[0] == 30


def test_quota_check_stops_when_neither_market_has_the_vcpus(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    spec, _ = load_spec_file(
        write_spec(tmp_path / "q.toml", "q", [("s0", "g6.xlarge"), ("s1", "g6.xlarge")])
    )
    quotas = clients.client("service-quotas")
    with Stubber(quotas) as stub:
        for code, value in (("L-3819A6DF", 4.0), ("L-DB2E81BA", 8.0)):
            stub.add_response(
                "get_service_quota",
                {"Quota": {"QuotaCode": code, "Value": value}},
                {"ServiceCode": "ec2", "QuotaCode": code},
            )
        checks = check_quotas(clients, spec)
    assert [(c.market, c.needed_vcpus, c.ok) for c in checks] == [
        ("spot", 8, False),
        ("on-demand", 8, True),
    ]
    with Stubber(quotas) as stub:
        for code in ("L-3819A6DF", "L-DB2E81BA"):
            stub.add_response(
                "get_service_quota",
                {"Quota": {"QuotaCode": code, "Value": 0.0}},
                {"ServiceCode": "ec2", "QuotaCode": code},
            )
        with pytest.raises(ControlError, match="needs 8 G and VT vCPUs") as caught:
            check_quotas(clients, spec)
    assert "--quota-code L-DB2E81BA --desired-value 8" in str(caught.value)


def test_quota_groups():
    assert quota_group("g6.xlarge").on_demand == "L-DB2E81BA"
    assert quota_group("g5g.2xlarge").spot == "L-3819A6DF"
    assert quota_group("gr6.4xlarge").name == "G and VT"
    assert quota_group("vt1.3xlarge").name == "G and VT"
    assert quota_group("p5.48xlarge").on_demand == "L-417A185B"
    assert quota_group("p6-b200.48xlarge").spot == "L-7212CCBC"
    assert quota_group("m7i.large") is None


def _client_error(code: str, status: int) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "RunInstances",
    )


@pytest.mark.parametrize(("code", "action"), sorted(LAUNCH_ERRORS.items()))
def test_every_code_in_the_table_is_classified_by_it(code: str, action: LaunchAction):
    assert classify_launch_error(_client_error(code, 500)).action is action
    assert classify_launch_error(_client_error(code, 400)).action is action


def test_codes_outside_the_table():
    assert classify_launch_error(_client_error("SomethingNew", 503)).action is LaunchAction.RETRY
    assert classify_launch_error(_client_error("InvalidParameterValue", 400)).action is (
        LaunchAction.FAIL
    )
    assert classify_launch_error(_client_error("InvalidAMIID.NotFound", 400)).action is (
        LaunchAction.FAIL
    )
    for exc in (
        EndpointConnectionError(endpoint_url="https://ec2"),
        ConnectTimeoutError(endpoint_url="https://ec2"),
        ReadTimeoutError(endpoint_url="https://ec2"),
    ):
        assert classify_launch_error(exc).action is LaunchAction.RETRY
    assert classify_launch_error(RuntimeError("bug")).action is LaunchAction.FAIL


def test_the_launch_client_makes_one_attempt_and_the_others_retry():
    assert LAUNCH_CONFIG.retries == {"mode": "standard", "total_max_attempts": 1}
    assert CONTROL_CONFIG.retries["mode"] == "standard"
    assert CONTROL_CONFIG.retries["total_max_attempts"] > 1


def test_attempt_lines_read_like_the_seeds_create_tool():
    ok = Attempt("s0", "spot", "subnet-1", "us-east-1a", "g6.xlarge", instance_id="i-1")
    assert ok.line() == "s0: subnet-1 (us-east-1a) spot: ✅ launched i-1 (g6.xlarge)"


def test_client_token_is_derived_so_concurrent_launches_converge():
    from control.launch import client_token

    args = ("camp", "g6", "spot", "subnet-1")
    token = client_token(*args, ())
    # Two `bench launch` of one campaign at once see the same state: the same token.
    assert token == client_token(*args, ())
    assert len(token) <= 64 and token.isascii()
    # Each attempt of a shard (market, subnet) and each shard has its own.
    others = {
        client_token("camp", "g6", "on-demand", "subnet-1", ()),
        client_token("camp", "g6", "spot", "subnet-2", ()),
        client_token("camp", "t4", "spot", "subnet-1", ()),
        client_token("other", "g6", "spot", "subnet-1", ()),
    }
    assert token not in others and len(others) == 4
    # After the shard's instance ended, a relaunch gets a new token (not the ended one back);
    # the order instances are listed in does not matter.
    ended = client_token(*args, ("i-1",))
    assert ended != token
    assert client_token(*args, ("i-2", "i-1")) == client_token(*args, ("i-1", "i-2"))


def test_a_g5g_shard_launches_from_the_arm64_template_pair(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    result, _, _ = _launch(
        clients, stack, tmp_path, [("x86", "g6.xlarge"), ("arm", "g5g.xlarge")]
    )
    assert {s.shard: s.outcome for s in result.shards} == {"x86": "launched", "arm": "launched"}
    by_shard = {tags_of(i)[TAG_SHARD]: tags_of(i) for i in live_instances("c1")}
    assert by_shard["arm"]["aws:ec2launchtemplate:id"] == stack.launch_template("arm64", "spot")
    assert by_shard["x86"]["aws:ec2launchtemplate:id"] == stack.launch_template("x86_64", "spot")


def test_a_shard_whose_architecture_has_no_templates_is_refused_before_anything_launches(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    # A stack deployed before the arm64 pair existed.
    x86_only = dataclasses.replace(
        stack, launch_templates={"x86_64": stack.launch_templates["x86_64"]}
    )
    with pytest.raises(ControlError, match=r"shard arm \(g5g\.xlarge\): stack .* no launch "
                       r"templates for arm64 instances \(it has x86_64\); redeploy"):
        _launch(clients, x86_only, tmp_path, [("x86", "g6.xlarge"), ("arm", "g5g.xlarge")])
    assert live_instances("c1") == []
    with pytest.raises(ClientError):
        boto3.client("s3").head_object(Bucket=stack.bucket, Key=spec_key("c1"))
