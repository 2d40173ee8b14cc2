"""Prices: the shipped table, the AWS Price List API and the spot price actually paid.

The Price List API is not in moto, so its path is tested with botocore's Stubber, which
checks both the request and the canned response against the service model; the response is
shaped as AWS documents GetProducts (PriceList: JSON strings with product attributes and
OnDemand terms). The spot path runs for real against the moto server (real boto3 calls over
HTTP), and with the Stubber for a history with several price changes.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import boto3
import pytest
from botocore.stub import Stubber

from report.prices import (
    DEFAULT_TABLE,
    AwsPrices,
    PriceError,
    SpotPoint,
    TablePrices,
    choose_prices,
    spot_paid_over,
)
from report.write import Written, write_report
from tests.fixtures.moto_server import MotoServer
from tests.report.handmade import Handmade
from tests.report.helpers import numbers, row, table


def _product(instance_type: str, usd: str, **attributes: str) -> str:
    """One PriceList entry as GetProducts returns it (a JSON string, format aws_v1)."""
    sku = "JRTCKXETXF" + instance_type.replace(".", "")
    attrs = {
        "instanceType": instance_type,
        "regionCode": "us-east-1",
        "location": "US East (N. Virginia)",
        "operatingSystem": "Linux",
        "tenancy": "Shared",
        "preInstalledSw": "NA",
        "capacitystatus": "Used",
        "licenseModel": "No License required",
        "servicecode": "AmazonEC2",
        **attributes,
    }
    return json.dumps(
        {
            "product": {"productFamily": "Compute Instance", "attributes": attrs, "sku": sku},
            "serviceCode": "AmazonEC2",
            "terms": {
                "OnDemand": {
                    f"{sku}.JRTCKXETXF": {
                        "priceDimensions": {
                            f"{sku}.JRTCKXETXF.6YS6EN2CT7": {
                                "unit": "Hrs",
                                "endRange": "Inf",
                                "description": f"${usd} per On Demand Linux {instance_type} "
                                "Instance Hour",
                                "appliesTo": [],
                                "rateCode": f"{sku}.JRTCKXETXF.6YS6EN2CT7",
                                "beginRange": "0",
                                "pricePerUnit": {"USD": usd},
                            }
                        },
                        "sku": sku,
                        "effectiveDate": "2026-11-01T00:00:00Z",
                        "offerTermCode": "JRTCKXETXF",
                        "termAttributes": {},
                    }
                }
            },
            "version": "20261101000000",
            "publicationDate": "2026-11-01T00:00:00Z",
        }
    )


def _filters(instance_type: str) -> list[dict[str, str]]:
    pairs = [
        ("instanceType", instance_type),
        ("regionCode", "us-east-1"),
        ("operatingSystem", "Linux"),
        ("tenancy", "Shared"),
        ("preInstalledSw", "NA"),
        ("capacitystatus", "Used"),
        ("licenseModel", "No License required"),
    ]
    return [{"Type": "TERM_MATCH", "Field": f, "Value": v} for f, v in pairs]


class _StubSession:
    """Hands out pre-made (stubbed) clients the way boto3.Session.client would."""

    def __init__(self, **clients: Any) -> None:
        self.clients = clients

    def client(self, service: str, region_name: str | None = None, config: Any = None) -> Any:
        return self.clients[service]


def _client(service: str) -> Any:
    return boto3.session.Session(
        aws_access_key_id="testing", aws_secret_access_key="testing", region_name="us-east-1"
    ).client(service)


def test_the_shipped_table_is_dated_and_has_the_seeds_prices():
    prices = TablePrices(DEFAULT_TABLE)
    assert prices.as_of == "2026-11-29"
    for instance_type, usd in (
        ("g6.4xlarge", 1.3232),
        ("g6.2xlarge", 0.9776),
        ("g5g.2xlarge", 0.556),
        ("g4dn.xlarge", 0.526),
    ):
        price = prices.on_demand(instance_type, "us-east-1")
        assert price is not None and price.usd_per_hour == usd
        assert "report/prices.toml" in price.source and "2026-11-29" in price.source
    assert prices.on_demand("g6.4xlarge", "eu-west-1") is None
    assert prices.spot_paid("g6.4xlarge", "us-east-1a", 0.0, 3600.0) is None


def test_spot_paid_is_the_price_in_effect_weighted_by_time():
    start, end = 1_000_000.0, 1_000_000.0 + 3 * 3600
    history = [
        SpotPoint(start - 7200, 0.40),  # in effect when the run started
        SpotPoint(start - 3600, 0.44),  # replaced it before the start: this one applies
        SpotPoint(start + 1800, 0.38),  # from half an hour in
        SpotPoint(start + 5400, 0.41),  # from an hour and a half in
        SpotPoint(end + 60, 0.90),  # after the run: ignored
    ]
    paid = spot_paid_over(
        history,
        start,
        end,
        instance_type="g5g.2xlarge",
        availability_zone="us-east-1a",
        source="test",
    )
    assert paid is not None
    expected = 0.44 * 0.5 + 0.38 * 1.0 + 0.41 * 1.5
    assert paid.usd_total == pytest.approx(expected)
    assert paid.usd_per_hour_mean == pytest.approx(expected / 3)
    assert (paid.usd_per_hour_min, paid.usd_per_hour_max) == (0.38, 0.44)
    assert paid.changes == 3
    assert (
        spot_paid_over([], start, end, instance_type="x", availability_zone="y", source="") is None
    )


def test_the_price_list_api_answer_is_read_as_aws_documents_it():
    pricing = _client("pricing")
    stub = Stubber(pricing)
    # Two pages, and a Windows product the filters should have kept out (never trusted).
    stub.add_response(
        "get_products",
        {
            "FormatVersion": "aws_v1",
            "PriceList": [_product("g6.4xlarge", "2.9000000000", operatingSystem="Windows")],
            "NextToken": "page-2",
        },
        {"ServiceCode": "AmazonEC2", "Filters": _filters("g6.4xlarge"), "FormatVersion": "aws_v1"},
    )
    stub.add_response(
        "get_products",
        {"FormatVersion": "aws_v1", "PriceList": [_product("g6.4xlarge", "1.3232000000")]},
        {
            "ServiceCode": "AmazonEC2",
            "Filters": _filters("g6.4xlarge"),
            "FormatVersion": "aws_v1",
            "NextToken": "page-2",
        },
    )
    with stub:
        price = AwsPrices(_StubSession(pricing=pricing)).on_demand("g6.4xlarge", "us-east-1")
        stub.assert_no_pending_responses()
    assert price is not None
    assert price.usd_per_hour == 1.3232
    assert price.as_of == "2026-11-01"
    assert "Price List API" in price.source


def test_a_price_list_that_disagrees_is_an_error_not_a_pick():
    pricing = _client("pricing")
    stub = Stubber(pricing)
    stub.add_response(
        "get_products",
        {
            "FormatVersion": "aws_v1",
            "PriceList": [_product("g6.4xlarge", "1.3232"), _product("g6.4xlarge", "1.5")],
        },
    )
    with stub, pytest.raises(PriceError, match=r"1\.3232"):
        AwsPrices(_StubSession(pricing=pricing)).on_demand("g6.4xlarge", "us-east-1")


def _spot_stub(ec2: Any, handmade: Handmade) -> tuple[Stubber, float]:
    """The t4spot shard's history: one price in effect at its start, one change in it."""
    start, end = handmade.shard_start_unix["t4spot"], handmade.shard_end_unix["t4spot"]
    change = start + (end - start) / 4
    stub = Stubber(ec2)
    stub.add_response(
        "describe_spot_price_history",
        {
            "SpotPriceHistory": [
                {
                    "AvailabilityZone": "us-east-1a",
                    "InstanceType": "g4dn.xlarge",
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": "0.210000",
                    "Timestamp": datetime.fromtimestamp(change, UTC),
                },
                {
                    "AvailabilityZone": "us-east-1b",  # another zone: not this shard's
                    "InstanceType": "g4dn.xlarge",
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": "0.990000",
                    "Timestamp": datetime.fromtimestamp(start - 60, UTC),
                },
                {
                    "AvailabilityZone": "us-east-1a",
                    "InstanceType": "g4dn.xlarge",
                    "ProductDescription": "Linux/UNIX",
                    "SpotPrice": "0.180000",
                    "Timestamp": datetime.fromtimestamp(start - 600, UTC),
                },
            ],
            "NextToken": "",
        },
        {
            "InstanceTypes": ["g4dn.xlarge"],
            "ProductDescriptions": ["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            "AvailabilityZone": "us-east-1a",
            "StartTime": datetime.fromtimestamp(start, UTC),
            "EndTime": datetime.fromtimestamp(end, UTC),
        },
    )
    hours = (end - start) / 3600
    paid = 0.18 * hours / 4 + 0.21 * hours * 3 / 4
    return stub, paid


def test_a_report_with_aws_prices_shows_what_the_spot_shard_paid(
    handmade: Handmade, tmp_path: Path
):
    pricing, ec2 = _client("pricing"), _client("ec2")
    pricing_stub = Stubber(pricing)
    for instance_type, usd in (("g6.4xlarge", "1.3232000000"), ("g4dn.xlarge", "0.5260000000")):
        pricing_stub.add_response(
            "get_products",
            {"FormatVersion": "aws_v1", "PriceList": [_product(instance_type, usd)]},
            {
                "ServiceCode": "AmazonEC2",
                "Filters": _filters(instance_type),
                "FormatVersion": "aws_v1",
            },
        )
    spot_stub, paid = _spot_stub(ec2, handmade)
    with pricing_stub, spot_stub:
        written = write_report(
            handmade.root,
            tmp_path / "out",
            prices=choose_prices("aws", session=_StubSession(pricing=pricing, ec2=ec2)),
        )
        pricing_stub.assert_no_pending_responses()
        spot_stub.assert_no_pending_responses()
    hours = (handmade.shard_end_unix["t4spot"] - handmade.shard_start_unix["t4spot"]) / 3600
    campaign = table(written, "cost-campaign")
    spot = row(campaign, "t4spot")
    assert numbers(spot["spot $"]) == pytest.approx([paid], abs=0.005)
    assert spot["spot paid"].startswith(f"${paid / hours:.4g}/h mean ($0.18–$0.21, 2 price(s))")
    less_install = paid / hours * (hours - 300.0 / 3600)
    assert numbers(spot["spot $ less install"]) == pytest.approx([less_install], abs=0.005)
    assert "AWS Price List API" in campaign.caption
    assert "describe_spot_price_history" in campaign.caption
    per_m = row(table(written, "cost-in128-out512"), "llama@t4spot")
    on_demand, spot_per_m = numbers(per_m["8 req"])[:2]
    assert on_demand == pytest.approx(0.526 / (3600 * 240.2) * 1e6, abs=0.005)
    assert spot_per_m == pytest.approx(paid / hours / (3600 * 240.2) * 1e6, abs=0.005)
    assert per_m["64 req"] == "-"  # the partial cell lost requests: no price per token


def test_with_moto_the_spot_history_is_asked_and_the_price_list_falls_back(
    aws: MotoServer, handmade: Handmade, tmp_path: Path
):
    """Real boto3 calls over HTTP to the moto server: moto has EC2's spot price history (one
    made-up price per zone, stamped 2006) but no Price List API, so on-demand falls back to
    the shipped table and says so."""
    written: Written = write_report(handmade.root, tmp_path / "out", price_mode="auto")
    report = written.report
    spot = next(c for c in report.shard_costs if c.shard == "t4spot")
    assert spot.spot is not None
    assert spot.spot.usd_per_hour_mean == pytest.approx(0.00001)
    assert spot.spot.changes == 1  # the 2006 price, still in effect over the run
    g6 = next(c for c in report.shard_costs if c.shard == "g6")
    assert g6.on_demand is not None and g6.on_demand.usd_per_hour == 1.3232
    assert "report/prices.toml" in g6.on_demand.source
    notes = " ".join(report.price_notes)
    assert "Price List API" in notes and "used instead" in notes
    assert "<html" not in notes  # an error page is cut to one short line


def test_no_credentials_means_the_table_and_no_aws_call(monkeypatch: pytest.MonkeyPatch):
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
    monkeypatch.setenv("AWS_CONFIG_FILE", "/dev/null")
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    book = choose_prices("auto")
    assert "no AWS credentials" in " ".join(book.notes)
    assert book.on_demand("g6.4xlarge", "us-east-1").usd_per_hour == 1.3232
    assert book.spot_paid("g4dn.xlarge", "us-east-1a", 0.0, 3600.0) is None
    with pytest.raises(PriceError, match="no AWS credentials"):
        choose_prices("aws")
