"""BenchStack keeps each promise of issue 7, checked on the synthesized template.

One test (or a few) per promise: network, identity, the HF-token secret, the results bucket,
the agent asset, the launch templates and the outputs. The template comes from an offline
in-process synth with cdk.json's feature flags (see conftest.py).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from contract import layout
from contract.gpus import CPU_ARCHITECTURES
from infra.settings import DEFAULT_AMI_PARAMETERS, DEFAULT_AZS, DEFAULT_INSTANCE_TYPE
from tests.fixtures.cdk_synth import Synthesized

pytest.importorskip("aws_cdk", reason="CDK toolchain not installed")

from aws_cdk.assertions import Match

ASSET_SIZE_LIMIT_BYTES = 20 * 1024 * 1024  # code and recipes only; weights come at run time


def resources(template_json: dict[str, Any], type_: str) -> dict[str, dict[str, Any]]:
    """Logical id -> resource, for one resource type."""
    return {k: v for k, v in template_json["Resources"].items() if v["Type"] == type_}


def one(template_json: dict[str, Any], type_: str) -> tuple[str, dict[str, Any]]:
    """The only resource of a type: (logical id, resource)."""
    found = resources(template_json, type_)
    assert len(found) == 1, f"expected one {type_}, found {sorted(found)}"
    return next(iter(found.items()))


def launch_template_data(
    template_json: dict[str, Any], arch: str | None = None
) -> dict[str, dict[str, Any]]:
    """Market ("spot"/"on-demand"; "<arch> <market>" when arch is None, for every
    architecture) -> that launch template's LaunchTemplateData."""
    outputs = template_json["Outputs"]
    by_id = {
        (market if arch else f"{a} {market}"): outputs[layout.launch_template_output(a, market)][
            "Value"
        ]["Ref"]
        for a in ([arch] if arch else CPU_ARCHITECTURES)
        for market in ("spot", "on-demand")
    }
    return {
        market: template_json["Resources"][logical_id]["Properties"]["LaunchTemplateData"]
        for market, logical_id in by_id.items()
    }


def agent_statements(template_json: dict[str, Any]) -> list[dict[str, Any]]:
    """Every policy statement attached to the instance role (inline policies)."""
    role_id, _ = next(
        (k, v)
        for k, v in resources(template_json, "AWS::IAM::Role").items()
        if v["Properties"]["AssumeRolePolicyDocument"]["Statement"][0]["Principal"]
        == {"Service": "ec2.amazonaws.com"}
    )
    statements = []
    for policy in resources(template_json, "AWS::IAM::Policy").values():
        if {"Ref": role_id} in policy["Properties"]["Roles"]:
            statements.extend(policy["Properties"]["PolicyDocument"]["Statement"])
    return statements


def as_list(value: object) -> list[Any]:
    return value if isinstance(value, list) else [value]


def walk(value: object) -> Iterator[object]:
    """Every node of a JSON value."""
    yield value
    if isinstance(value, dict):
        for item in value.values():
            yield from walk(item)
    elif isinstance(value, list):
        for item in value:
            yield from walk(item)


# --- network ---


def test_one_public_subnet_per_default_az_and_no_nat(synthesized: Synthesized) -> None:
    """Public subnets in every AZ of the default list; no NAT gateway, no private subnet."""
    subnets = resources(synthesized.template_json, "AWS::EC2::Subnet").values()
    assert sorted(s["Properties"]["AvailabilityZone"] for s in subnets) == sorted(DEFAULT_AZS)
    assert all(s["Properties"]["MapPublicIpOnLaunch"] is True for s in subnets)
    synthesized.template.resource_count_is("AWS::EC2::NatGateway", 0)
    routes = resources(synthesized.template_json, "AWS::EC2::Route").values()
    assert len(routes) == len(DEFAULT_AZS)
    assert all("GatewayId" in r["Properties"] for r in routes)  # all via the internet gateway


def test_azs_come_from_context_and_pin_the_region(synth_with: Callable[..., Synthesized]) -> None:
    synthesized = synth_with(azs="us-west-2a,us-west-2b,us-west-2c")
    subnets = resources(synthesized.template_json, "AWS::EC2::Subnet").values()
    azs = [s["Properties"]["AvailabilityZone"] for s in subnets]
    assert sorted(azs) == ["us-west-2a", "us-west-2b", "us-west-2c"]
    assert synthesized.stack.region == "us-west-2"
    subnet_output = json.dumps(synthesized.template_json["Outputs"][layout.OUTPUT_SUBNETS_BY_AZ])
    assert all(az in subnet_output for az in azs)


