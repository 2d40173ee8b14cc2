"""Instance prices as both the report and the launcher read them: records, the dated table,
and the AWS Price List's answer parsed.

The table (`report/prices.toml` ships one; its path is the caller's) holds on-demand USD per
instance-hour per region and type, with its name and date, which every user of a price names.
`on_demand_from_price_list` turns GetProducts' `PriceList` into one hourly price. Asking AWS
is the caller's (`report.prices` for what a run paid, `control.prices` for a plan).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from contract.errors import BenchError

__all__ = [
    "PRICE_LIST_FILTERS",
    "PRICING_REGION",
    "SPOT_PRODUCTS",
    "HourlyPrice",
    "PriceError",
    "TablePrices",
    "on_demand_from_price_list",
    "price_list_filters",
]

# The Price List query API answers in us-east-1 (also ap-south-1, eu-central-1).
PRICING_REGION = "us-east-1"
# What a plain Linux on-demand instance is called in the price list (the filters that leave
# exactly one product per type and region: no SQL/Windows, no dedicated host, no capacity
# reservation line items).
PRICE_LIST_FILTERS: Mapping[str, str] = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}
SPOT_PRODUCTS = ("Linux/UNIX", "Linux/UNIX (Amazon VPC)")


def price_list_filters(instance_type: str, region: str) -> list[dict[str, str]]:
    """GetProducts filters for one type's plain Linux on-demand price in `region`."""
    return [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type},
        {"Type": "TERM_MATCH", "Field": "regionCode", "Value": region},
        *({"Type": "TERM_MATCH", "Field": k, "Value": v} for k, v in PRICE_LIST_FILTERS.items()),
    ]


class PriceError(BenchError, RuntimeError):
    """AWS could not give a price (no permission, no network, an unknown type)."""


@dataclass(frozen=True, slots=True)
class HourlyPrice:
    instance_type: str
    region: str
    usd_per_hour: float
    source: str  # where it came from, as the report names it
    as_of: str  # the table's date, or the price list's publication date



class TablePrices:
    """The shipped price table (or another file of the same layout)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise PriceError(f"price table {path}: {exc}") from exc
        table = data.get("table", {})
        self.name: str = table.get("name", path.name)
        self.as_of: str = table.get("as_of", "undated")
        self._prices: dict[tuple[str, str], tuple[float, str]] = {}
        for entry in data.get("on_demand", []):
            key = (entry["region"], entry["instance_type"])
            self._prices[key] = (float(entry["usd_per_hour"]), entry.get("source", ""))
        self.notes: list[str] = []

    @property
    def label(self) -> str:
        return f"price table {self.name}, dated {self.as_of}"

    def on_demand(self, instance_type: str, region: str) -> HourlyPrice | None:
        found = self._prices.get((region, instance_type))
        if found is None:
            return None
        usd, source = found
        return HourlyPrice(
            instance_type=instance_type,
            region=region,
            usd_per_hour=usd,
            source=self.label + (f": {source}" if source else ""),
            as_of=self.as_of,
        )

    def spot_paid(
        self, instance_type: str, availability_zone: str, start_unix_s: float, end_unix_s: float
    ) -> None:
        # A table cannot know what a given run paid: say so rather than guess.
        return None


def on_demand_from_price_list(
    price_list: Sequence[str], instance_type: str, region: str
) -> HourlyPrice | None:
    """The hourly on-demand USD price from GetProducts' `PriceList` (JSON strings).

    Products whose attributes contradict the filters are skipped (a filter the API ignored
    must not pick a Windows or dedicated price). Raises PriceError if what is left does not
    agree on one price.
    """
    found: dict[float, str] = {}
    for text in price_list:
        product = json.loads(text)
        attributes = product.get("product", {}).get("attributes", {})
        if attributes.get("instanceType") != instance_type:
            continue
        if attributes.get("regionCode", region) != region:
            continue
        if any(attributes.get(k, v) != v for k, v in PRICE_LIST_FILTERS.items()):
            continue
        for term in product.get("terms", {}).get("OnDemand", {}).values():
            for dimension in term.get("priceDimensions", {}).values():
                usd = dimension.get("pricePerUnit", {}).get("USD")
                if dimension.get("unit") == "Hrs" and usd is not None and float(usd) > 0:
                    found[float(usd)] = product.get("publicationDate", "")
    if not found:
        return None
    if len(found) > 1:
        prices = ", ".join(f"${p:g}" for p in sorted(found))
        raise PriceError(f"{instance_type} in {region}: the price list gives {prices}")
    usd, published = next(iter(found.items()))
    return HourlyPrice(
        instance_type=instance_type,
        region=region,
        usd_per_hour=usd,
        source="AWS Price List API (GetProducts, AmazonEC2)",
        as_of=published[:10] or datetime.now(UTC).date().isoformat(),
    )
