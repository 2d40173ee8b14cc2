"""The CDK app's constructs: declares AWS resources only. Imports `contract/`, never `agent/`."""
