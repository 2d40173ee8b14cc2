"""The CDK app's constructs: declares AWS resources only. Imports `contract/`, never `agent/`.

`control/` beside them is the workstation's control plane that drives those resources
with boto3 (`bench launch|status|fetch|cleanup`); it never imports CDK, and no construct
imports it (tests/test_import_direction.py).
"""
