"""The one boto3 client factory of the agent, the table of AWS errors, and bounded retries.

Every AWS call the agent makes goes through a client from `make_client`:

- credentials from boto3's standard chain (on an instance: the instance role via IMDS);
- endpoints from boto3's own configuration, so `AWS_ENDPOINT_URL` (all services) and
  `AWS_ENDPOINT_URL_<SERVICE>` (e.g. `AWS_ENDPOINT_URL_S3`) point it anywhere: tests use a
  moto server on 127.0.0.1, and nothing in the agent names an endpoint;
- botocore's "standard" retry mode with a small attempt count and short timeouts, because
  the callers that must not give up (uploads, status) run their own longer, time-bounded
  retry loops (`call_with_retry`) on top, and callers that must not stall (status) need a
  call to end quickly.

Errors are classified by one table (`classify`), by error code first, then HTTP status,
then exception type, so every caller decides retry-or-give-up the same way.

botocore logs whole response bodies at DEBUG (a GetSecretValue body holds the HF token), so
the factory keeps botocore's and its HTTP stack's loggers at INFO or above whatever the
agent's own level is.
"""

from __future__ import annotations

import enum
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import boto3
import botocore.exceptions as bce
from botocore.config import Config

from contract.errors import BenchError

__all__ = [
    "AwsCallError",
    "ClientSettings",
    "ErrorKind",
    "RetryPolicy",
    "call_with_retry",
    "classify",
    "describe",
    "error_code",
    "make_client",
    "reset_session",
]

log = logging.getLogger(__name__)

T = TypeVar("T")


class ErrorKind(enum.Enum):
    """What an AWS failure means for the caller."""

    TRANSIENT = "transient"  # network, timeouts, 5xx: retry with backoff
    THROTTLED = "throttled"  # slow down: retry with backoff
    NOT_FOUND = "not_found"  # the object/parameter/secret (value) does not exist
    DENIED = "denied"  # credentials or permissions: retrying will not help
    INVALID = "invalid"  # a bad request (a bug or bad input): retrying will not help

    @property
    def retryable(self) -> bool:
        return self in (ErrorKind.TRANSIENT, ErrorKind.THROTTLED)


_K = ErrorKind
# Error codes of the services the agent uses (S3, SSM, Secrets Manager, EC2, STS), from
# their API references and botocore's retry tables (botocore/retries/standard.py).
ERROR_CODES: Mapping[str, ErrorKind] = {
    # throttling
    "Throttling": _K.THROTTLED,
    "ThrottlingException": _K.THROTTLED,
    "ThrottledException": _K.THROTTLED,
    "RequestThrottled": _K.THROTTLED,
    "RequestThrottledException": _K.THROTTLED,
    "TooManyRequestsException": _K.THROTTLED,
    "RequestLimitExceeded": _K.THROTTLED,
    "SlowDown": _K.THROTTLED,
    "BandwidthLimitExceeded": _K.THROTTLED,
    "TooManyUpdates": _K.THROTTLED,  # SSM PutParameter on one parameter too often
    "LimitExceededException": _K.THROTTLED,
    # transient server-side failures
    "InternalError": _K.TRANSIENT,
    "InternalFailure": _K.TRANSIENT,
    "InternalServerError": _K.TRANSIENT,
    "InternalServiceError": _K.TRANSIENT,  # Secrets Manager, SSM
    "ServiceUnavailable": _K.TRANSIENT,
    "Unavailable": _K.TRANSIENT,
    "RequestTimeout": _K.TRANSIENT,
    "RequestTimeoutException": _K.TRANSIENT,
    "PriorRequestNotComplete": _K.TRANSIENT,
    # Instance-role credentials rotate; botocore refreshes them, so a retry gets new ones.
    "ExpiredToken": _K.TRANSIENT,
    "ExpiredTokenException": _K.TRANSIENT,
    "RequestExpired": _K.TRANSIENT,
    # missing things
    "NoSuchKey": _K.NOT_FOUND,
    "NoSuchBucket": _K.NOT_FOUND,
    "NotFound": _K.NOT_FOUND,
    "404": _K.NOT_FOUND,  # HeadObject has no body, so botocore uses the status as the code
    "ParameterNotFound": _K.NOT_FOUND,
    "ResourceNotFoundException": _K.NOT_FOUND,
    # credentials and permissions
    "AccessDenied": _K.DENIED,
    "AccessDeniedException": _K.DENIED,
    "UnauthorizedOperation": _K.DENIED,
    "AuthFailure": _K.DENIED,
    "InvalidAccessKeyId": _K.DENIED,
    "InvalidClientTokenId": _K.DENIED,
    "UnrecognizedClientException": _K.DENIED,
    "SignatureDoesNotMatch": _K.DENIED,
    "403": _K.DENIED,
    # bad requests
    "ValidationException": _K.INVALID,
    "ValidationError": _K.INVALID,
    "InvalidParameterException": _K.INVALID,
    "InvalidParameterValue": _K.INVALID,
    "InvalidRequestException": _K.INVALID,  # Secrets Manager: e.g. secret scheduled for deletion
    "InvalidRequest": _K.INVALID,
    "DecryptionFailure": _K.DENIED,  # Secrets Manager cannot use the KMS key
    "EntityTooLarge": _K.INVALID,
    "ParameterLimitExceeded": _K.INVALID,
    "HierarchyLevelLimitExceededException": _K.INVALID,
    "UnsupportedParameterType": _K.INVALID,
}

