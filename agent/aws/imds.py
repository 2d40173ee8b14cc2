"""IMDSv2: the instance's identity, market, own tags, and the spot interruption notice.

The launch templates require IMDSv2 (`HttpTokens: required`, hop limit 1) and put instance
tags in the metadata, so this client does what AWS documents ("Use the Instance Metadata
Service to access instance metadata", EC2 User Guide):

1. `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds: <1..21600>` returns a
   session token;
2. every `GET /latest/...` carries it in `X-aws-ec2-metadata-token`; an expired or unknown
   token gets 401, a missing path 404, throttling 429, a busy service 503.

The token is cached and renewed shortly before its TTL runs out (and once more on a 401, in
case the service restarted). One client is shared by the main thread and the spot poller,
so token handling holds a lock. Timeouts are short: IMDS is link-local and answers in
milliseconds or not at all (off EC2), and the spot poller must not hang.

The base URL is `http://169.254.169.254` unless `BENCH_IMDS_ENDPOINT` says otherwise (tests
point it at tests/fixtures/fake_imds.py). No proxy is ever used for it.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from datetime import datetime
from types import TracebackType
from urllib.parse import quote

import httpx
from pydantic import Field

from contract.errors import BenchError
from contract.frozen import FrozenModel
from contract.layout import TAG_CAMPAIGN, TAG_SHARD
from contract.status import Market

__all__ = [
    "DEFAULT_ENDPOINT",
    "ENDPOINT_ENV",
    "ImdsClient",
    "ImdsError",
    "InstanceIdentity",
    "SpotNotice",
]

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://169.254.169.254"
ENDPOINT_ENV = "BENCH_IMDS_ENDPOINT"
TOKEN_PATH = "/latest/api/token"
TTL_HEADER = "X-aws-ec2-metadata-token-ttl-seconds"
TOKEN_HEADER = "X-aws-ec2-metadata-token"
MAX_TTL_S = 21600  # AWS's upper bound for a token's TTL (6 hours)
# Statuses worth another try after a short pause (AWS: 429 throttled, 503 retry).
_RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})


class ImdsError(BenchError, RuntimeError):
    """IMDS could not answer (not on EC2, IMDS off, or a required item is missing)."""


class InstanceIdentity(FrozenModel):
    """Who and where this instance is, from IMDS (for the manifest and the status)."""

    instance_id: str
    instance_type: str
    availability_zone: str
    region: str
    lifecycle: str = Field(description="IMDS instance-life-cycle: spot, on-demand, ...")

    @property
    def market(self) -> Market:
        """Spot or on-demand: how the instance is billed (capacity blocks count as on-demand)."""
        return "spot" if self.lifecycle == "spot" else "on-demand"


class SpotNotice(FrozenModel):
    """The spot interruption notice (`spot/instance-action`): about two minutes' warning."""

    action: str = Field(description="terminate, stop or hibernate; 'unknown' if unreadable")
    time: datetime | None = Field(None, description="when EC2 acts, UTC")


