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

Where a kind's reference is dear (a generator's PyTorch continuations: minutes on a large model),
the gate sizes its sample by the bound (`looks`): it judges the first items, and goes on to more
only when the bounds there leave the verdict open. Each early look spends `EARLY_ALPHA` of the
5% (at the 99.5% bound); the last look judges at what is left, so the chance that a candidate
which misses passes at some look is still at most 5% (Bonferroni over the looks).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

LEVEL = 0.95  # one-sided: a candidate that passes misses in 5% of the item sets like this one
RESAMPLES = 1000
SEED = 0
EARLY_ALPHA = 0.005  # what an early look spends of the 1 - LEVEL: it decides at the 99.5% bound
MAX_LOOKS = 4  # a sample sized by its bounds is judged at most this many times (the last: all)
EARLY_RESAMPLES = 20000  # an early look's far tail, on a few items, needs more resamples


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
    level: float = LEVEL  # the bound's level (an early or last look's: margin.look_level)

    @property
    def short(self) -> float:
        """How far the bound is on the wrong side of the limit."""
        return abs(self.limit - self.bound)

    def describe(self) -> str:
        side, level = ("lower" if self.op == ">=" else "upper"), f"{self.level * 100:.4g}%"
        return (
            f"{self.metric} {self.value:.4f} meets {self.limit} but its {level} {side} "
            f"bound {self.bound:.4f} does not (by {self.short:.4f})"
        )

    def as_dict(self) -> dict[str, float | str]:
        return {
            "value": self.value,
            "bound": self.bound,
            "limit": self.limit,
            "op": self.op,
            "short": self.short,
            "level": self.level,
        }


def looks(n: int, first: int | None) -> tuple[int, ...]:
    """How many of `n` items the gate has judged at each look: `first`, doubled until all `n`,
    at most MAX_LOOKS looks (the last: all `n`); one look of all of them where the kind sizes no
    sample (`first` None) or `n` is no more."""
    if not first or n <= first:
        return (n,)
    out = [first]
    while out[-1] * 2 < n and len(out) < MAX_LOOKS - 1:
        out.append(out[-1] * 2)
    return (*out, n)


def early_bound(sample: Sample, op: str, level: float) -> float:
    """An early look's bound at `level` on its few items: the percentile bootstrap's is too
    narrow on ten or so items (its tail covers about 2% where it says 0.5%), so its level is
    expanded as Hesterberg's expanded percentile interval does (the normal quantile of the
    level widened to Student's t on n - 1 degrees of freedom, times sqrt(n / (n - 1))), drawn
    from EARLY_RESAMPLES resamples."""
    from scipy import stats

    n = len(sample.stats)
    if n < 3:
        return bound(sample, op, level)
    wide = float(stats.norm.cdf(math.sqrt(n / (n - 1)) * stats.t.ppf(level, n - 1)))
    return bound(sample, op, wide, EARLY_RESAMPLES)


def look_level(look: int, count: int) -> float:
    """The bound's level at look `look` (0-based) of `count`: an early look spends EARLY_ALPHA,
    the last what the early ones left of 1 - LEVEL (one look: LEVEL, as ever)."""
    if look < count - 1:
        return 1.0 - EARLY_ALPHA
    return LEVEL + EARLY_ALPHA * (count - 1)


def settled(
    metrics: dict[str, float],
    samples: dict[str, Sample],
    limits: dict[str, tuple[str, float]],
    level: float,
) -> bool | None:
    """An early look's verdict: True when every limit is met by its bound at `level` (every
    limited metric must have a sample: a worst case on some items says nothing of the rest),
    False when some metric misses for sure (a worst case that misses already, or a bound on the
    far side at `level` that misses too: even the optimistic figure falls short), None when the
    items judged so far leave it open."""
    passes = True
    for name, (op, limit) in limits.items():
        if name not in metrics:
            continue
        value = metrics[name]
        if math.isnan(value):
            return False
        if name not in samples:
            if not _meets(value, op, limit):
                return False
            passes = False
            continue
        near = early_bound(samples[name], op, level)
        far = early_bound(samples[name], "<=" if op == ">=" else ">=", level)
        if not _meets(far, op, limit):
            return False
        passes = passes and _meets(near, op, limit)
    return True if passes else None


def _meets(value: float, op: str, limit: float) -> bool:
    return value >= limit if op == ">=" else value <= limit  # False for NaN


def check_sample(name: str, value: float, sample: Sample) -> None:
    """Raise where a metric's sample, summed over every item, is not the metric the gate
    measured: the kind's `samples` and `score` would then compute two things, and the bound
    would judge the other one."""
    whole = sample.reduce(sample.stats.sum(axis=0))
    if math.isnan(value) and math.isnan(whole):
        return
    if not math.isclose(whole, value, rel_tol=1e-6, abs_tol=1e-9):
        raise ValueError(
            f"the gate measured {name} = {value!r}, but its bootstrap sample over the same "
            f"items gives {whole!r}: the kind's `samples` and `score` compute {name} "
            "differently (a defect of the kind, not of the candidate)"
        )


def borderline(
    metrics: dict[str, float],
    samples: dict[str, Sample],
    limits: dict[str, tuple[str, float]],
    level: float = LEVEL,
) -> tuple[dict[str, float], list[Borderline]]:
    """The bound of every limited metric that has a sample (at `level`), and the metrics that
    meet their limit only by a hair (their bound misses it)."""
    bounds, found = {}, []
    for name, (op, limit) in limits.items():
        if name not in samples or name not in metrics:
            continue
        value = metrics[name]
        check_sample(name, value, samples[name])
        b = bound(samples[name], op, level)
        bounds[name] = b
        meets = value >= limit if op == ">=" else value <= limit
        bound_meets = b >= limit if op == ">=" else b <= limit
        if meets and not (bound_meets or math.isnan(b)):
            found.append(Borderline(name, value, b, limit, op, level))
    return bounds, found
