"""Prices for a plan: on-demand from the AWS Price List, spot from EC2's price history now,
else the dated table for on-demand (named), and no spot price at all rather than a guess.

The records, the table reader and the price-list parser are `contract.prices`, shared with
`bench report`, which prices what a finished run paid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from contract.prices import (
    PRICING_REGION,
    SPOT_PRODUCTS,
    HourlyPrice,
    PriceError,
    TablePrices,
    on_demand_from_price_list,
    price_list_filters,
)
from control.aws import CONTROL_CONFIG, AwsClients
from control.plan import SpotNow

__all__ = ["AwsPlanPrices", "TablePlanPrices"]

_NO_SPOT = "spot price now: needs AWS credentials (EC2 describe_spot_price_history); not shown"


@dataclass
class TablePlanPrices:
    """The dated table only (no credentials): on-demand prices, no spot price."""

    table: TablePrices
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.notes.append(f"on-demand: {self.table.label} (no AWS credentials)")
        self.notes.append(_NO_SPOT)

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None:
        price = self.table.on_demand(instance_type, region)
        if price is None:
            self.notes.append(f"{instance_type} in {region}: not in {self.table.label}")
        return price

    def spot_now(self, instance_type: str, region: str) -> SpotNow | None:
        return None


@dataclass
class AwsPlanPrices:
    """The Price List API and the spot price history; the table where AWS cannot answer.

    Attributes:
        clients: the AWS clients (the pricing client is made in the Price List's region).
        table: the dated table.
        zones: the zones to take the spot price from (the stack's); None: every zone.
    """

    clients: AwsClients
    table: TablePrices
    zones: Sequence[str] | None = None
    notes: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.notes.append(
            "on-demand: AWS Price List API (GetProducts); spot: EC2 spot price history now, "
            "cheapest zone" + (" of the stack" if self.zones else "")
        )

    def _note(self, text: str) -> None:
        if text not in self.notes:
            self.notes.append(text)

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None:
        try:
            pricing = self.clients.session.client(
                "pricing", region_name=PRICING_REGION, config=CONTROL_CONFIG
            )
            price_list: list[str] = []
            for page in pricing.get_paginator("get_products").paginate(
                ServiceCode="AmazonEC2",
                Filters=price_list_filters(instance_type, region),
                FormatVersion="aws_v1",
            ):
                price_list.extend(page.get("PriceList", []))
            price = on_demand_from_price_list(price_list, instance_type, region)
        except (BotoCoreError, ClientError, PriceError) as exc:
            self._note(f"Price List API: {_short(exc)}; {self.table.label} used instead")
            return self.table.on_demand(instance_type, region)
        if price is None:
            self._note(
                f"{instance_type} in {region}: not in the AWS price list; "
                f"{self.table.label} used instead"
            )
            return self.table.on_demand(instance_type, region)
        return price

    def spot_now(self, instance_type: str, region: str) -> SpotNow | None:
        ec2: Any = self.clients.client("ec2")
        latest: dict[str, tuple[datetime, float]] = {}
        try:
            for page in ec2.get_paginator("describe_spot_price_history").paginate(
                InstanceTypes=[instance_type],
                ProductDescriptions=list(SPOT_PRODUCTS),
                StartTime=datetime.now(UTC),
            ):
                for entry in page.get("SpotPriceHistory", []):
                    zone = str(entry.get("AvailabilityZone", ""))
                    if self.zones is not None and zone not in self.zones:
                        continue
                    stamp = entry["Timestamp"]
                    if zone not in latest or stamp > latest[zone][0]:
                        latest[zone] = (stamp, float(entry["SpotPrice"]))
        except (BotoCoreError, ClientError) as exc:
            self._note(f"spot price history, {instance_type}: {_short(exc)}; not shown")
            return None
        if not latest:
            self._note(f"spot price history: no {instance_type} price in the stack's zones")
            return None
        zone, (_, usd) = min(latest.items(), key=lambda item: item[1][1])
        return SpotNow(usd, zone, f"EC2 spot price history, {zone}, now")


def _short(exc: BaseException, limit: int = 160) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
