"""`python -m agent.preflight`: does this environment hold what the agent imports on an instance?

The agent's environment is built from the asset alone (agent/install.sh); a package that only
a developer's environment has (through the dev extras or another package's dependencies)
would fail the first job needing it, hours and dollars in. This imports each one the agent
loads lazily and prints one line per missing package; exit status 1 if any is missing.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["LAZY_IMPORTS", "missing_imports"]

# Module -> what needs it. The agent imports these only when a job needs them.
LAZY_IMPORTS: dict[str, str] = {
    "huggingface_hub": "model downloads from the Hugging Face hub (agent/models.py)",
    "bfcl_eval": "the BFCL task's questions and official checker (agent/evals/bfcl.py)",
    "boto3": "status, uploads, the spec and the HF token (agent/aws)",
}


def missing_imports() -> list[str]:
    """One line per module of LAZY_IMPORTS that does not import here."""
    missing = []
    for module, why in LAZY_IMPORTS.items():
        try:
            importlib.import_module(module)
        except Exception as exc:  # any import failure means the job would fail
            missing.append(f"{module} ({why}): {type(exc).__name__}: {exc}")
    return missing


def main() -> int:
    missing = missing_imports()
    for line in missing:
        sys.stderr.write(f"agent preflight: cannot import {line}\n")
    return 1 if missing else 0


if __name__ == "__main__":
    raise SystemExit(main())
