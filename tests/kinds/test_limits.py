"""How figures are held to a kind's limits (hf2triton/kinds/limits.py): what misses and by how
much, the one line that says so, and the worst of several runs."""

from __future__ import annotations

import math

import pytest

from hf2triton.kinds.limits import describe_misses, far_misses, misses, worst_of

LIMITS = {"min_cosine": (">=", 0.99), "max_prob_diff": ("<=", 0.05)}


def test_a_metric_on_the_wrong_side_misses_by_its_distance():
    assert misses({"min_cosine": 0.995, "max_prob_diff": 0.01}, LIMITS) == {}
    assert misses({"min_cosine": 0.99, "max_prob_diff": 0.05}, LIMITS) == {}  # on the limit
    missed = misses({"min_cosine": 0.98, "max_prob_diff": 0.08}, LIMITS)
    assert missed == {"min_cosine": pytest.approx(0.01), "max_prob_diff": pytest.approx(0.03)}


def test_nan_always_misses_and_an_absent_metric_is_not_judged():
    assert misses({"min_cosine": float("nan")}, LIMITS) == {"min_cosine": math.inf}
    assert misses({}, LIMITS) == {}


def test_the_misses_in_one_line():
    metrics = {"min_cosine": 0.98, "max_prob_diff": 0.08}
    line = describe_misses(metrics, LIMITS, misses(metrics, LIMITS))
    assert line == (
        "min_cosine 0.9800 < 0.99 (short by 0.0100), max_prob_diff 0.0800 > 0.05 (over by 0.0300)"
    )


def test_the_worst_of_several_runs_by_the_side_of_each_limit():
    runs = [
        {"min_cosine": 0.995, "max_prob_diff": 0.01, "other": 3.0},
        {"min_cosine": 0.991, "max_prob_diff": 0.02, "other": 2.0},
    ]
    assert worst_of(runs, LIMITS) == {"min_cosine": 0.991, "max_prob_diff": 0.02, "other": 2.0}
    runs[0]["min_cosine"] = float("nan")
    assert math.isnan(worst_of(runs, LIMITS)["min_cosine"])


def test_a_miss_is_far_at_ten_times_the_distance_from_perfect_the_limit_allows():
    # min_cosine allows 0.01 from perfect (1): far at or under 0.9; max_prob_diff allows 0.05
    # from perfect (0): far at or over 0.5.
    assert far_misses({"min_cosine": 0.95, "max_prob_diff": 0.3}, LIMITS) == {}
    assert far_misses({"min_cosine": 0.9, "max_prob_diff": 0.5}, LIMITS) == {
        "min_cosine": 0.9,
        "max_prob_diff": 0.5,
    }
    assert math.isnan(far_misses({"min_cosine": float("nan")}, LIMITS)["min_cosine"])
    # A limit with no perfect value to measure from is never missed by far.
    assert far_misses({"score": -50.0}, {"score": (">=", 3.0)}) == {}
