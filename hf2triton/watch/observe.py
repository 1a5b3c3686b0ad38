"""One look of the watch: each endpoint's Triton metrics for the champion version since the last
look, a probe with the gate's smoke items, the figures judged against the `watch:` budgets (and
the previous champion's figures where the watch saw them), and the state `hf2triton status`
reads; and the watch's loop of looks. Publishing and acting on a breach are the steps'
(tasks/watch.py)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any, TypedDict

from hf2triton.clients.mlflow import Registry
from hf2triton.errors import Hf2TritonError
from hf2triton.spec import ReleaseSpec, kind_for, target_for
from hf2triton.spec.watch import WatchSpec
from hf2triton.targets import WatchPoint
from hf2triton.targets.smoke import Endpoint, smoke_endpoint
from hf2triton.util.runs import step_logger
from hf2triton.util.workspace import atomic_write_text, home, work_dir
from hf2triton.watch import metrics
from hf2triton.watch import registry as reg

BREACH_EVENT = "hf2triton.watch.breach"


class Look(TypedDict):
    release: str
    model: str  # MLflow registered model
    champion: str | None
    candidate: str | None
    previous: str | None
    at: float
    in_window: bool  # a breach now rolls back
    streak: int  # looks in a row at this champion with a breach, this one included
    confirmed: bool  # the streak reached watch.confirm_looks: the watch acts on the breach
    rows: list[dict[str, Any]]  # one per endpoint: the table the UI shows
    breaches: list[str]


def state_path(release: str):
    return home() / "watch" / f"{release}.json"


def read_state(release: str) -> dict[str, Any]:
    try:
        return json.loads(state_path(release).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def p99_limit(budget: WatchSpec, baseline: dict[str, Any] | None) -> float | None:
    """The p99 the champion may reach: the absolute budget, and a multiple of the previous
    champion's p99 (never closer to it than the slack) where the watch saw it."""
    limits = [budget.max_p99_ms] if budget.max_p99_ms else []
    base = (baseline or {}).get("p99_ms")
    if budget.max_p99_vs_previous and base:
        limits.append(max(base * budget.max_p99_vs_previous, base + budget.p99_slack_ms))
    return min(limits) if limits else None


def judge(row: dict[str, Any], budget: WatchSpec, baseline: dict[str, Any] | None) -> list[str]:
    """The budgets `row` (one endpoint's figures) breaks, each as one sentence."""
    where = f"{row['endpoint']} version {row['version']}"
    out = []
    if row.get("probe_error"):
        out.append(f"{where}: smoke probe failed: {row['probe_error']}")
    for name, floor in budget.smoke_floors.items():
        value = row.get(name)
        if value is not None and value < floor:
            out.append(f"{where}: smoke {name} {value:.4f} below the floor {floor}")
    if row["requests"] >= budget.min_requests:
        if row["failure_rate"] > budget.max_failure_rate:
            out.append(
                f"{where}: failure rate {row['failure_rate']:.2%} ({row['failed']} of "
                f"{row['requests']} requests) over the budget "
                f"{budget.max_failure_rate:.2%}"
            )
        limit = p99_limit(budget, baseline)
        if limit is not None and row["p99_ms"] is not None and row["p99_ms"] > limit:
            out.append(
                f"{where}: p99 {row['p99_ms']:.1f} ms over the budget {limit:.1f} ms"
                + (f" (previous champion's p99 {baseline['p99_ms']:.1f} ms)" if baseline else "")
            )
    return out


def _probe(
    spec: ReleaseSpec, point: WatchPoint, version: str, reference: dict[str, Any] | None
) -> dict[str, Any]:
    if reference is None:
        return {}
    endpoint = Endpoint(name=point["name"], http=point["http"], grpc=point["grpc"], version=version)
    if point.get("openai"):
        endpoint["openai"] = point["openai"]
    try:
        figures = smoke_endpoint(
            kind_for(spec),
            endpoint,
            spec.triton_model_name,
            reference,
            spec.deploy.openai.client_key(),
        )
    except Hf2TritonError as exc:
        return {"probe_error": " ".join(str(exc).split())[:300]}
    keep = set(reference["limits"]) | {"grpc_p50_ms"}
    return {
        k: round(v, 5)
        for k, v in figures.items()
        if k in keep or k.split("_", 1)[-1] in reference["limits"]
    }


