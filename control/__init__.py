"""The workstation's AWS control plane: launch a campaign, watch it, fetch it, clean up after it.

It drives what the constructs beside it declare (BenchStack's launch templates, subnets,
bucket and status parameters, found through the stack's outputs), with boto3 and the standard
credential chain; every endpoint follows `AWS_ENDPOINT_URL`, so the whole flow runs against a
local moto server. It never imports `aws_cdk`: `bench launch` works without the CDK toolchain,
and no construct imports this package (tests/test_import_direction.py keeps both doors shut).

Verbs, one module each, all taking an `AwsClients` (`control.aws`, the only place boto3
clients are made) and returning typed records that `cli/` renders:

- `launch.launch_campaign`: spot in every subnet whose zone offers the type, then on-demand;
  capacity errors classified by the table in `errors`.
- `status.campaign_status`: SSM status parameters joined with instance states.
- `fetch.fetch_campaign`: resumable download of results, tarball checked against the manifest.
- `cleanup.plan_cleanup` / `cleanup.apply_cleanup`: strays found by tag and ended.
- `plan.plan_campaign`: jobs, hours (priors from `priors`) and dollars (`prices`) before
  anything is launched; `preflight.preflight`: the checks `bench launch` runs first.
- `iam_policy.workstation_policy`: the least-privilege policy the verbs need.
"""