# When the code is unknown, the HTTP status decides.
HTTP_STATUSES: Mapping[int, ErrorKind] = {
    400: _K.INVALID,
    401: _K.DENIED,
    403: _K.DENIED,
    404: _K.NOT_FOUND,
    408: _K.TRANSIENT,
    429: _K.THROTTLED,
    500: _K.TRANSIENT,
    502: _K.TRANSIENT,
    503: _K.TRANSIENT,
    504: _K.TRANSIENT,
}

# Failures below the HTTP layer, matched along the exception's class hierarchy.
EXCEPTION_TYPES: Mapping[type[BaseException], ErrorKind] = {
    bce.ConnectionError: _K.TRANSIENT,  # refused, reset, DNS, connect/read timeouts
    bce.HTTPClientError: _K.TRANSIENT,
    bce.NoCredentialsError: _K.DENIED,
    bce.PartialCredentialsError: _K.DENIED,
    bce.CredentialRetrievalError: _K.TRANSIENT,  # the instance role's IMDS fetch failed
    bce.NoRegionError: _K.INVALID,
    bce.ParamValidationError: _K.INVALID,
}


def error_code(exc: BaseException) -> str | None:
    """The AWS error code of a ClientError (None for other exceptions)."""
    if isinstance(exc, bce.ClientError):
        return str(exc.response.get("Error", {}).get("Code") or "") or None
    return None


def classify(exc: BaseException) -> ErrorKind:
    """What an exception from a boto3 call means: by code, then HTTP status, then type.

    Anything unknown counts as INVALID, so the caller fails fast and says what it got rather
    than retrying a bug for minutes.
    """
    if isinstance(exc, bce.ClientError):
        code = error_code(exc)
        if code is not None and code in ERROR_CODES:
            return ERROR_CODES[code]
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            if status in HTTP_STATUSES:
                return HTTP_STATUSES[status]
            if status >= 500:
                return _K.TRANSIENT
        return _K.INVALID
    for cls in type(exc).__mro__:
        if cls in EXCEPTION_TYPES:
            return EXCEPTION_TYPES[cls]
    return _K.INVALID


class AwsCallError(BenchError, RuntimeError):
    """An AWS call failed for good (not retryable, or out of time); the message says which."""

    def __init__(self, what: str, kind: ErrorKind, detail: str, code: str | None = None):
        self.what = what
        self.kind = kind
        self.code = code
        self.detail = detail
        super().__init__(f"{what}: {kind.value}: {detail}")


