"""Fixtures for the agent's AWS side: the moto server (tests/conftest.py's `aws`), a results
bucket, the fake IMDS, and a Hugging Face token marker stored in Secrets Manager."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest

from agent.aws import clients
from contract.layout import AGENT_ENV_BUCKET, AGENT_ENV_HF_SECRET_ID, TAG_CAMPAIGN, TAG_SHARD
from tests.fixtures.fake_imds import FakeImds, fake_imds
from tests.fixtures.moto_server import MotoServer

CAMPAIGN = "camp-1"
SHARD = "g6-a"
BUCKET = "bench-results-test"


@pytest.fixture(autouse=True)
def fresh_boto_session() -> Iterator[None]:
    """Each test's clients read that test's environment (endpoints, credentials)."""
    clients.reset_session()
    yield
    clients.reset_session()


@pytest.fixture
def bucket(aws: MotoServer, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty results bucket in moto, named in $BENCH_BUCKET as the user data does."""
    boto3.client("s3").create_bucket(Bucket=BUCKET)
    monkeypatch.setenv(AGENT_ENV_BUCKET, BUCKET)
    return BUCKET


@pytest.fixture
def imds(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeImds]:
    """The fake IMDS of a spot instance tagged with CAMPAIGN/SHARD, in $BENCH_IMDS_ENDPOINT."""
    with fake_imds(tags={TAG_CAMPAIGN: CAMPAIGN, TAG_SHARD: SHARD, "Name": "bench"}) as server:
        monkeypatch.setenv("BENCH_IMDS_ENDPOINT", server.url)
        yield server


@pytest.fixture
def token_marker() -> str:
    """A token-shaped value that must never leave memory (tests grep for it)."""
    return f"hf_MARKER{uuid.uuid4().hex}"


@pytest.fixture
def hf_secret(aws: MotoServer, token_marker: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The HF-token secret holding the marker; its ARN in $BENCH_HF_SECRET_ID."""
    arn = boto3.client("secretsmanager").create_secret(
        Name="bench-hf-token", SecretString=token_marker
    )["ARN"]
    monkeypatch.setenv(AGENT_ENV_HF_SECRET_ID, arn)
    return str(arn)