def test_s3_gateway_endpoint(synthesized: Synthesized) -> None:
    _, endpoint = one(synthesized.template_json, "AWS::EC2::VPCEndpoint")
    assert endpoint["Properties"]["VpcEndpointType"] == "Gateway"
    assert ".s3" in json.dumps(endpoint["Properties"]["ServiceName"])


def test_no_inbound_anywhere(synthesized: Synthesized) -> None:
    """No ingress rule on any security group, no key pair, no port 22."""
    synthesized.template.resource_count_is("AWS::EC2::SecurityGroupIngress", 0)
    groups = resources(synthesized.template_json, "AWS::EC2::SecurityGroup").values()
    assert groups
    assert all("SecurityGroupIngress" not in g["Properties"] for g in groups)
    for data in launch_template_data(synthesized.template_json).values():
        assert "KeyName" not in data
        assert "NetworkInterfaces" not in data  # the launcher passes SubnetId itself


# --- identity ---


def test_role_has_ssm_core_and_a_profile(synthesized: Synthesized) -> None:
    synthesized.template.has_resource_properties(
        "AWS::IAM::Role",
        {
            "AssumeRolePolicyDocument": Match.object_like(
                {
                    "Statement": [
                        Match.object_like(
                            {"Principal": {"Service": "ec2.amazonaws.com"}, "Effect": "Allow"}
                        )
                    ]
                }
            ),
            "ManagedPolicyArns": [
                {
                    "Fn::Join": [
                        "",
                        [
                            "arn:",
                            Match.any_value(),
                            ":iam::aws:policy/AmazonSSMManagedInstanceCore",
                        ],
                    ]
                }
            ],
        },
    )
    synthesized.template.resource_count_is("AWS::IAM::InstanceProfile", 1)


def test_agent_policy_is_exactly_what_the_agent_needs(template_json: dict[str, Any]) -> None:
    actions_by_sid = {
        s["Sid"]: sorted(as_list(s["Action"])) for s in agent_statements(template_json)
    }
    assert actions_by_sid == {
        "ReadHfToken": ["secretsmanager:GetSecretValue"],
        "ReadAgentAsset": ["s3:GetObject"],
        "ReadWriteCampaignsAndResults": [
            "s3:AbortMultipartUpload",
            "s3:GetObject",
            "s3:PutObject",
        ],
        "ListCampaignsAndResults": ["s3:ListBucket"],
        "PublishStatus": ["ssm:GetParameter", "ssm:PutParameter"],
    }
    assert all(s["Effect"] == "Allow" for s in agent_statements(template_json))


def test_agent_policy_resources_are_scoped(template_json: dict[str, Any]) -> None:
    by_sid = {s["Sid"]: s for s in agent_statements(template_json)}
    secret_id, _ = one(template_json, "AWS::SecretsManager::Secret")
    assert by_sid["ReadHfToken"]["Resource"] == {"Ref": secret_id}

    bucket_id, _ = one(template_json, "AWS::S3::Bucket")
    bucket_arn = {"Fn::GetAtt": [bucket_id, "Arn"]}
    assert by_sid["ReadWriteCampaignsAndResults"]["Resource"] == [
        {"Fn::Join": ["", [bucket_arn, f"/{layout.CAMPAIGNS_PREFIX}*"]]},
        {"Fn::Join": ["", [bucket_arn, f"/{layout.RESULTS_PREFIX}*"]]},
    ]
    listing = by_sid["ListCampaignsAndResults"]
    assert listing["Resource"] == bucket_arn
    assert listing["Condition"] == {
        "StringLike": {"s3:prefix": [f"{layout.CAMPAIGNS_PREFIX}*", f"{layout.RESULTS_PREFIX}*"]}
    }

    ssm_arn = json.dumps(by_sid["PublishStatus"]["Resource"])
    assert ssm_arn.endswith(f':parameter{layout.STATUS_PARAMETER_PREFIX}*"]]}}')


