"""The agent's AWS side: what an instance needs from AWS to run a campaign unattended.

- `clients`: the one boto3 client factory, the error table and the bounded retry helper;
- `imds`: IMDSv2 (identity, market, the instance's own tags, the spot interruption notice);
- `secrets`: the HF token from Secrets Manager, for engines' environments only;
- `status`: the shard status published to SSM, with a heartbeat;
- `bucket`: the results bucket's name and URIs, and `UploadError`;
- `uploader`: job folders, manifest and tarball to S3, from one background thread;
- `tarball`: the shard's tarball, and scrubbing secrets from files before they leave;
- `restore`: the campaign spec, and the jobs S3 holds done (resume after a relaunch);
- `spot`: a poller that reports the interruption notice once;
- `lifecycle`: powering off at the end, and the max-runtime watchdog.

Nothing here talks to a fixed endpoint: boto3 honours `AWS_ENDPOINT_URL` (and the per-service
`AWS_ENDPOINT_URL_<SERVICE>`), IMDS honours `BENCH_IMDS_ENDPOINT`, so tests run it all against
a moto server and a fake IMDS on 127.0.0.1.
"""
