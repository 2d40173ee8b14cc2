"""The agent asset: the project's on-instance code, zipped by CDK and uploaded at deploy.

Contents: the `agent/`, `engines/` and `contract/` packages plus `pyproject.toml` (and
`README.md`, which pyproject.toml names as the readme, so `pip install` of the unzipped tree
works). Tests, caches, virtual environments, build outputs and results stay out. The user data
downloads the zip, installs it into a virtual environment and starts `python3 -m agent`.

The zip's key is a hash of its contents, so any change to the agent or a recipe makes a new
object and `cdk deploy` updates the launch templates to point at it.
"""

from __future__ import annotations

from pathlib import Path

from aws_cdk import IgnoreMode
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

__all__ = ["ASSET_EXCLUDES", "AgentAsset"]

# .gitignore syntax, relative to the project root: everything at the top level is out except
# the listed entries, then unwanted things inside them are out again.
ASSET_EXCLUDES = (
    "/*",
    "!/agent/",
    "!/engines/",
    "!/contract/",
    "!/pyproject.toml",
    "!/README.md",
    "tests/",
    "__pycache__/",
    "*.py[cod]",
    ".venv*",
    "cdk.out/",
    "results/",
    "*.egg-info/",
    ".pytest_cache/",
    ".ruff_cache/",
    ".cache/",
    "build/",
    "dist/",
    "node_modules/",
)


class AgentAsset(Construct):
    """The zipped agent, engine recipes and contract, staged at synth, uploaded at deploy.

    Attributes:
        asset: the S3 asset (`asset.bucket`, `asset.s3_object_key`).
    """

    def __init__(self, scope: Construct, id_: str, *, project_root: Path) -> None:
        """Declare the asset.

        Args:
            scope: parent construct.
            id_: construct id.
            project_root: the folder holding pyproject.toml and the three packages.

        Raises:
            FileNotFoundError: a package or pyproject.toml is missing under project_root.
        """
        super().__init__(scope, id_)
        for name in ("agent", "engines", "contract", "pyproject.toml"):
            if not (project_root / name).exists():
                raise FileNotFoundError(f"agent asset: {project_root / name} does not exist")
        self.asset = s3_assets.Asset(
            self,
            "Zip",
            path=str(project_root),
            ignore_mode=IgnoreMode.GIT,
            exclude=list(ASSET_EXCLUDES),
        )
