"""The restart rule (judge/starts.another_start), verdict by verdict: when a level's floor asks for one more server
start. Written against the mutants `mutmut` left alive in it (README, "Mutation testing"): replays hold only the
starts a run recorded, so a rule asking for one start too many, or a pass near its floor never asking, went unseen.
"""

from __future__ import annotations

import pytest

from sglperf.judge.floor import FloorVerdict, floor_of
from sglperf.judge.starts import another_start
from sglperf.store.baselines import Entry

# A calibrated entry: its floor for three starts (judge/noise.py) lies above its floor for one.
ENTRY = Entry(metric="sustained_output_tps", value=1000.0, tolerance=0.10, noise_cv=0.04, runs=6, noise_df=5.0,
              within_cv=0.01, taken_at="2026-12-07", source="test", sglperf_version="0.1.0")
FLOOR_3 = floor_of(ENTRY, 3)[0]


def verdict(outcome: str, value: float | None = 1000.0, ci95: float | None = 10.0) -> FloorVerdict:
    return FloorVerdict(outcome, "sustained_output_tps", value, ci95, ENTRY.floor, ENTRY.value, ENTRY.tolerance, "")


def test_the_floor_for_three_starts_lies_above_the_floor_for_one():
    assert ENTRY.floor < FLOOR_3 < ENTRY.value


@pytest.mark.parametrize("outcome", ["inconclusive", "regression", "pass", "not judged"])
@pytest.mark.parametrize("disturbed", [False, True])
def test_no_start_is_asked_for_once_the_profile_allows_no_more(outcome, disturbed):
    assert not another_start(verdict(outcome, 1.0), 3, ENTRY, 3, disturbed=disturbed)
    assert not another_start(verdict(outcome, 1.0), 4, ENTRY, 3, disturbed=disturbed)


@pytest.mark.parametrize("disturbed", [False, True])
def test_an_undecided_or_a_low_level_asks_for_another_start_while_one_is_allowed(disturbed):
    assert another_start(verdict("inconclusive"), 2, ENTRY, 3, disturbed=disturbed)
    assert another_start(verdict("regression", 700.0), 1, ENTRY, 3, disturbed=disturbed)


def test_a_pass_clear_of_the_floor_for_every_start_allowed_is_settled_at_once():
    v = verdict("pass", FLOOR_3 + 11.0, 10.0)  # its whole interval above the floor for three starts
    assert not another_start(v, 1, ENTRY, 3)


def test_a_pass_whose_interval_reaches_below_the_floor_for_every_start_allowed_asks_again():
    v = verdict("pass", FLOOR_3 + 9.0, 10.0)  # above the one-start floor, its lower end below the three-start one
    assert v.value - v.ci95 > ENTRY.floor
    assert another_start(v, 1, ENTRY, 3)


def test_a_pass_exactly_at_the_floor_for_every_start_allowed_is_settled():
    assert not another_start(verdict("pass", FLOOR_3 + 10.0, 10.0), 1, ENTRY, 3)


def test_a_pass_without_an_interval_is_judged_by_its_point():
    assert another_start(verdict("pass", FLOOR_3 - 1.0, None), 1, ENTRY, 3)
    assert not another_start(verdict("pass", FLOOR_3 + 0.5, None), 1, ENTRY, 3)  # no interval: none taken off


def test_a_pass_with_no_value_never_asks():
    assert not another_start(verdict("pass", None, None), 1, ENTRY, 3, disturbed=True)


@pytest.mark.parametrize("outcome, asks", [("pass", False), ("not judged", False), ("inconclusive", True)])
def test_a_disturbed_level_asks_again_unless_it_passed_or_was_not_judged(outcome, asks):
    v = verdict(outcome, None, None)
    assert another_start(v, 1, ENTRY, 3, disturbed=True) is asks
    assert another_start(v, 1, ENTRY, 3, disturbed=False) is (outcome == "inconclusive")
