"""Instance prices: on-demand per hour, and what a spot shard actually paid over its run.

Where the prices come from, in order (`--prices auto`, the default):

1. AWS, when boto3 finds credentials: the Price List API (`pricing` GetProducts, whose
   endpoint is in us-east-1) for the on-demand price of the shard's type in its region, and
   EC2 `describe_spot_price_history` for a spot shard: the price in effect at the run's start
   and every change during it, weighted by how long each held (the price actually paid).
2. The dated table shipped beside this module (`prices.toml`), named in the report, for the
   on-demand price only; a spot shard's price then shows as not available, never guessed.

The price records, the table reader and the price-list parser are `contract.prices` (the
launcher's `bench plan` prices with them too); this module adds what a finished run paid.

`--prices table` never calls AWS; `--prices aws` reports AWS errors instead of falling back.
Every call has short timeouts and few retries: a report must not hang on a dead network.
"""

from __future__ import annotations

import logging
import re
from bisect import bisect_right
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from contract.prices import (
    PRICING_REGION,
    SPOT_PRODUCTS,
    HourlyPrice,
    PriceError,
    TablePrices,
    on_demand_from_price_list,
    price_list_filters,
)

__all__ = [
    "DEFAULT_TABLE",
    "PRICING_REGION",
    "AwsPrices",
    "HourlyPrice",
    "PriceBook",
    "PriceError",
    "PriceMode",
    "SpotPaid",
    "SpotPoint",
    "TablePrices",
    "choose_prices",
    "on_demand_from_price_list",
    "spot_paid_over",
]

log = logging.getLogger(__name__)

DEFAULT_TABLE = Path(__file__).with_name("prices.toml")
PriceMode = Literal["auto", "aws", "table"]
_TAG = re.compile(r"<[^>]*>")


@dataclass(frozen=True, slots=True)
class SpotPoint:
    """One entry of the spot price history: from `time_unix_s` on, this price held."""

    time_unix_s: float
    usd_per_hour: float


@dataclass(frozen=True, slots=True)
class SpotPaid:
    """The spot price over one run, weighted by how long each price held."""

    instance_type: str
    availability_zone: str
    start_unix_s: float
    end_unix_s: float
    usd_total: float
    usd_per_hour_mean: float
    usd_per_hour_min: float
    usd_per_hour_max: float
    changes: int  # price entries that applied during the run
    source: str


class PriceBook(Protocol):
    """Where the report gets prices; `notes` says what was used and what went wrong."""

    notes: list[str]

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None: ...

    def spot_paid(
        self, instance_type: str, availability_zone: str, start_unix_s: float, end_unix_s: float
    ) -> SpotPaid | None: ...


def spot_paid_over(
    points: Iterable[SpotPoint],
    start_unix_s: float,
    end_unix_s: float,
    *,
    instance_type: str,
    availability_zone: str,
    source: str,
) -> SpotPaid | None:
    """Time-weighted spot price over [start, end] from a price history.

    The price at time t is the latest entry at or before t (EC2 returns the entry in effect
    at StartTime with the rest). If the history starts after `start` (it was cut off), its
    first price is taken back to `start`, which the caller's source line should not hide:
    that case never happens with EC2's own answer. None for an empty history or a run of no
    length.
    """
    ordered = sorted(points, key=lambda p: p.time_unix_s)
    if not ordered or end_unix_s <= start_unix_s:
        return None
    times = [p.time_unix_s for p in ordered]
    first = max(0, bisect_right(times, start_unix_s) - 1)
    applied = [p for p in ordered[first:] if p.time_unix_s < end_unix_s]
    total = 0.0
    for i, point in enumerate(applied):
        begin = max(point.time_unix_s, start_unix_s) if i else start_unix_s
        finish = applied[i + 1].time_unix_s if i + 1 < len(applied) else end_unix_s
        total += point.usd_per_hour * max(0.0, finish - begin) / 3600.0
    hours = (end_unix_s - start_unix_s) / 3600.0
    rates = [p.usd_per_hour for p in applied]
    return SpotPaid(
        instance_type=instance_type,
        availability_zone=availability_zone,
        start_unix_s=start_unix_s,
        end_unix_s=end_unix_s,
        usd_total=total,
        usd_per_hour_mean=total / hours,
        usd_per_hour_min=min(rates),
        usd_per_hour_max=max(rates),
        changes=len(applied),
        source=source,
    )