def test_least_privilege_no_star_resource_no_ec2(template_json: dict[str, Any]) -> None:
    """No Allow on Resource '*', no action wildcards, and nothing on EC2: tags come from IMDS
    and the agent ends its instance by powering off (issue 20, item 4)."""
    for statement in agent_statements(template_json):
        actions = as_list(statement["Action"])
        assert all("*" not in action for action in actions), statement
        assert "*" not in as_list(statement["Resource"]), statement
        assert not any(action.startswith("ec2:") for action in actions), statement
    everything = json.dumps(agent_statements(template_json))
    assert "ec2:TerminateInstances" not in everything and "ec2:DescribeTags" not in everything


def test_instances_end_by_powering_off_and_read_tags_from_imds(
    template_json: dict[str, Any],
) -> None:
    for data in launch_template_data(template_json).values():
        assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
        assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"


def test_asset_read_is_the_one_object(synthesized: Synthesized) -> None:
    by_sid = {s["Sid"]: s for s in agent_statements(synthesized.template_json)}
    key = synthesized.stack.agent_asset.asset.s3_object_key
    assert json.dumps(by_sid["ReadAgentAsset"]["Resource"]).endswith(f'/{key}"]]}}')


# --- the HF token secret ---


def test_secret_is_created_empty(synthesized: Synthesized) -> None:
    _, secret = one(synthesized.template_json, "AWS::SecretsManager::Secret")
    assert set(secret["Properties"]) == {"Description"}  # no SecretString, no generator


def test_no_secret_value_or_secret_parameter_in_template(template_json: dict[str, Any]) -> None:
    text = json.dumps(template_json)
    assert "SecretString" not in text
    assert "GenerateSecretString" not in text
    assert not re.search(r"hf_[A-Za-z0-9]{20,}", text)  # the shape of a Hugging Face token
    assert set(template_json.get("Parameters", {})) <= {"BootstrapVersion"}


# --- results bucket ---


def test_bucket_is_private_encrypted_tls_only(synthesized: Synthesized) -> None:
    synthesized.template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "PublicAccessBlockConfiguration": {
                "BlockPublicAcls": True,
                "BlockPublicPolicy": True,
                "IgnorePublicAcls": True,
                "RestrictPublicBuckets": True,
            },
            "BucketEncryption": {
                "ServerSideEncryptionConfiguration": [
                    {"ServerSideEncryptionByDefault": {"SSEAlgorithm": "AES256"}}
                ]
            },
            "OwnershipControls": {"Rules": [{"ObjectOwnership": "BucketOwnerEnforced"}]},
        },
    )
    synthesized.template.has_resource_properties(
        "AWS::S3::BucketPolicy",
        {
            "PolicyDocument": Match.object_like(
                {
                    "Statement": Match.array_with(
                        [
                            Match.object_like(
                                {
                                    "Effect": "Deny",
                                    "Principal": {"AWS": "*"},
                                    "Action": "s3:*",
                                    "Condition": {"Bool": {"aws:SecureTransport": "false"}},
                                }
                            ),
                            Match.object_like(
                                {
                                    "Effect": "Deny",
                                    "Condition": {"NumericLessThan": {"s3:TlsVersion": 1.2}},
                                }
                            ),
                        ]
                    )
                }
            )
        },
    )


def test_bucket_aborts_incomplete_multipart_uploads(synthesized: Synthesized) -> None:
    synthesized.template.has_resource_properties(
        "AWS::S3::Bucket",
        {
            "LifecycleConfiguration": {
                "Rules": Match.array_with(
                    [
                        Match.object_like(
                            {
                                "AbortIncompleteMultipartUpload": {"DaysAfterInitiation": 1},
                                "Status": "Enabled",
                            }
                        )
                    ]
                )
            }
        },
    )


def test_bucket_goes_with_the_stack_by_default(synthesized: Synthesized) -> None:
    synthesized.template.has_resource(
        "AWS::S3::Bucket", {"DeletionPolicy": "Delete", "UpdateReplacePolicy": "Delete"}
    )
    synthesized.template.resource_count_is("Custom::S3AutoDeleteObjects", 1)


def test_keep_results_keeps_the_bucket(synth_with: Callable[..., Synthesized]) -> None:
    kept = synth_with(keep_results="true")
    kept.template.has_resource(
        "AWS::S3::Bucket", {"DeletionPolicy": "Retain", "UpdateReplacePolicy": "Retain"}
    )
    kept.template.resource_count_is("Custom::S3AutoDeleteObjects", 0)


