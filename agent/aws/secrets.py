"""The Hugging Face token: read from Secrets Manager at run time, for engines' environments only.

The stack creates the secret empty; the user stores the token with `put-secret-value`
(README). Its id (an ARN) reaches the agent as `BENCH_HF_SECRET_ID` in the environment the
user data writes; the token itself never passes through user data, argv, logs, the status,
the manifest or the tarball (docs/DESIGN.md, "Rules").

Here:
- `read_hf_token` fetches it, with a clear error naming the secret (never its value) when the
  secret has no value, an empty value, or cannot be read;
- the value stays in memory, wrapped in `SecretValue`, whose str/repr are masked, so an
  f-string or a log call by mistake prints `***`;
- `engine_env` is the only way out: a mapping for an engine process's environment
  (`HF_TOKEN`, and the older `HUGGING_FACE_HUB_TOKEN`), whose names agent.supervisor masks;
- every value read is registered, so `redact` (status text, log lines, result files before
  upload) and `SecretRedactingFilter` (log handlers) can blank it wherever it turns up.
"""

from __future__ import annotations

import json
import logging
import os
import threading
from typing import Any

from agent.aws.clients import AwsCallError, ErrorKind, RetryPolicy, call_with_retry, make_client
from contract.errors import BenchError
from contract.layout import AGENT_ENV_HF_SECRET_ID

__all__ = [
    "ENGINE_TOKEN_VARS",
    "MASK",
    "SecretError",
    "SecretRedactingFilter",
    "SecretValue",
    "engine_env",
    "known_secret_values",
    "read_hf_token",
    "redact",
    "redact_bytes",
]

log = logging.getLogger(__name__)

MASK = "***"
# huggingface_hub reads HF_TOKEN; older transformers/vLLM releases HUGGING_FACE_HUB_TOKEN.
ENGINE_TOKEN_VARS = ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")
# A JSON secret ({"HF_TOKEN": "..."}, as the console's key/value editor writes) is accepted too.
_JSON_KEYS = ("HF_TOKEN", "hf_token", "token", "HUGGING_FACE_HUB_TOKEN")
# Values shorter than this are not redacted in free text (they would blank common words);
# no real HF token is this short.
_MIN_REDACT_LEN = 8

_registry_lock = threading.Lock()
_registry: set[str] = set()


class SecretError(BenchError, RuntimeError):
    """The secret could not be used; the message names the secret id, never the value."""


class SecretValue:
    """A secret string that does not print itself."""

    __slots__ = ("_value", "source")

    def __init__(self, value: str, source: str) -> None:
        self._value = value
        self.source = source

    def reveal(self) -> str:
        """The value, for an engine's environment only."""
        return self._value

    def __str__(self) -> str:
        return MASK

    def __repr__(self) -> str:
        return f"SecretValue({MASK}, source={self.source!r})"

    def __reduce__(self) -> Any:
        # Keep it out of pickles (multiprocessing, caches).
        raise TypeError("SecretValue cannot be pickled")


def _register(value: str) -> None:
    if len(value) >= _MIN_REDACT_LEN:
        with _registry_lock:
            _registry.add(value)


def known_secret_values() -> frozenset[str]:
    """Every secret value read by this process (for redaction; never log this)."""
    with _registry_lock:
        return frozenset(_registry)


def redact(text: str) -> str:
    """`text` with every known secret value replaced by ***."""
    for value in known_secret_values():
        if value in text:
            text = text.replace(value, MASK)
    return text


def redact_bytes(data: bytes) -> bytes:
    """`data` with every known secret value (UTF-8) replaced by ***."""
    for value in known_secret_values():
        raw = value.encode()
        if raw in data:
            data = data.replace(raw, MASK.encode())
    return data


class SecretRedactingFilter(logging.Filter):
    """A handler filter that blanks known secret values in the formatted message.

    Defence in depth, on the agent's log handlers: nothing should log a secret, but an
    engine's error text quoted in a log line might contain one.
    """

    def filter(self, record: logging.LogRecord) -> bool:
        if not known_secret_values():
            return True
        message = record.getMessage()
        clean = redact(message)
        if clean != message:
            record.msg, record.args = clean, None
        if record.exc_info and record.exc_text is None and record.exc_info[1] is not None:
            text = logging.Formatter().formatException(record.exc_info)
            record.exc_text = redact(text)
        elif record.exc_text:
            record.exc_text = redact(record.exc_text)
        return True


def _extract(secret_id: str, response: dict[str, Any]) -> str:
    raw = response.get("SecretString")
    if raw is None:
        raise SecretError(
            f"HF token secret {secret_id} holds binary data, not a string; store the token "
            "with `aws secretsmanager put-secret-value --secret-string`"
        )
    value = raw.strip()
    if value.startswith("{"):
        try:
            data = json.loads(value)
        except ValueError:
            data = None
        if isinstance(data, dict):
            found = next((data[k] for k in _JSON_KEYS if isinstance(data.get(k), str)), None)
            if found is None:
                raise SecretError(
                    f"HF token secret {secret_id} is a JSON object without any of the keys "
                    f"{', '.join(_JSON_KEYS)}"
                )
            value = found.strip()
    if not value:
        raise SecretError(f"HF token secret {secret_id} is empty; store the token in it")
    return value


def read_hf_token(
    secret_id: str | None = None,
    *,
    client: Any | None = None,
    policy: RetryPolicy = RetryPolicy(budget_s=60.0),  # noqa: B008 - frozen
) -> SecretValue:
    """Read the HF token from Secrets Manager.

    Args:
        secret_id: the secret's ARN or name; default: `$BENCH_HF_SECRET_ID`.
        client: a secretsmanager client; default: one from the agent's factory.
        policy: retries for transient failures.

    Raises:
        SecretError: no secret id, the secret (or its value) does not exist, it is empty,
            not readable, or Secrets Manager stayed unreachable. The message names the
            secret id and never contains the value.
    """
    secret_id = secret_id or os.environ.get(AGENT_ENV_HF_SECRET_ID, "").strip()
    if not secret_id:
        raise SecretError(f"no HF token secret: ${AGENT_ENV_HF_SECRET_ID} is not set")
    client = client or make_client("secretsmanager")
    try:
        response = call_with_retry(
            lambda: client.get_secret_value(SecretId=secret_id),
            what=f"read HF token secret {secret_id}",
            policy=policy,
        )
    except AwsCallError as exc:
        if exc.kind is ErrorKind.NOT_FOUND:
            # The stack creates the secret with no value; GetSecretValue then says
            # ResourceNotFoundException until the user stores one.
            raise SecretError(
                f"HF token secret {secret_id} not found or has no value; store the token "
                "with `aws secretsmanager put-secret-value`"
            ) from None
        # The error text comes from AWS and names the call, not the value.
        raise SecretError(f"cannot read HF token secret {secret_id}: {exc.detail}") from None
    value = _extract(secret_id, response)
    del response  # the only other copy of the value; drop it now
    _register(value)
    log.info("HF token read from secret %s (%d characters)", secret_id, len(value))
    return SecretValue(value, source=secret_id)


def engine_env(token: SecretValue) -> dict[str, str]:
    """Environment entries giving an engine process the token (names contain TOKEN, which
    agent.supervisor masks whenever it logs an environment)."""
    return {name: token.reveal() for name in ENGINE_TOKEN_VARS}