@dataclass
class AwsPrices:
    """Prices from AWS: the Price List API and the EC2 spot price history."""

    session: Any  # boto3.session.Session
    notes: list[str] = field(default_factory=list)

    def _client(self, service: str, region: str) -> Any:
        from botocore.config import Config

        # A report must not hang on a dead network: short timeouts, two tries in all
        # (botocore's `max_attempts` counts retries after the first; `total_max_attempts` all).
        config = Config(
            connect_timeout=5,
            read_timeout=20,
            retries={"total_max_attempts": 2, "mode": "standard"},
        )
        return self.session.client(service, region_name=region, config=config)

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None:
        from botocore.exceptions import BotoCoreError, ClientError

        filters = price_list_filters(instance_type, region)
        try:
            client = self._client("pricing", PRICING_REGION)
            price_list: list[str] = []
            for page in client.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2", Filters=filters, FormatVersion="aws_v1"
            ):
                price_list.extend(page.get("PriceList", []))
        except (BotoCoreError, ClientError) as exc:
            raise PriceError(f"Price List API, {instance_type} in {region}: {exc}") from exc
        return on_demand_from_price_list(price_list, instance_type, region)

    def spot_paid(
        self, instance_type: str, availability_zone: str, start_unix_s: float, end_unix_s: float
    ) -> SpotPaid | None:
        from botocore.exceptions import BotoCoreError, ClientError

        region = availability_zone[:-1]
        try:
            client = self._client("ec2", region)
            points: list[SpotPoint] = []
            for page in client.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=[instance_type],
                ProductDescriptions=list(SPOT_PRODUCTS),
                AvailabilityZone=availability_zone,
                StartTime=datetime.fromtimestamp(start_unix_s, UTC),
                EndTime=datetime.fromtimestamp(end_unix_s, UTC),
            ):
                for entry in page.get("SpotPriceHistory", []):
                    # Filter again here: the zone and product are request parameters an
                    # API double (and EC2-Classic-era accounts) may answer more broadly.
                    if entry.get("AvailabilityZone") != availability_zone:
                        continue
                    if entry.get("ProductDescription") not in SPOT_PRODUCTS:
                        continue
                    stamp = entry["Timestamp"]
                    when = stamp.timestamp() if isinstance(stamp, datetime) else float(stamp)
                    points.append(SpotPoint(when, float(entry["SpotPrice"])))
        except (BotoCoreError, ClientError) as exc:
            raise PriceError(
                f"describe_spot_price_history, {instance_type} in {availability_zone}: {exc}"
            ) from exc
        return spot_paid_over(
            points,
            start_unix_s,
            end_unix_s,
            instance_type=instance_type,
            availability_zone=availability_zone,
            source="EC2 describe_spot_price_history, time-weighted over the run",
        )


@dataclass
class _Chain:
    """AWS first, the table for on-demand when AWS cannot answer (`--prices auto`)."""

    aws: AwsPrices | None
    table: TablePrices
    strict: bool = False  # --prices aws: errors are reported, no fallback
    notes: list[str] = field(default_factory=list)

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None:
        if self.aws is not None:
            try:
                price = self.aws.on_demand(instance_type, region)
            except PriceError as exc:
                if self.strict:
                    raise
                self._note(f"{_short(exc)}; {self.table.label} used instead")
                return self.table.on_demand(instance_type, region)
            if price is not None or self.strict:
                return price
            self._note(
                f"{instance_type} in {region}: not in the AWS price list; "
                f"{self.table.label} used instead"
            )
        return self.table.on_demand(instance_type, region)

    def spot_paid(
        self, instance_type: str, availability_zone: str, start_unix_s: float, end_unix_s: float
    ) -> SpotPaid | None:
        if self.aws is None:
            self._note(
                "spot price actually paid: needs AWS credentials (describe_spot_price_history); "
                "not shown"
            )
            return None
        try:
            return self.aws.spot_paid(instance_type, availability_zone, start_unix_s, end_unix_s)
        except PriceError as exc:
            if self.strict:
                raise
            self._note(f"{_short(exc)}; the spot price paid is not shown")
            return None


def _short(exc: BaseException, limit: int = 200) -> str:
    """One line of an AWS error for the report (error bodies can be whole HTML pages)."""
    text = " ".join(_TAG.sub(" ", str(exc)).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _session_with_credentials() -> Any | None:
    try:
        import boto3
    except ImportError:
        return None
    session = boto3.session.Session()
    try:
        credentials = session.get_credentials()
    except Exception as exc:  # a broken profile is "no credentials" for a report
        log.info("no AWS credentials (%s): price table used", exc)
        return None
    return session if credentials is not None else None


def choose_prices(
    mode: PriceMode = "auto", *, table: Path = DEFAULT_TABLE, session: Any | None = None
) -> PriceBook:
    """The price book for `--prices MODE`: see the module docstring."""
    table_prices = TablePrices(table)
    if mode == "table":
        book = _Chain(aws=None, table=table_prices)
        book._note(f"prices: {table_prices.label} (--prices table: AWS not asked)")
        return book
    session = session or _session_with_credentials()
    if session is None:
        if mode == "aws":
            raise PriceError("--prices aws: boto3 finds no AWS credentials")
        book = _Chain(aws=None, table=table_prices)
        book._note(f"prices: {table_prices.label} (no AWS credentials found)")
        return book
    book = _Chain(aws=AwsPrices(session), table=table_prices, strict=mode == "aws")
    book._note(
        "prices: AWS Price List API (on-demand) and EC2 spot price history (spot shards)"
        + ("" if mode == "aws" else f"; {table_prices.label} where AWS cannot answer")
    )
    return book
