"""A few iterations of the stress run in every test run (``scripts/stress`` runs hundreds):
fresh Hermes sessions whose first tool calls race all end (contract O7), with and without
injected faults; without faults every call also succeeds."""

from __future__ import annotations

import pytest

import tool_call_stress


@pytest.mark.parametrize("variant,iterations", [("first-execute-code", 6), ("concurrent", 4)])
def test_fresh_sessions_first_calls_all_end_and_succeed(home, e2b_local, variant, iterations):
    report = tool_call_stress.run(home, e2b_local, variant=variant, iterations=iterations, faults=False, seed=7,
                                  kill_every=3)
    assert report["iterations"] == iterations
    assert report["failed_calls"] == 0, report["failures"]


def test_fresh_sessions_first_calls_end_under_injected_faults(home, e2b_local):
    report = tool_call_stress.run(home, e2b_local, variant="concurrent", iterations=4, faults=True, seed=11,
                                  kill_every=2)
    assert report["iterations"] == 4
    assert sum(report["faults"].values()) == 4
