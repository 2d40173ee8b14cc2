"""Reports read what an arm is from the manifest (ArmFacts, written by the runner from the
engine's recipe), and fall back to parsing arm names only for manifests older than that."""

from __future__ import annotations

import pytest

from agent.provenance import arm_facts
from contract.jobs import ArmFacts
from report.arms import drafted_tokens, engine_name, is_drafter
from report.load import ArmResults


@pytest.mark.parametrize(
    ("arm", "engine", "display_name", "drafter", "tokens"),
    [
        ("vllm-d4", "vllm", "vLLM", True, 4),
        ("llama-d", "llamacpp", "llama.cpp", True, None),
        ("pytorch", "pytorch", "PyTorch (this project's engine)", False, None),
    ],
)
def test_the_runner_records_each_arm_as_its_recipe_reads_it(
    arm: str, engine: str, display_name: str, drafter: bool, tokens: int | None
):
    assert arm_facts(arm) == ArmFacts(
        arm=arm, engine=engine, display_name=display_name, drafter=drafter, draft_tokens=tokens
    )
    assert arm_facts("nonesuch-d2") is None  # no recipe: its jobs fail, saying why


def _arm(name: str, facts: ArmFacts | None) -> ArmResults:
    return ArmResults(shard="s0", arm=name, label=name, engine=None, facts=facts)


def test_the_report_reads_the_facts_not_the_name():
    # A name that parses differently shows the report reads the recorded facts.
    facts = ArmFacts(
        arm="x-d9", engine="sglang", display_name="SGLang", drafter=True, draft_tokens=1
    )
    arm = _arm("x-d9", facts)
    assert engine_name(arm) == "SGLang"
    assert drafted_tokens(arm) == "1 token" and is_drafter(arm)


def test_an_old_manifest_without_facts_is_read_from_arm_names():
    assert engine_name(_arm("llama-d2", None)) == "llama.cpp"
    assert drafted_tokens(_arm("vllm-d4", None)) == "4 tokens"
    assert drafted_tokens(_arm("sglang-d", None)) == "its own"
    assert not is_drafter(_arm("mistralrs", None))
