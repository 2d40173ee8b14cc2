"""IMDSv2 client against the fake IMDS (tests/fixtures/fake_imds.py), and the fake itself."""

from __future__ import annotations

import time

import httpx
import pytest

from agent.aws.imds import ImdsClient, ImdsError
from agent.supervisor import free_port
from contract.layout import TAG_CAMPAIGN, TAG_SHARD
from tests.agent.aws.conftest import CAMPAIGN, SHARD
from tests.fixtures.fake_imds import FakeImds, fake_imds


class TestFakeFollowsAws:
    """The fake answers like IMDSv2 with HttpTokens=required (AWS EC2 User Guide)."""

    def test_token_put_needs_a_ttl_header_in_range(self, imds: FakeImds):
        url = f"{imds.url}/latest/api/token"
        assert httpx.put(url).status_code == 400
        for bad in ("0", "21601", "abc"):
            headers = {"X-aws-ec2-metadata-token-ttl-seconds": bad}
            assert httpx.put(url, headers=headers).status_code == 400
        ok = httpx.put(url, headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"})
        assert ok.status_code == 200 and ok.text
        assert ok.headers["X-aws-ec2-metadata-token-ttl-seconds"] == "60"

    def test_proxied_token_request_is_forbidden(self, imds: FakeImds):
        headers = {"X-aws-ec2-metadata-token-ttl-seconds": "60", "X-Forwarded-For": "1.2.3.4"}
        assert httpx.put(f"{imds.url}/latest/api/token", headers=headers).status_code == 403

    def test_get_without_a_valid_token_is_401(self, imds: FakeImds):
        url = f"{imds.url}/latest/meta-data/instance-id"
        assert httpx.get(url).status_code == 401
        assert httpx.get(url, headers={"X-aws-ec2-metadata-token": "nope"}).status_code == 401

    def test_tags_list_keys_then_values(self, imds: FakeImds):
        token = httpx.put(
            f"{imds.url}/latest/api/token",
            headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"},
        ).text
        headers = {"X-aws-ec2-metadata-token": token}
        keys = httpx.get(f"{imds.url}/latest/meta-data/tags/instance", headers=headers).text
        assert keys.splitlines() == [TAG_CAMPAIGN, TAG_SHARD, "Name"]
        value = httpx.get(
            f"{imds.url}/latest/meta-data/tags/instance/{TAG_CAMPAIGN}", headers=headers
        )
        assert value.text == CAMPAIGN
        missing = httpx.get(f"{imds.url}/latest/meta-data/tags/instance/nope", headers=headers)
        assert missing.status_code == 404


class TestClient:
    def test_identity_and_market(self, imds: FakeImds):
        with ImdsClient() as client:
            identity = client.identity()
        assert identity.instance_id == imds.instance_id
        assert identity.instance_type == "g6.xlarge"
        assert identity.availability_zone == "us-east-1b"
        assert identity.region == "us-east-1"
        assert identity.lifecycle == "spot" and identity.market == "spot"

    def test_on_demand_market(self):
        with fake_imds(lifecycle="on-demand") as server, ImdsClient(server.url) as client:
            assert client.identity().market == "on-demand"

    def test_tags_and_campaign_and_shard(self, imds: FakeImds):
        with ImdsClient() as client:
            assert client.tags() == {TAG_CAMPAIGN: CAMPAIGN, TAG_SHARD: SHARD, "Name": "bench"}
            assert client.tag("absent") is None
            assert client.campaign_and_shard() == (CAMPAIGN, SHARD)

    def test_missing_shard_tag_is_named(self):
        with (
            fake_imds(tags={TAG_CAMPAIGN: "c"}) as server,
            ImdsClient(server.url) as client,
            pytest.raises(ImdsError, match="bench:shard"),
        ):
            client.campaign_and_shard()

    def test_tags_not_in_metadata(self):
        with (
            fake_imds(tags={TAG_CAMPAIGN: "c"}, tags_in_metadata=False) as server,
            ImdsClient(server.url) as client,
        ):
            assert client.tag_keys() == []
            with pytest.raises(ImdsError, match="metadata"):
                client.campaign_and_shard()

    def test_one_token_serves_many_requests(self, imds: FakeImds):
        with ImdsClient() as client:
            for _ in range(5):
                client.identity()
        assert imds.token_requests == 1
        assert imds.unauthorized == 0

    def test_token_is_renewed_before_it_expires(self, imds: FakeImds):
        # TTL 1 s, renewed with 0.25 s left: calls over 1.6 s never present an expired token.
        with ImdsClient(token_ttl_s=1, refresh_margin_s=0.25) as client:
            deadline = time.monotonic() + 1.6
            while time.monotonic() < deadline:
                client.get("/latest/meta-data/instance-id")
                time.sleep(0.05)
        assert imds.token_requests >= 2
        assert imds.unauthorized == 0

    def test_a_refused_token_is_replaced_once(self, imds: FakeImds):
        with ImdsClient() as client:
            client.identity()
            imds.expire_tokens()  # as if IMDS restarted
            assert client.get("/latest/meta-data/instance-id") == imds.instance_id
        assert imds.token_requests == 2

    def test_503_and_429_are_retried(self, imds: FakeImds):
        imds.fail_next(1, 503)
        imds.fail_next(1, 429)
        with ImdsClient(retry_delay_s=0.01) as client:
            assert client.get("/latest/meta-data/instance-type") == "g6.xlarge"

    def test_persistent_failure_is_an_error(self, imds: FakeImds):
        imds.fail_next(10, 503)
        with ImdsClient(retry_delay_s=0.01, attempts=3) as client, pytest.raises(ImdsError):
            client.identity()

    def test_no_imds_fails_fast(self):
        started = time.monotonic()
        with (
            ImdsClient(f"http://127.0.0.1:{free_port()}", retry_delay_s=0.01) as client,
            pytest.raises(ImdsError, match=r"IMDS PUT /latest/api/token: ConnectError"),
        ):
            client.identity()
        assert time.monotonic() - started < 5

    def test_spot_notice_404_then_json(self, imds: FakeImds):
        with ImdsClient() as client:
            assert client.spot_notice() is None
            imds.issue_spot_notice("terminate", in_s=120)
            notice = client.spot_notice()
        assert notice is not None
        assert notice.action == "terminate"
        assert notice.time is not None and notice.time.tzinfo is not None
