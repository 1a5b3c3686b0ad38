"""Steps of the watch's flows (flows/watch.py): `watch-look` reads and probes what a release
serves and publishes it (hf2triton.watch.observe, .publish); `watch-breach` says so with a
Prefect event and, in the window, rolls back (hf2triton.watch.rollback)."""

from __future__ import annotations

from prefect import task

from hf2triton.clients.mlflow import Registry
from hf2triton.spec import ReleaseSpec
from hf2triton.util.json_types import JSONObject
from hf2triton.util.runs import NO_PREFECT_CACHE, step_logger
from hf2triton.watch import observe, publish, rollback


@task(name="watch-look", task_run_name="watch {spec.name}", **NO_PREFECT_CACHE)
def look(spec: ReleaseSpec) -> observe.Look:
    """Read and probe every endpoint, judge the figures, publish the table."""
    seen = observe.look(spec)
    publish.publish(seen, Registry().uri)
    step_logger().info(
        "watch: %s champion %s: %s",
        spec.name,
        seen["champion"],
        "; ".join(seen["breaches"]) or "within budget",
    )
    return seen


@task(
    name="watch-breach",
    task_run_name="breach {seen[release]} v{seen[champion]}",
    **NO_PREFECT_CACHE,
)
def breach(spec: ReleaseSpec, seen: observe.Look, act: str) -> JSONObject | None:
    """Say so (a Prefect event); in the window, with act `rollback`, roll back here too."""
    publish.emit_breach(seen)
    if not seen["in_window"] or act != "rollback":
        return None
    done = rollback.roll_back(
        spec, "watch: " + "; ".join(seen["breaches"]), only_if_champion=seen["champion"]
    )
    step_logger().warning("watch: rolled %s back to version %s", spec.name, done["champion"])
    return done
