"""The HF token from Secrets Manager (moto server): read, masked, errors that name the secret."""

from __future__ import annotations

import io
import logging

import boto3
import pytest

from agent.aws.secrets import (
    SecretError,
    SecretRedactingFilter,
    engine_env,
    read_hf_token,
    redact,
)
from agent.supervisor import redact_env
from contract.layout import AGENT_ENV_HF_SECRET_ID
from tests.fixtures.moto_server import MotoServer


def test_token_is_read_and_never_logged(
    hf_secret: str, token_marker: str, caplog: pytest.LogCaptureFixture
):
    # DEBUG everywhere: botocore logs response bodies at DEBUG, the factory must quiet it.
    caplog.set_level(logging.DEBUG)
    token = read_hf_token()
    assert token.reveal() == token_marker
    assert token_marker not in str(token) and token_marker not in repr(token)
    assert token_marker not in f"{token} {token!r}"
    assert hf_secret in caplog.text  # the log says which secret was read...
    assert token_marker not in caplog.text  # ...never what it holds
    for record in caplog.records:
        assert token_marker not in record.getMessage()


def test_engine_env_gives_the_token_under_masked_names(hf_secret: str, token_marker: str):
    env = engine_env(read_hf_token())
    assert env == {"HF_TOKEN": token_marker, "HUGGING_FACE_HUB_TOKEN": token_marker}
    assert token_marker not in str(redact_env(env))  # the supervisor's log view of it


def test_json_secret_is_accepted(aws: MotoServer, token_marker: str):
    arn = boto3.client("secretsmanager").create_secret(
        Name="json-token", SecretString=f'{{"HF_TOKEN": "{token_marker}"}}'
    )["ARN"]
    assert read_hf_token(arn).reveal() == token_marker


def test_secret_without_a_value_names_the_secret(aws: MotoServer):
    # What the stack creates: a secret with no value until the user stores one.
    arn = boto3.client("secretsmanager").create_secret(Name="unset")["ARN"]
    with pytest.raises(SecretError, match="put-secret-value") as err:
        read_hf_token(arn)
    assert arn in str(err.value)


def test_blank_secret_names_the_secret(aws: MotoServer):
    arn = boto3.client("secretsmanager").create_secret(Name="blank", SecretString="  \n")["ARN"]
    with pytest.raises(SecretError, match="empty") as err:
        read_hf_token(arn)
    assert arn in str(err.value)


def test_unknown_secret_and_unset_env(aws: MotoServer, monkeypatch: pytest.MonkeyPatch):
    with pytest.raises(SecretError, match="no-such-secret"):
        read_hf_token("no-such-secret")
    monkeypatch.delenv(AGENT_ENV_HF_SECRET_ID, raising=False)
    with pytest.raises(SecretError, match=AGENT_ENV_HF_SECRET_ID):
        read_hf_token()


def test_error_messages_never_hold_the_value(aws: MotoServer, token_marker: str):
    arn = boto3.client("secretsmanager").create_secret(
        Name="json-no-key", SecretString=f'{{"other": "{token_marker}"}}'
    )["ARN"]
    with pytest.raises(SecretError) as err:
        read_hf_token(arn)
    assert token_marker not in str(err.value)


def test_redaction_of_text_and_log_lines(hf_secret: str, token_marker: str):
    read_hf_token()
    assert redact(f"engine said: token={token_marker}!") == "engine said: token=***!"
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.addFilter(SecretRedactingFilter())
    logger = logging.getLogger("test.redaction")
    logger.addHandler(handler)
    try:
        logger.error("server log tail: %s", f"HF_TOKEN={token_marker}")
        try:
            raise RuntimeError(f"crash with {token_marker}")
        except RuntimeError:
            logger.exception("engine failed")
    finally:
        logger.removeHandler(handler)
    assert "HF_TOKEN=***" in stream.getvalue()
    assert token_marker not in stream.getvalue()
