"""The one place the workstation makes boto3 clients.

Two kinds of client, from one session:

- `client(service)`: botocore's standard retry mode, several attempts; it rides out throttling
  (`RequestLimitExceeded`, `Throttling`, 5xx) on every describe, tag, S3 and SSM call.
- `launch_ec2`: EC2 for RunInstances only, one attempt and no botocore retry at all
  (`total_max_attempts=1`; note that the `max_attempts` key counts *retries*, so
  `max_attempts=1` would still retry once). `InsufficientInstanceCapacity` comes back as HTTP
  500, which standard mode retries as "transient"; SkyPilot found the same ("practically, it
  retries for capacity errors") and builds a fail-fast client for it. The launcher does its
  own back-off for throttling, by the table in `control.errors`.

Credentials come from the standard chain (environment, shared files, SSO, instance or
container role); endpoints from the standard resolution, so `AWS_ENDPOINT_URL` points every
client at a local moto server. Clients are made under a lock (a boto3 session is not
thread-safe) and then shared by the launch and fetch threads (clients are).
"""

from __future__ import annotations

import threading
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ProfileNotFound

from control.errors import ControlError

__all__ = ["CONTROL_CONFIG", "LAUNCH_CONFIG", "AwsClients"]

_USER_AGENT = "llm-serving-bench-control"
CONTROL_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 8},
    connect_timeout=10,
    read_timeout=60,
    max_pool_connections=32,
    user_agent_extra=_USER_AGENT,
)
LAUNCH_CONFIG = Config(
    retries={"mode": "standard", "total_max_attempts": 1},
    connect_timeout=10,
    read_timeout=60,
    user_agent_extra=_USER_AGENT,
)


class AwsClients:
    """boto3 clients for one region, made once each.

    Attributes:
        session: the boto3 session (standard credential chain).
        region: the region every client talks to.
    """

    def __init__(self, session: boto3.session.Session, region: str) -> None:
        self.session = session
        self.region = region
        self._lock = threading.Lock()
        self._clients: dict[tuple[str, str], Any] = {}

    @classmethod
    def from_environment(cls, *, region: str | None = None) -> AwsClients:
        """A session from the standard chain, checked for a region and for credentials.

        Raises:
            ControlError: no credentials, no region, or a named profile that does not exist.
        """
        try:
            session = boto3.session.Session(region_name=region)
            credentials = session.get_credentials()
        except ProfileNotFound as exc:
            raise ControlError(f"AWS profile not found: {exc}") from exc
        except BotoCoreError as exc:
            raise ControlError(f"AWS credentials could not be loaded: {exc}") from exc
        if credentials is None:
            raise ControlError(
                "no AWS credentials found (environment, ~/.aws, SSO or an instance role); "
                "run `aws configure` or `aws sso login`, or set AWS_PROFILE"
            )
        if not session.region_name:
            raise ControlError(
                "no AWS region set; set AWS_REGION (or AWS_DEFAULT_REGION, or a profile's "
                "region) to the region BenchStack is deployed in"
            )
        return cls(session, session.region_name)

    def client(self, service: str) -> Any:
        """A client with botocore's standard retries (throttling and 5xx ridden out)."""
        return self._get(service, "control", CONTROL_CONFIG)

    @property
    def launch_ec2(self) -> Any:
        """The EC2 client for RunInstances: one attempt, no botocore retry of any kind."""
        return self._get("ec2", "launch", LAUNCH_CONFIG)

    def _get(self, service: str, kind: str, config: Config) -> Any:
        key = (service, kind)
        with self._lock:
            if key not in self._clients:
                self._clients[key] = self.session.client(
                    service, region_name=self.region, config=config
                )
            return self._clients[key]