def _read_point(
    spec: ReleaseSpec,
    point: WatchPoint,
    champion: str | None,
    reference: dict[str, Any] | None,
    state: dict[str, Any],
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One endpoint's row (its metrics since the last look, and a probe of the champion) and
    the scrape the next look starts from (None when its metrics could not be read)."""
    try:
        scrape = metrics.read(point["metrics"])
    except Hf2TritonError as exc:
        row = {
            "endpoint": point["name"],
            "version": champion,
            "requests": 0,
            "failed": 0,
            "failure_rate": 0.0,
            "p99_ms": None,
            "probe_error": str(exc),
        }
        return row, None
    last = state.get("scrapes", {}).get(point["name"])
    before = (
        metrics.Scrape(at=last["at"], counters={(m, v): c for m, v, c in last["counters"]})
        if last
        else None
    )
    row = {
        "endpoint": point["name"],
        **metrics.figures(before, scrape, spec.triton_model_name, champion or ""),
    }
    row.update(_probe(spec, point, champion, reference) if champion else {})
    kept = {
        "at": scrape.at,
        "counters": [
            [m, v, c] for (m, v), c in scrape.counters.items() if m == spec.triton_model_name
        ],
    }
    return row, kept


def look(spec: ReleaseSpec, points: list[WatchPoint] | None = None, probe: bool = True) -> Look:
    """Read, probe and judge what serves now; saves the state the next look and `hf2triton
    status` read."""
    client = Registry()
    model = spec.registry.model_name
    now = reg.versions(client, model)
    champion = now["champion"]
    budget: WatchSpec = spec.watch
    state = read_state(spec.name)
    points = points if points is not None else target_for(spec, work_dir(spec.name)).watch_points()
    if champion is None:
        points = []  # nothing released here yet: nothing to read or probe
    reference = reg.smoke_reference(client, model, champion) if champion and probe else None
    baseline = state.get("versions", {}).get(now["previous"] or "")
    rows, breaches, scrapes = [], [], {}
    for point in points:
        row, scrape = _read_point(spec, point, champion, reference, state)
        rows.append(row)
        breaches.extend(judge(row, budget, baseline))
        if scrape is not None:
            scrapes[point["name"]] = scrape
    at = time.time()
    streak = _streak(state, champion, breaches)
    result = Look(
        release=spec.name,
        model=model,
        champion=champion,
        candidate=now["candidate"],
        previous=now["previous"],
        at=at,
        in_window=_in_window(now, at, budget),
        streak=streak,
        confirmed=bool(breaches) and streak >= budget.confirm_looks,
        rows=rows,
        breaches=breaches,
    )
    versions = _versions_seen(state, champion, rows, budget)
    atomic_write_text(
        state_path(spec.name),
        json.dumps(
            {"last": result, "scrapes": scrapes, "versions": versions}, indent=1, default=str
        ),
    )
    return result


def _in_window(now: reg.Versions, at: float, budget: WatchSpec) -> bool:
    """Whether a breach at `at` rolls the champion back: promoted within the window, and not
    put back by a rollback (that version is not rolled back further on its own: a person
    decides)."""
    return bool(
        now["promoted_at"]
        and at - now["promoted_at"] <= budget.window_s
        and now["restored_at"] is None
    )


def _streak(state: dict[str, Any], champion: str | None, breaches: list[str]) -> int:
    """Looks in a row at `champion` with a breach, this one included. One slow look (a burst,
    a version's first requests) is not a regression: the watch acts when `confirm_looks` looks
    in a row at the same champion breach."""
    if not breaches:
        return 0
    last = state.get("last") or {}
    return (int(last.get("streak") or 0) if last.get("champion") == champion else 0) + 1


def _versions_seen(
    state: dict[str, Any], champion: str | None, rows: list[dict[str, Any]], budget: WatchSpec
) -> dict[str, Any]:
    """The figures of each champion the watch saw, this look's included: what the next
    champion is compared with."""
    judged = [r for r in rows if r["requests"] >= budget.min_requests]
    versions = state.get("versions", {})
    if champion and judged:
        versions[champion] = {
            "p99_ms": max((r["p99_ms"] or 0) for r in judged) or None,
            "failure_rate": max(r["failure_rate"] for r in judged),
        }
    return versions


def watch(
    spec: ReleaseSpec,
    duration_s: float,
    look_once: Callable[[ReleaseSpec], Look],
    act: Callable[[Look], dict[str, Any] | None],
) -> list[Look]:
    """Look every `watch.interval_s` for `duration_s` (at least once, and on until a breach is
    confirmed or gone); a breach seen `watch.confirm_looks` looks in a row is handed to `act`,
    and after a rollback one more look shows what serves now."""
    end = time.monotonic() + duration_s
    seen: list[Look] = []
    while True:
        seen.append(look_once(spec))
        now = seen[-1]
        if now["confirmed"]:
            done = act(now)
            if done and done.get("rolled_back"):
                seen.append(look_once(spec))  # the table shows what serves now
                break
        # A breach not yet confirmed is looked at again, whatever the duration.
        unsure = bool(now["breaches"]) and not now["confirmed"]
        if not unsure and time.monotonic() + spec.watch.interval_s > end:
            break
        if unsure:
            step_logger().info(
                "watch: %s breach %d of %d looks in a row needed to act; looking again in %.0f s",
                spec.name,
                now["streak"],
                spec.watch.confirm_looks,
                spec.watch.interval_s,
            )
        time.sleep(spec.watch.interval_s)
    return seen