# --- encryption everywhere ---


def test_everything_that_stores_data_is_encrypted(template_json: dict[str, Any]) -> None:
    for bucket in resources(template_json, "AWS::S3::Bucket").values():
        assert "BucketEncryption" in bucket["Properties"]
    for data in launch_template_data(template_json).values():
        for mapping in data["BlockDeviceMappings"]:
            assert mapping["Ebs"]["Encrypted"] is True
    # Secrets Manager always encrypts (aws/secretsmanager key unless one is named); the
    # instance role reads with GetSecretValue only, which needs no kms grant for that key.
    assert resources(template_json, "AWS::SecretsManager::Secret")
    assert not resources(template_json, "AWS::EC2::Volume")


# --- agent asset and user data wiring ---


def test_asset_holds_only_the_agent_packages(synthesized: Synthesized) -> None:
    staged = synthesized.outdir / synthesized.stack.agent_asset.asset.asset_path
    top = sorted(p.name for p in staged.iterdir())
    assert set(top) <= {"agent", "contract", "engines", "pyproject.toml", "README.md"}
    assert {"agent", "contract", "engines", "pyproject.toml"} <= set(top)
    names = [p.relative_to(staged).as_posix() for p in staged.rglob("*")]
    bad = [
        n
        for n in names
        if "/tests/" in f"/{n}/"
        or "__pycache__" in n
        or n.endswith((".pyc", ".pyo"))
        or ".venv" in n
        or "cdk.out" in n
    ]
    assert not bad
    assert (staged / "contract" / "layout.py").is_file()
    size = sum(p.stat().st_size for p in staged.rglob("*") if p.is_file())
    assert size < ASSET_SIZE_LIMIT_BYTES, "a build output or model file slipped into the asset?"


def test_user_data_fetches_this_asset_and_starts_the_agent(synthesized: Synthesized) -> None:
    for data in launch_template_data(synthesized.template_json).values():
        text = json.dumps(data["UserData"])
        assert synthesized.stack.agent_asset.asset.s3_object_key in text
        assert "-m agent" in text
        assert "systemctl enable --now" in text


# --- launch templates ---


def test_spot_template_is_one_time_and_terminates(template_json: dict[str, Any]) -> None:
    spot = launch_template_data(template_json, "x86_64")["spot"]
    assert spot["InstanceMarketOptions"] == {
        "MarketType": "spot",
        "SpotOptions": {
            "SpotInstanceType": "one-time",
            "InstanceInterruptionBehavior": "terminate",
        },
    }


@pytest.mark.parametrize("arch", CPU_ARCHITECTURES)
def test_templates_identical_but_for_market_options(
    template_json: dict[str, Any], arch: str
) -> None:
    data = launch_template_data(template_json, arch)
    spot = dict(data["spot"])
    spot.pop("InstanceMarketOptions")
    assert "InstanceMarketOptions" not in data["on-demand"]
    assert spot == data["on-demand"]


def test_each_architecture_has_its_own_pair_on_its_own_ami(template_json: dict[str, Any]) -> None:
    x86, arm = (launch_template_data(template_json, arch) for arch in CPU_ARCHITECTURES)
    assert x86["spot"]["ImageId"] != arm["spot"]["ImageId"]
    for arch in CPU_ARCHITECTURES:
        for data in launch_template_data(template_json, arch).values():
            assert f"/deeplearning/ami/{arch}/" in data["ImageId"]
    # Everything else is the same: one user data, one profile, one volume layout.
    strip = ("ImageId", "InstanceType")
    assert {k: v for k, v in x86["spot"].items() if k not in strip} == {
        k: v for k, v in arm["spot"].items() if k not in strip
    }
    # Not every region offers G5g: the arm64 pair names no type; each launch sets it.
    assert "InstanceType" not in arm["spot"] and "InstanceType" not in arm["on-demand"]


