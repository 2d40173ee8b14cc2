"""The client factory, the error table and the bounded retry helper."""

from __future__ import annotations

import logging
import time

import boto3
import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
)

from agent.aws.clients import (
    AwsCallError,
    ErrorKind,
    RetryPolicy,
    call_with_retry,
    classify,
    make_client,
)
from agent.supervisor import free_port
from tests.fixtures.moto_server import MotoServer


def _client_error(code: str, status: int = 400) -> ClientError:
    return ClientError(
        {"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}},
        "Op",
    )


@pytest.mark.parametrize(
    ("exc", "kind"),
    [
        (_client_error("SlowDown", 503), ErrorKind.THROTTLED),
        (_client_error("ThrottlingException"), ErrorKind.THROTTLED),
        (_client_error("TooManyUpdates"), ErrorKind.THROTTLED),
        (_client_error("InternalError", 500), ErrorKind.TRANSIENT),
        (_client_error("NoSuchKey", 404), ErrorKind.NOT_FOUND),
        (_client_error("ResourceNotFoundException"), ErrorKind.NOT_FOUND),
        (_client_error("AccessDenied", 403), ErrorKind.DENIED),
        (_client_error("ValidationException"), ErrorKind.INVALID),
        (_client_error("SomethingNew", 502), ErrorKind.TRANSIENT),  # by HTTP status
        (_client_error("SomethingNew", 429), ErrorKind.THROTTLED),
        (_client_error("SomethingNew", 418), ErrorKind.INVALID),
        (EndpointConnectionError(endpoint_url="http://x"), ErrorKind.TRANSIENT),
        (ConnectTimeoutError(endpoint_url="http://x"), ErrorKind.TRANSIENT),
        (NoCredentialsError(), ErrorKind.DENIED),
        (ValueError("not AWS"), ErrorKind.INVALID),
    ],
)
def test_classify(exc: BaseException, kind: ErrorKind):
    assert classify(exc) is kind


def test_retry_until_success():
    calls = []

    def flaky() -> str:
        calls.append(1)
        if len(calls) < 3:
            raise _client_error("ServiceUnavailable", 503)
        return "ok"

    policy = RetryPolicy(budget_s=5, base_delay_s=0.01, max_delay_s=0.02)
    assert call_with_retry(flaky, what="op", policy=policy) == "ok"
    assert len(calls) == 3


def test_no_retry_for_permanent_errors():
    calls = []

    def denied() -> None:
        calls.append(1)
        raise _client_error("AccessDenied", 403)

    with pytest.raises(AwsCallError, match="denied") as err:
        call_with_retry(denied, what="op", policy=RetryPolicy(base_delay_s=0.01))
    assert err.value.kind is ErrorKind.DENIED and err.value.code == "AccessDenied"
    assert len(calls) == 1


def test_retry_is_bounded_in_time_and_count():
    def down() -> None:
        raise EndpointConnectionError(endpoint_url="http://x")

    started = time.monotonic()
    with pytest.raises(AwsCallError, match="gave up"):
        call_with_retry(down, what="op", policy=RetryPolicy(budget_s=0.5, base_delay_s=0.05))
    assert time.monotonic() - started < 1.0
    with pytest.raises(AwsCallError, match="gave up after 4 attempts"):
        call_with_retry(down, what="op", policy=RetryPolicy(max_attempts=4, base_delay_s=0.001))


def test_factory_honours_aws_endpoint_url(aws: MotoServer, monkeypatch: pytest.MonkeyPatch):
    boto3.client("s3").create_bucket(Bucket="made-by-test")
    s3 = make_client("s3")
    assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["made-by-test"]
    # A per-service endpoint wins over the general one.
    elsewhere = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("AWS_ENDPOINT_URL_SSM", elsewhere)
    assert make_client("ssm").meta.endpoint_url == elsewhere
    assert s3.meta.endpoint_url == aws.url


def test_factory_keeps_botocore_out_of_debug(aws: MotoServer):
    root = logging.getLogger()
    old = root.level
    root.setLevel(logging.DEBUG)
    try:
        make_client("s3")
        assert logging.getLogger("botocore").getEffectiveLevel() >= logging.INFO
    finally:
        root.setLevel(old)
