"""A kind's limits and how figures are held to them: a limit is (metric, ">=" or "<=", value),
and a metric passes when it is on the right side of it. The gate and the smoke test judge with
these, so they judge alike."""

from __future__ import annotations

import math

# metric -> (">=" or "<=", value)
Limits = dict[str, tuple[str, float]]


def misses(metrics: dict[str, float], limits: Limits) -> dict[str, float]:
    """How far each metric is on the wrong side of its limit (empty: every limit is met).
    A metric the limits name but the figures lack is not judged (e.g. accuracy in a smoke test,
    which has no gold labels); a NaN metric always misses."""
    out = {}
    for name, (op, limit) in limits.items():
        if name not in metrics:
            continue
        value = metrics[name]
        ok = value >= limit if op == ">=" else value <= limit  # False for NaN
        if not ok:
            out[name] = abs(limit - value) if not math.isnan(value) else float("inf")
    return out


def describe_misses(metrics: dict[str, float], limits: Limits, missed: dict[str, float]) -> str:
    """The misses in one line: each metric, the side of its limit it is on, and by how much."""
    parts = []
    for name, gap in missed.items():
        op, limit = limits[name]
        side = "<" if op == ">=" else ">"
        word = "short by" if op == ">=" else "over by"
        parts.append(f"{name} {metrics[name]:.4f} {side} {limit} ({word} {gap:.4f})")
    return ", ".join(parts)


def worst_of(runs: list[dict[str, float]], limits: Limits) -> dict[str, float]:
    """The worst value of each metric over several runs (e.g. batch compositions)."""
    out = {}
    for name in runs[0]:
        values = [r[name] for r in runs]
        if any(isinstance(v, float) and math.isnan(v) for v in values):
            out[name] = float("nan")
        elif limits.get(name, (">=",))[0] == "<=":
            out[name] = max(values)
        else:
            out[name] = min(values)
    return out


FAR = 10.0  # a miss is far when the metric is this many times as far from perfect as allowed


def far_misses(metrics: dict[str, float], limits: Limits) -> dict[str, float]:
    """The metrics that miss their limits by far: ten times as far from perfect as the limit
    allows (an agreement or similarity, perfect at 1, limited at 0.95: at or under 0.5; an
    increase or distance, perfect at 0, limited at 0.05: at or over 0.5). A NaN is far; a
    limit with no perfect value (under 0 or over 1 for ">=", under 0 for "<=") never is."""
    out = {}
    for name, (op, limit) in limits.items():
        value = metrics.get(name)
        if value is None:
            continue
        if math.isnan(value):
            out[name] = value
        elif op == ">=" and 0.0 <= limit < 1.0 and 1.0 - value >= FAR * (1.0 - limit) - 1e-9:
            out[name] = value
        elif op == "<=" and limit > 0.0 and value >= FAR * limit - 1e-9:
            out[name] = value
    return out
