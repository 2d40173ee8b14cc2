"""`bench cleanup`'s decisions after a relaunch: a status record left by another instance of
the shard says nothing about the live one (issue 21, item 8)."""

from __future__ import annotations

from pathlib import Path

from control.aws import AwsClients
from control.cleanup import plan_cleanup
from control.stack import StackOutputs
from tests.control.conftest import live_instances, put_status, run_bench, tags_of, write_spec


def test_a_relaunched_shard_is_not_ended_by_its_predecessors_terminal_status(
    clients: AwsClients, stack: StackOutputs, tmp_path: Path
):
    spec = write_spec(tmp_path / "c8.toml", "c8", [("s0", "g6.xlarge"), ("s1", "g6.xlarge")])
    assert run_bench("launch", str(spec)).returncode == 0
    ids = {tags_of(i)["bench:shard"]: i["InstanceId"] for i in live_instances("c8")}
    # s0 finished on its first instance; s1 was interrupted on an instance that is gone and
    # has been relaunched as ids["s1"], whose agent has not published yet.
    put_status("c8", "s0", phase="done", instance_id=ids["s0"])
    put_status("c8", "s1", phase="interrupted", instance_id="i-0123456789abcdef0")

    plan = plan_cleanup(clients, stack, campaign="c8")
    decided = {item.instance.instance_id: item for item in plan.items}
    assert decided[ids["s0"]].terminate == "shard done"
    assert decided[ids["s1"]].terminate is None, "the relaunched shard must be kept"
    # The campaign is not finished while a shard's record belongs to another instance.
    assert plan.parameters == ()

    # Once the new agent publishes, its own record counts.
    put_status("c8", "s1", phase="done", instance_id=ids["s1"])
    plan = plan_cleanup(clients, stack, campaign="c8")
    assert {item.instance.instance_id for item in plan.to_terminate} == set(ids.values())