def describe(exc: BaseException) -> str:
    """One line about a boto3 failure: code and message, or the exception type and text."""
    if isinstance(exc, bce.ClientError):
        err = exc.response.get("Error", {})
        return f"{err.get('Code', '?')}: {err.get('Message', '') or exc}"
    return f"{type(exc).__name__}: {exc}"


@dataclass(frozen=True)
class ClientSettings:
    """How a client talks to AWS: botocore's own attempts per call and its timeouts."""

    attempts: int = 3
    connect_timeout_s: float = 5.0
    read_timeout_s: float = 30.0

    def config(self) -> Config:
        return Config(
            retries={"mode": "standard", "total_max_attempts": self.attempts},
            connect_timeout=self.connect_timeout_s,
            read_timeout=self.read_timeout_s,
        )


DEFAULT_SETTINGS = ClientSettings()

# boto3's default session is not safe to build clients from concurrently; one session and
# a lock are (the clients themselves are thread-safe).
_session_lock = threading.Lock()
_session: boto3.session.Session | None = None
# Loggers that print request or response bodies at DEBUG.
_CHATTY_LOGGERS = ("botocore", "boto3", "s3transfer", "urllib3")


def _quiet_chatty_loggers() -> None:
    for name in _CHATTY_LOGGERS:
        logger = logging.getLogger(name)
        if logger.getEffectiveLevel() < logging.INFO:
            logger.setLevel(logging.INFO)


def make_client(
    service: str, *, region: str | None = None, settings: ClientSettings = DEFAULT_SETTINGS
) -> Any:
    """A boto3 client for `service` ("s3", "ssm", "secretsmanager", "ec2", ...).

    Args:
        service: the boto3 service name.
        region: a region name; default: boto3's chain (`AWS_DEFAULT_REGION`, set by the
            user data, or the config file).
        settings: botocore's per-call attempts and timeouts.
    """
    global _session
    with _session_lock:
        _quiet_chatty_loggers()
        if _session is None:
            _session = boto3.session.Session()
        return _session.client(service, region_name=region, config=settings.config())


def reset_session() -> None:
    """Forget the shared session, so the next client reads the environment afresh (tests)."""
    global _session
    with _session_lock:
        _session = None


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter, bounded by a count and a time budget."""

    budget_s: float = 60.0
    max_attempts: int = 20
    base_delay_s: float = 0.5
    max_delay_s: float = 15.0

    def delay(self, attempt: int) -> float:
        """Seconds to wait after failed attempt number `attempt` (1-based)."""
        cap = min(self.max_delay_s, self.base_delay_s * 2 ** min(attempt - 1, 30))
        return random.uniform(cap / 2, cap)


def call_with_retry(
    call: Callable[[], T],
    *,
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    stop: threading.Event | None = None,
) -> T:
    """Run `call` until it succeeds, retrying retryable AWS failures within `policy`.

    Args:
        call: the boto3 call (no arguments; bind them with a lambda or functools.partial).
        what: what is being done, for messages ("upload s3://b/k").
        policy: attempts, time budget and backoff.
        stop: when set, give up at once (shutting down).

    Raises:
        AwsCallError: a non-retryable failure, or attempts or time ran out; `kind` says which.
    """
    deadline = time.monotonic() + policy.budget_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as exc:  # classified below; unknown types count as INVALID
            kind = classify(exc)
            detail = describe(exc)
            if not kind.retryable:
                raise AwsCallError(what, kind, detail, error_code(exc)) from exc
            delay = policy.delay(attempt)
            left = deadline - time.monotonic()
            if attempt >= policy.max_attempts or delay > left:
                raise AwsCallError(
                    what, kind, f"{detail} (gave up after {attempt} attempts)", error_code(exc)
                ) from exc
            log.warning("%s: %s (attempt %d), retrying in %.1f s", what, detail, attempt, delay)
            if stop is not None:
                if stop.wait(delay):
                    raise AwsCallError(what, kind, f"{detail} (stopped)", error_code(exc)) from exc
            else:
                time.sleep(delay)
