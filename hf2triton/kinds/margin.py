"""The gate's margin: a candidate passes a limit only when it clears it with confidence, not by a
hair. A metric that is an average over the gate's items (a mean cosine, a label agreement, a
corpus BLEU or chrF, a token match, a perplexity) is re-computed on bootstrap resamples of the
items, and its one-sided 95% bound (the 5th percentile for a `>=` limit, the 95th for a `<=`
one) must be on the right side of the limit. A worst case (min cosine, max probability
difference, the worst query's Spearman) is already a bound over every item and is judged as
measured, as is a statistic of the whole set that does not decompose into items (the Spearman of
all pairwise similarities).

The resampling is seeded: the same candidate on the same items gets the same bound, run after
run, so the validate step stays a cache of its inputs.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # one-sided: a candidate that passes misses in 5% of the item sets like this one
RESAMPLES = 1000
SEED = 0


@dataclass(frozen=True)
class Sample:
    """How a metric is re-computed from items: each item's statistics (a row of `stats`), summed
    over a resample (an item drawn twice counts twice), then `reduce`d to the metric. A mean is
    `stats=[value, 1]`, `reduce=lambda s: s[0] / s[1]`; a corpus BLEU sums each sentence's
    n-gram counts and scores the sums."""

    stats: np.ndarray  # (items, k)
    reduce: Callable[[np.ndarray], float]

    @classmethod
    def mean(cls, values: np.ndarray | list[float]) -> Sample:
        v = np.asarray(values, dtype=np.float64).reshape(-1)
        return cls(np.stack([v, np.ones_like(v)], axis=1), lambda s: float(s[0] / s[1]))

    @classmethod
    def ratio(cls, numerators: Sequence[float], denominators: Sequence[float]) -> Sample:
        """sum(numerators) / sum(denominators) over the items (a ratio of sums)."""
        stats = np.stack(
            [np.asarray(numerators, np.float64), np.asarray(denominators, np.float64)], axis=1
        )
        return cls(stats, lambda s: float(s[0] / s[1]) if s[1] else 1.0)


def bound(sample: Sample, op: str, level: float = LEVEL, resamples: int = RESAMPLES) -> float:
    """The one-sided bound of the metric at `level`: the lower one for a `>=` limit, the upper
    one for `<=`. With fewer than two items, the metric itself."""
    n = len(sample.stats)
    if n < 2:
        return sample.reduce(sample.stats.sum(axis=0))
    rng = np.random.default_rng(SEED)
    counts = rng.multinomial(n, np.full(n, 1.0 / n), size=resamples)  # (resamples, items)
    sums = counts.astype(np.float64) @ sample.stats  # (resamples, k)
    values = np.array([sample.reduce(row) for row in sums], dtype=np.float64)
    values = values[~np.isnan(values)]
    if not len(values):
        return float("nan")
    q = (1.0 - level) if op == ">=" else level
    return float(np.quantile(values, q))


# How closely two runs of one candidate on one input must agree, by the precision it serves at:
# the same files, runtime and batch give the same answer but for the order in which threads
# sum (fp32: about 1e-6), or the rounding of a narrower type (bf16 keeps 8 bits of mantissa).
# What a candidate's own answers move with batch composition (dynamic int8's per-batch
# activation ranges, a batched engine's kernels) the gate measures and adds (Agreement).
PRECISION_TOLERANCE = {"fp32": 1e-4}
NARROW_TOLERANCE = 1e-2  # bf16, fp16, and int8 graphs


def tolerance(precision: str | None) -> float:
    return PRECISION_TOLERANCE.get(precision or "fp32", NARROW_TOLERANCE)


def loosened(
    limits: dict[str, tuple[str, float]], observed: dict[str, float], slack: float
) -> dict[str, tuple[str, float]]:
    """`limits` no tighter than what a candidate was `observed` to reach against itself (alone
    against batched), `slack` beyond it."""
    out = {}
    for name, (op, limit) in limits.items():
        seen = observed.get(name)
        if seen is None or math.isnan(seen):
            out[name] = (op, limit)
        elif op == ">=":
            out[name] = (op, min(limit, seen - slack))
        else:
            out[name] = (op, max(limit, seen + slack))
    return out


@dataclass(frozen=True)
class Borderline:
    """A metric whose measured value meets its limit while its bound does not."""

    metric: str
    value: float
    bound: float
    limit: float
    op: str

    @property
    def short(self) -> float:
        """How far the bound is on the wrong side of the limit."""
        return abs(self.limit - self.bound)

    def describe(self) -> str:
        side = "lower" if self.op == ">=" else "upper"
        return (
            f"{self.metric} {self.value:.4f} meets {self.limit} but its {LEVEL:.0%} {side} "
            f"bound {self.bound:.4f} does not (by {self.short:.4f})"
        )

    def as_dict(self) -> dict[str, float | str]:
        return {
            "value": self.value,
            "bound": self.bound,
            "limit": self.limit,
            "op": self.op,
            "short": self.short,
        }


def borderline(
    metrics: dict[str, float], samples: dict[str, Sample], limits: dict[str, tuple[str, float]]
) -> tuple[dict[str, float], list[Borderline]]:
    """The bound of every limited metric that has a sample, and the metrics that meet their
    limit only by a hair (their bound misses it)."""
    bounds, found = {}, []
    for name, (op, limit) in limits.items():
        if name not in samples or name not in metrics:
            continue
        value = metrics[name]
        b = bound(samples[name], op)
        bounds[name] = b
        meets = value >= limit if op == ">=" else value <= limit
        bound_meets = b >= limit if op == ">=" else b <= limit
        if meets and not (bound_meets or math.isnan(b)):
            found.append(Borderline(name, value, b, limit, op))
    return bounds, found