def test_templates_ami_imds_shutdown_profile_sg(synthesized: Synthesized) -> None:
    template_json = synthesized.template_json
    profile_id, _ = one(template_json, "AWS::IAM::InstanceProfile")
    sg_ids = list(resources(template_json, "AWS::EC2::SecurityGroup"))
    for key, data in launch_template_data(template_json).items():
        arch = key.split()[0]
        assert data["ImageId"] == f"resolve:ssm:{DEFAULT_AMI_PARAMETERS[arch]}"
        assert data["MetadataOptions"] == {
            "HttpEndpoint": "enabled",
            "HttpTokens": "required",
            "HttpPutResponseHopLimit": 1,
            "InstanceMetadataTags": "enabled",
        }
        assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
        assert data["IamInstanceProfile"] == {"Arn": {"Fn::GetAtt": [profile_id, "Arn"]}}
        assert data["SecurityGroupIds"] == [{"Fn::GetAtt": [sg_ids[0], "GroupId"]}]
        assert data.get("InstanceType") == (DEFAULT_INSTANCE_TYPE if arch == "x86_64" else None)
        assert "UserData" in data


def test_root_volume_gp3_sized_and_provisioned(synth_with: Callable[..., Synthesized]) -> None:
    for size, synthesized in ((200, synth_with()), (300, synth_with(root_volume_gib="300"))):
        for data in launch_template_data(synthesized.template_json).values():
            (mapping,) = data["BlockDeviceMappings"]
            ebs = mapping["Ebs"]
            assert mapping["DeviceName"] == "/dev/sda1"
            assert ebs["VolumeType"] == "gp3"
            assert ebs["VolumeSize"] == size
            assert ebs["Encrypted"] is True and ebs["DeleteOnTermination"] is True
            assert ebs["Throughput"] >= 500  # gp3 default 125 MiB/s was the load bottleneck
            assert ebs["Iops"] > 3000
            assert ebs["Throughput"] <= ebs["Iops"] / 4  # gp3: at most 0.25 MiB/s per IOPS
            assert 100 <= ebs["VolumeInitializationRate"] <= 300


def test_instance_type_default_comes_from_context(synth_with: Callable[..., Synthesized]) -> None:
    synthesized = synth_with(instance_type="g6e.2xlarge")
    for data in launch_template_data(synthesized.template_json, "x86_64").values():
        assert data["InstanceType"] == "g6e.2xlarge"
    for data in launch_template_data(synthesized.template_json, "arm64").values():
        assert "InstanceType" not in data


# --- outputs ---


def test_outputs_the_launcher_reads(template_json: dict[str, Any]) -> None:
    outputs = template_json["Outputs"]
    wanted = {
        layout.OUTPUT_BUCKET,
        *(
            layout.launch_template_output(arch, market)
            for arch in CPU_ARCHITECTURES
            for market in ("spot", "on-demand")
        ),
        layout.OUTPUT_SUBNETS_BY_AZ,
        layout.OUTPUT_HF_SECRET_ARN,
        layout.OUTPUT_STATUS_PREFIX,
    }
    assert wanted <= set(outputs)
    assert outputs[layout.OUTPUT_STATUS_PREFIX]["Value"] == layout.STATUS_PARAMETER_PREFIX
    bucket_id, _ = one(template_json, "AWS::S3::Bucket")
    assert outputs[layout.OUTPUT_BUCKET]["Value"] == {"Ref": bucket_id}
    secret_id, _ = one(template_json, "AWS::SecretsManager::Secret")
    assert outputs[layout.OUTPUT_HF_SECRET_ARN]["Value"] == {"Ref": secret_id}
    parts = outputs[layout.OUTPUT_SUBNETS_BY_AZ]["Value"]["Fn::Join"][1]
    subnet_refs = [p["Ref"] for p in parts if isinstance(p, dict)]
    assert sorted(subnet_refs) == sorted(resources(template_json, "AWS::EC2::Subnet"))
    rendered = "".join(p if isinstance(p, str) else "subnet-x" for p in parts)
    assert json.loads(rendered) == {az: "subnet-x" for az in DEFAULT_AZS}


def test_no_lookups_no_account_in_template(synthesized: Synthesized) -> None:
    """Synth needed no AWS call: no missing context, no literal account id."""
    assert synthesized.stack.account.startswith("${Token")
    manifest = json.loads((synthesized.outdir / "manifest.json").read_text())
    assert "missing" not in manifest
    assert not any(
        isinstance(node, str) and node.isdigit() and len(node) == 12
        for node in walk(synthesized.template_json)
    )
