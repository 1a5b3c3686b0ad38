"""The release spec's `watch:` section: the budgets a serving champion is held to after its
release (failure rate, p99 latency, smoke metric floors), how often the watch looks, and the
window after promotion during which a breach rolls the release back on its own."""

from __future__ import annotations

from pydantic import Field, field_validator

from hf2triton.util.specbase import Strict


class WatchSpec(Strict):
    """Watch what serves (docs/watch.md): a Prefect flow reads each endpoint's Triton metrics and
    probes it with the gate's smoke items; a breach of these budgets emits a Prefect event, and
    within `window_s` of the promotion rolls back to the previous champion."""

    enabled: bool = Field(True, description="false: no watch deployment, no watch after release")
    max_failure_rate: float = Field(
        0.01,
        ge=0,
        le=1,
        description="failed / all requests to the champion version between two looks",
    )
    max_p99_ms: float | None = Field(
        None,
        gt=0,
        description="Triton's p99 request latency "
        "(ms) the champion version may reach; none: not judged",
    )
    max_p99_vs_previous: float | None = Field(
        3.0,
        gt=1,
        description="the champion's p99 may be at most this many times the "
        "previous champion's p99 as the watch last saw it (where known); none: not compared",
    )
    p99_slack_ms: float = Field(
        5.0,
        ge=0,
        description="p99 differences below this many ms "
        "are noise, never a breach against the previous champion",
    )
    min_requests: int = Field(
        20,
        ge=1,
        description="fewer requests between two looks: the "
        "failure rate and latency of that look are not judged",
    )
    smoke_floors: dict[str, float] = Field(
        {},
        description="floors for the probe's smoke figures, e.g. {grpc_min_cosine: 0.99}; "
        "the gate's own smoke limits always apply",
    )
    window_s: float = Field(
        600,
        gt=0,
        description="seconds after promotion during which a "
        "breach rolls back to the previous champion (after it: an alert)",
    )
    interval_s: float = Field(30, gt=0, le=3600, description="seconds between two looks")
    confirm_looks: int = Field(
        2,
        ge=1,
        le=20,
        description="looks in a row that must breach before the watch acts "
        "(the breach event, the rollback in the window): after a breaching look the watch looks "
        "again every interval_s until the breach is confirmed or gone; 1: act on the first",
    )
    after_release_s: float = Field(
        0,
        ge=0,
        description="how long `hf2triton release` watches in-process after promotion "
        "(0: one probe and one table; a release run on a Prefect server starts the watch "
        "deployment for the whole window instead)",
    )
    cron: str = Field("*/15 * * * *", description="the scheduled watch deployment's cron")

    @field_validator("smoke_floors")
    @classmethod
    def _floor_names(cls, floors: dict[str, float]) -> dict[str, float]:
        bad = [k for k in floors if not k.replace("_", "").isalnum()]
        if bad:
            raise ValueError(
                f"watch.smoke_floors keys {bad} are not smoke figure names (e.g. grpc_min_cosine)"
            )
        return floors
