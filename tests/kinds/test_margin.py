"""The gate's margin (hf2triton/kinds/margin.py): a metric that averages over the items is judged
by its seeded bootstrap bound, so a candidate that meets a limit by a hair is borderline, and two
runs of one candidate agree within what their served precision allows."""

from __future__ import annotations

import math

import numpy as np
import pytest

from hf2triton.kinds.margin import (
    EARLY_ALPHA,
    LEVEL,
    Borderline,
    Sample,
    borderline,
    bound,
    early_bound,
    look_level,
    looks,
    loosened,
    settled,
    tolerance,
)


def test_a_sample_recomputes_its_metric_from_the_items():
    values = [0.9, 1.0, 0.8, 1.0]
    mean = Sample.mean(values)
    assert mean.reduce(mean.stats.sum(axis=0)) == pytest.approx(np.mean(values))
    ratio = Sample.ratio([3, 1], [4, 4])
    assert ratio.reduce(ratio.stats.sum(axis=0)) == 0.5
    assert Sample.ratio([0], [0]).reduce(np.zeros(2)) == 1.0  # nothing to count: agreement


def test_a_sample_that_is_not_the_metric_it_bounds_is_a_defect_of_the_kind():
    """A kind whose `samples` computes its metric otherwise than its `score` would have the
    margin judge a bound of something else: the gate refuses to judge with it."""
    limits = {"label_agreement": (">=", 0.9)}
    right = Sample.mean([1.0, 1.0, 0.0, 1.0])  # 0.75, as measured
    assert borderline({"label_agreement": 0.75}, {"label_agreement": right}, limits)[0]
    with pytest.raises(ValueError, match="label_agreement = 0.75.*gives 1.0"):
        borderline({"label_agreement": 0.75}, {"label_agreement": Sample.mean([1.0])}, limits)
    nan = Sample(np.ones((3, 1)), lambda s: float("nan"))
    borderline({"label_agreement": float("nan")}, {"label_agreement": nan}, limits)


def test_the_bound_is_one_sided_seeded_and_the_metric_itself_when_it_cannot_vary():
    varied = Sample.mean(np.linspace(0.0, 1.0, 50))
    lower, upper = bound(varied, ">="), bound(varied, "<=")
    assert lower < 0.5 < upper
    assert bound(varied, ">=") == lower  # the same items, the same bound
    assert bound(Sample.mean([0.7] * 20), ">=") == pytest.approx(0.7)
    assert bound(Sample.mean([0.3]), ">=") == 0.3  # one item
    assert math.isnan(bound(Sample(np.ones((3, 1)), lambda s: float("nan")), ">="))


def test_a_metric_that_meets_its_limit_only_by_a_hair_is_borderline():
    agree = Sample.mean([1.0] * 95 + [0.0] * 5)  # 0.95
    metrics = {"label_agreement": 0.95, "max_prob_diff": 0.01, "unsampled": 0.0}
    limits = {
        "label_agreement": (">=", 0.94),
        "max_prob_diff": ("<=", 0.05),
        "unsampled": (">=", 1.0),
    }
    bounds, found = borderline(metrics, {"label_agreement": agree}, limits)
    assert set(bounds) == {"label_agreement"} and bounds["label_agreement"] < 0.94
    (hair,) = found
    assert (hair.metric, hair.value, hair.limit, hair.op) == ("label_agreement", 0.95, 0.94, ">=")
    assert hair.short == pytest.approx(0.94 - hair.bound)
    assert f"its {LEVEL:.0%} lower bound" in hair.describe()
    assert hair.as_dict()["short"] == hair.short
    # a comfortable pass is not borderline
    assert (
        borderline(metrics, {"label_agreement": agree}, {"label_agreement": (">=", 0.5)})[1] == []
    )


def test_runs_agree_within_their_precisions_tolerance():
    assert tolerance(None) == tolerance("fp32") == 1e-4
    assert tolerance("bf16") == tolerance("int8") == 1e-2
    limits = {"min_cosine": (">=", 0.999), "max_prob_diff": ("<=", 1e-4), "other": (">=", 1.0)}
    seen = {"min_cosine": 0.99, "max_prob_diff": 0.002, "other": float("nan")}
    assert loosened(limits, seen, 0.001) == {
        "min_cosine": (">=", pytest.approx(0.989)),
        "max_prob_diff": ("<=", pytest.approx(0.003)),
        "other": (">=", 1.0),
    }


def test_a_borderline_describes_the_upper_bound_of_a_ceiling():
    over = Borderline("perplexity_increase", 0.04, 0.06, 0.05, "<=")
    assert over.short == pytest.approx(0.01)
    assert "upper bound 0.0600 does not (by 0.0100)" in over.describe()


def test_a_sample_sized_by_its_bounds_looks_at_doubling_prefixes_up_to_every_item():
    assert looks(20, None) == (20,)  # a kind that sizes no sample: every item at once
    assert looks(8, 10) == (8,)
    assert looks(20, 10) == (10, 20)
    assert looks(50, 10) == (10, 20, 40, 50)
    assert looks(40, 10) == (10, 20, 40)
    assert looks(10_000, 10) == (10, 20, 40, 10_000)  # at most MAX_LOOKS looks: the level holds
    # one look judges at the gate's level as ever; early looks spend 0.5% each, and the last
    # what is left: at most 5% in all that a candidate which misses passes at some look
    assert look_level(0, 1) == LEVEL
    assert look_level(0, 3) == look_level(1, 3) == 1 - EARLY_ALPHA
    spent = sum(1 - look_level(i, 3) for i in range(3))
    assert spent == pytest.approx(1 - LEVEL)


def test_an_early_look_settles_a_clear_pass_or_miss_and_leaves_a_near_one_open():
    limits = {"next_token_agreement": (">=", 0.95), "perplexity_increase": ("<=", 0.05)}
    level = look_level(0, 2)

    def verdict(agree: list[float], increase: list[float]) -> bool | None:
        samples = {
            "next_token_agreement": Sample.mean(agree),
            "perplexity_increase": Sample.mean(increase),
        }
        metrics = {k: float(np.mean(v)) for k, v in zip(samples, (agree, increase))}
        return settled(metrics, samples, limits, level)

    assert verdict([1.0] * 10, [0.0] * 10) is True  # agrees everywhere: settled
    assert verdict([0.4, 0.5] * 5, [0.0] * 10) is False  # even its optimistic bound misses
    assert verdict([1.0] * 9 + [0.7], [0.0] * 10) is None  # 0.97: near, more items decide
    assert verdict([1.0] * 10, [0.2] + [0.0] * 9) is None  # one prompt's perplexity rose
    assert verdict([1.0] * 10, [float("nan")] * 10) is False
    # on ten items the early bound is widened (the percentile bootstrap's is too narrow there):
    # wider than the plain bootstrap's at the same level
    near = Sample.mean([1.0] * 8 + [0.8, 0.9])
    assert early_bound(near, ">=", level) < bound(near, ">=", level)


def test_a_worst_case_can_miss_at_an_early_look_but_never_pass_there():
    limits = {"min_cosine": (">=", 0.99)}
    assert settled({"min_cosine": 0.999}, {}, limits, 0.995) is None  # the rest may be worse
    assert settled({"min_cosine": 0.9}, {}, limits, 0.995) is False
