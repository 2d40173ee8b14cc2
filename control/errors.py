"""What a failed launch attempt means, by error code: a table, not an if/elif ladder.

The codes and what each rules out come from the EC2 API error-code reference and the projects
that have run this loop for years (AWS ParallelCluster's `EC2_ICE_ERROR_CODES`, Karpenter's
unfulfillable-capacity set, SkyPilot's retry-on-server-error list); see
shared/research/aws-cdk-and-launch.md section 2.3.

- `NEXT_SUBNET`: this pool (type x zone x market) has nothing; the next subnet may.
- `SWITCH_MARKET`: spot as a whole is ruled out in this region (spot vCPU quota, price cap);
  go on with on-demand.
- `STOP_QUOTA`: the on-demand vCPU quota is reached; no subnet can help, a quota increase can.
- `RETRY`: throttled or a transient server fault; back off, then try the same subnet again.
- `FAIL`: anything else is a configuration or permission problem; retrying cannot fix it.

`InsufficientInstanceCapacity` arrives with HTTP 500, which botocore's standard retry mode
treats as transient and retries on its own; the launch client turns that off (`aws.py`), and
the table is consulted by code before any status-based rule.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from contract.errors import BenchError

__all__ = [
    "CONNECTION_ERROR_CODE",
    "LAUNCH_ERRORS",
    "SPOT_AUTH_ERRORS",
    "ControlError",
    "LaunchAction",
    "LaunchError",
    "classify_launch_error",
]


class ControlError(BenchError):
    """Something the user can fix (no stack, no credentials, bad spec, unknown campaign).

    The message is one line; the CLI prints it and exits with status 2.
    """


class LaunchAction(enum.Enum):
    """What the launcher does after a failed attempt."""

    NEXT_SUBNET = "next subnet"
    SWITCH_MARKET = "switch market"
    STOP_QUOTA = "stop: quota"
    RETRY = "retry"
    FAIL = "fail"


LAUNCH_ERRORS: Mapping[str, LaunchAction] = {
    # This pool is out of capacity, or the zone does not offer the type: the next one may.
    "InsufficientInstanceCapacity": LaunchAction.NEXT_SUBNET,
    "InsufficientHostCapacity": LaunchAction.NEXT_SUBNET,
    "InsufficientReservedInstanceCapacity": LaunchAction.NEXT_SUBNET,
    "InsufficientCapacityOnHost": LaunchAction.NEXT_SUBNET,
    "InsufficientCapacity": LaunchAction.NEXT_SUBNET,
    "UnfulfillableCapacity": LaunchAction.NEXT_SUBNET,
    "Unsupported": LaunchAction.NEXT_SUBNET,
    "InsufficientFreeAddressesInSubnet": LaunchAction.NEXT_SUBNET,
    # Spot is ruled out region-wide (spot vCPU quota; a max price under the spot price).
    "MaxSpotInstanceCountExceeded": LaunchAction.SWITCH_MARKET,
    "SpotMaxPriceTooLow": LaunchAction.SWITCH_MARKET,
    # No spot service-linked role, and no right to create it: spot only, on-demand may work.
    "AuthFailure.ServiceLinkedRoleCreationNotPermitted": LaunchAction.SWITCH_MARKET,
    # On-demand vCPU quota of the family (or the legacy instance-count limit): ask for more.
    "VcpuLimitExceeded": LaunchAction.STOP_QUOTA,
    "InstanceLimitExceeded": LaunchAction.STOP_QUOTA,
    # Throttling and transient faults (SkyPilot's `_ec2_call_with_retry_on_server_error` set).
    "RequestLimitExceeded": LaunchAction.RETRY,
    "Throttling": LaunchAction.RETRY,
    "InternalError": LaunchAction.RETRY,
    "InternalFailure": LaunchAction.RETRY,
    "ServerInternal": LaunchAction.RETRY,
    "ServiceUnavailable": LaunchAction.RETRY,
    "Unavailable": LaunchAction.RETRY,
}

# Authorization errors that, on a spot request, may be about spot alone (a fresh account
# without AWSServiceRoleForEC2Spot): on-demand is tried next, and fails on its own if the
# permission is missing there too.
SPOT_AUTH_ERRORS = frozenset({"UnauthorizedOperation", "AuthFailure"})

# Code shown for a request that never got an answer (connection refused, reset, timed out).
# Retrying it is safe: every RunInstances call carries a ClientToken.
CONNECTION_ERROR_CODE = "ConnectionError"


@dataclass(frozen=True, slots=True)
class LaunchError:
    """A classified launch failure.

    Attributes:
        code: the EC2 error code (`ConnectionError` for no answer at all).
        message: AWS's message, on one line.
        action: what the table says to do.
    """

    code: str
    message: str
    action: LaunchAction


def classify_launch_error(exc: Exception) -> LaunchError:
    """Classify an exception raised by RunInstances.

    By code first (the table); then a 5xx without a known code is transient; a request that
    got no answer is retried; everything else fails fast.
    """
    if isinstance(exc, ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code") or "Unknown")
        message = " ".join(str(error.get("Message") or "").split())
        action = LAUNCH_ERRORS.get(code)
        if action is None:
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            action = LaunchAction.RETRY if status >= 500 else LaunchAction.FAIL
        return LaunchError(code, message, action)
    if isinstance(exc, BotoConnectionError | HTTPClientError):
        return LaunchError(CONNECTION_ERROR_CODE, " ".join(str(exc).split()), LaunchAction.RETRY)
    return LaunchError(type(exc).__name__, " ".join(str(exc).split()), LaunchAction.FAIL)
