"""Drafter acceptance: read wherever a summary records it, and said to be missing where the
engine did not expose it (the hand-made engines record none)."""

from __future__ import annotations

import pytest

from report.acceptance import read_acceptance
from report.write import Written
from tests.report.helpers import cell, table


def test_counters_are_summed_over_every_window_that_has_them():
    summary = {
        "cells": [
            {
                "repeats": [
                    {
                        "repeat": 0,
                        "num_draft_tokens": 400,
                        "num_accepted_tokens": 300,
                        "num_drafts": 100,
                    },
                    {
                        "repeat": 1,
                        "num_draft_tokens": 600,
                        "num_accepted_tokens": 420,
                        "num_drafts": 150,
                    },
                ]
            },
            {"repeats": [{"repeat": 0, "aggregate_output_tok_s": 10.0}]},
        ]
    }
    found = read_acceptance(summary)
    assert found is not None
    assert found.rate == pytest.approx(720 / 1000)
    assert found.mean_accepted_length == pytest.approx(1 + 720 / 250)


def test_agent_names_without_draft_steps_give_a_rate_only():
    found = read_acceptance({"acceptance": {"drafted_tokens": 50, "accepted_tokens": 10}})
    assert found is not None and found.rate == pytest.approx(0.2)
    assert found.mean_accepted_length is None
    assert read_acceptance({"cells": [{"repeats": [{"requests_ok": 3}]}]}) is None


def test_the_agents_cell_counters_are_read_once_per_cell():
    """As the agent writes a sweep cell: /metrics counters under `server`, and the windows'
    own response counts beside them (llama.cpp), which are not counted twice."""
    server = {"seconds": 30.0, "spec_drafts": 200.0, "spec_draft_tokens": 800.0}
    server["spec_accepted_tokens"] = 500.0
    window = {"repeat": 0, "draft_tokens": 800, "draft_accepted_tokens": 500}
    found = read_acceptance({"cells": [{"server": server, "repeats": [window]}]})
    assert found is not None and (found.drafted, found.accepted) == (800, 500)
    assert found.mean_accepted_length == pytest.approx(1 + 500 / 200)


def test_the_drafter_table_says_when_acceptance_was_not_exposed(handmade_report: Written):
    t = table(handmade_report, "drafter")
    assert cell(t, "vLLM (g6.4xlarge)", "acceptance") == "not exposed by the engine"
    assert cell(t, "llama.cpp (g6.4xlarge)", "acceptance") == "not exposed by the engine"
    assert cell(t, "SGLang (g6.4xlarge)", "acceptance") == "—"  # no drafter arm
