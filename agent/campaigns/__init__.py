"""Campaign specs shipped with the project: the embedded local default and the seeds' two.

`local.toml` is what `bench run` runs with no argument; `g6-six-engines.toml` and
`t4-six-engines.toml` reproduce the seeds' L4 (EC2 G6) and Tesla T4 campaigns.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["CAMPAIGNS_DIR", "LOCAL_DEFAULT"]

CAMPAIGNS_DIR = Path(__file__).resolve().parent
LOCAL_DEFAULT = CAMPAIGNS_DIR / "local.toml"