class ImdsClient:
    """A small IMDSv2 client. Thread-safe; use as a context manager or call `close()`.

    Args:
        base_url: IMDS root; default `$BENCH_IMDS_ENDPOINT` or http://169.254.169.254.
        token_ttl_s: TTL asked for each token (1..21600).
        refresh_margin_s: renew the token when less than this is left of its TTL.
        timeout_s: connect and read timeout of each request.
        attempts: tries per request on connection errors, 429 and 5xx.
        retry_delay_s: pause between those tries (doubled each time).
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        token_ttl_s: int = MAX_TTL_S,
        refresh_margin_s: float = 60.0,
        timeout_s: float = 1.0,
        attempts: int = 3,
        retry_delay_s: float = 0.2,
    ) -> None:
        if not 1 <= token_ttl_s <= MAX_TTL_S:
            raise ValueError(f"token_ttl_s must be 1..{MAX_TTL_S}, got {token_ttl_s}")
        self.base_url = (base_url or os.environ.get(ENDPOINT_ENV) or DEFAULT_ENDPOINT).rstrip("/")
        self.token_ttl_s = token_ttl_s
        # A margin larger than the TTL would renew on every call; keep it below.
        self.refresh_margin_s = min(refresh_margin_s, token_ttl_s / 4)
        self.attempts = max(1, attempts)
        self.retry_delay_s = retry_delay_s
        # trust_env=False: IMDS must never go through an HTTP(S)_PROXY.
        self._http = httpx.Client(timeout=httpx.Timeout(timeout_s), trust_env=False)
        self._lock = threading.Lock()
        self._token: str | None = None
        self._token_expires = 0.0  # time.monotonic() at which the token lapses

    # --- plumbing ---

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> ImdsClient:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _send(self, method: str, path: str, headers: dict[str, str]) -> httpx.Response:
        """One request, retried on connection errors, 429 and 5xx (a bounded count)."""
        url = f"{self.base_url}{path}"
        delay = self.retry_delay_s
        for attempt in range(1, self.attempts + 1):
            try:
                response = self._http.request(method, url, headers=headers)
            except httpx.HTTPError as exc:
                if attempt == self.attempts:
                    raise ImdsError(f"IMDS {method} {path}: {type(exc).__name__}: {exc}") from exc
            else:
                if response.status_code not in _RETRY_STATUSES or attempt == self.attempts:
                    return response
            time.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")  # the loop returns or raises on its last attempt

    def _fresh_token(self, *, force: bool = False) -> str:
        with self._lock:
            now = time.monotonic()
            if not force and self._token and now < self._token_expires - self.refresh_margin_s:
                return self._token
            # Take the time before the request, so the recorded expiry is never late.
            response = self._send("PUT", TOKEN_PATH, {TTL_HEADER: str(self.token_ttl_s)})
            if response.status_code != 200 or not response.text:
                raise ImdsError(
                    f"IMDS token request: HTTP {response.status_code} "
                    "(IMDS disabled, or not an EC2 instance?)"
                )
            self._token = response.text.strip()
            self._token_expires = now + self.token_ttl_s
            log.debug("IMDS token renewed (ttl %d s)", self.token_ttl_s)
            return self._token

    def get(self, path: str) -> str | None:
        """GET `path` under the base URL with a valid token; None when IMDS says 404.

        Raises:
            ImdsError: IMDS unreachable, or an answer other than 200/404.
        """
        response = self._send("GET", path, {TOKEN_HEADER: self._fresh_token()})
        if response.status_code == 401:
            # The token was refused (IMDS restarted, or the clock jumped): one new one.
            response = self._send("GET", path, {TOKEN_HEADER: self._fresh_token(force=True)})
        if response.status_code == 404:
            return None
        if response.status_code != 200:
            raise ImdsError(f"IMDS GET {path}: HTTP {response.status_code}")
        return response.text

    def _required(self, path: str) -> str:
        value = self.get(path)
        if value is None:
            raise ImdsError(f"IMDS GET {path}: 404 (not available on this instance)")
        return value.strip()

    # --- what the agent asks ---

    def identity(self) -> InstanceIdentity:
        """Instance id, type, AZ, region and lifecycle (spot or on-demand)."""
        return InstanceIdentity(
            instance_id=self._required("/latest/meta-data/instance-id"),
            instance_type=self._required("/latest/meta-data/instance-type"),
            availability_zone=self._required("/latest/meta-data/placement/availability-zone"),
            region=self._required("/latest/meta-data/placement/region"),
            # Absent on some instance kinds; "on-demand" is what EC2 means by that.
            lifecycle=(self.get("/latest/meta-data/instance-life-cycle") or "on-demand").strip(),
        )

    def tag_keys(self) -> list[str]:
        """Keys of the instance's tags (empty if tags are not in the metadata)."""
        listing = self.get("/latest/meta-data/tags/instance")
        return [line for line in (listing or "").splitlines() if line]

    def tag(self, key: str) -> str | None:
        """One instance tag's value, None if the instance has no such tag."""
        return self.get(f"/latest/meta-data/tags/instance/{quote(key, safe=':')}")

    def tags(self) -> dict[str, str]:
        """All instance tags."""
        found: dict[str, str] = {}
        for key in self.tag_keys():
            value = self.tag(key)
            if value is not None:
                found[key] = value
        return found

    def campaign_and_shard(self) -> tuple[str, str]:
        """The campaign and shard this instance runs, from its `bench:*` tags.

        Raises:
            ImdsError: a tag is missing (naming it).
        """
        values = []
        for key in (TAG_CAMPAIGN, TAG_SHARD):
            value = self.tag(key)
            if not value:
                raise ImdsError(
                    f"instance tag {key!r} not found in instance metadata (launched without "
                    "it, or the launch template does not put tags in the metadata)"
                )
            values.append(value.strip())
        return values[0], values[1]

    def spot_notice(self) -> SpotNotice | None:
        """The interruption notice if EC2 has issued one, else None (AWS answers 404)."""
        body = self.get("/latest/meta-data/spot/instance-action")
        if body is None:
            return None
        try:
            data = json.loads(body)
            return SpotNotice(action=str(data["action"]), time=data.get("time"))
        except (ValueError, KeyError, TypeError) as exc:
            # A 200 here means a notice exists, whatever its body; acting on it is safer.
            log.warning("spot notice present but unreadable (%s): %.200r", exc, body)
            return SpotNotice(action="unknown")
