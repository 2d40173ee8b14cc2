"""Tests of the CDK app (app.py, cdk.json, infra/) and of contract.layout."""
