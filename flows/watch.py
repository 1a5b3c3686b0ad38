"""The watch's flows, each also a Prefect deployment (hf2triton.deployments): `watch-release`
looks at what a release serves and publishes it, and on a breach emits an event (and, in the
window, rolls back itself when nothing else answers the event); `rollback-release` is the
rollback the event's automation and `hf2triton rollback` run; `release-status` reports champion,
candidate, what serves and the watch's last figures. The work is in hf2triton/watch/."""

from __future__ import annotations

import time
from typing import Any, Literal

from prefect import flow, task

from hf2triton.clients.mlflow import Registry
from hf2triton.runs import NO_PREFECT_CACHE, step_logger
from hf2triton.spec import ReleaseSpec, parse_spec
from hf2triton.watch import observe, publish, rollback, status


@task(name="watch-look", task_run_name="watch {spec.name}", **NO_PREFECT_CACHE)
def look(spec: ReleaseSpec) -> observe.Look:
    """Read and probe every endpoint, judge the figures, publish the table."""
    seen = observe.look(spec)
    publish.publish(seen, Registry().uri)
    log = step_logger()
    log.info("watch: %s champion %s: %s", spec.name, seen["champion"],
             "; ".join(seen["breaches"]) or "within budget")
    return seen


@task(name="watch-breach", task_run_name="breach {seen[release]} v{seen[champion]}",
      **NO_PREFECT_CACHE)
def breach(spec: ReleaseSpec, seen: observe.Look, act: str) -> dict[str, Any] | None:
    """Say so (a Prefect event); in the window, with act `rollback`, roll back here too."""
    publish.emit_breach(seen)
    if not seen["in_window"] or act != "rollback":
        return None
    done = rollback.roll_back(spec, "watch: " + "; ".join(seen["breaches"]),
                              only_if_champion=seen["champion"])
    step_logger().warning("watch: rolled %s back to version %s", spec.name, done["champion"])
    return done


@flow(name="watch-release", log_prints=False, validate_parameters=False)
def watch_release(spec: ReleaseSpec | dict[str, Any], duration_s: float = 0,
                  act: Literal["rollback", "event"] = "rollback") -> list[observe.Look]:
    """Look every `watch.interval_s` for `duration_s` (at least once, and on until a breach is
    confirmed or gone). A breach seen `watch.confirm_looks` looks in a row emits
    `hf2triton.watch.breach`; in the window, `act: rollback` rolls back here (a local release),
    `act: event` leaves it to the automation that answers the event (prefect.yaml)."""
    spec = parse_spec(spec)
    end = time.monotonic() + duration_s
    seen = []
    while True:
        seen.append(look(spec))
        now = seen[-1]
        if now["confirmed"]:
            done = breach(spec, now, act)
            if done and done.get("rolled_back"):
                seen.append(look(spec))  # the table shows what serves now
                break
        # A breach not yet confirmed is looked at again, whatever the duration.
        unsure = bool(now["breaches"]) and not now["confirmed"]
        if not unsure and time.monotonic() + spec.watch.interval_s > end:
            break
        if unsure:
            step_logger().info("watch: %s breach %d of %d looks in a row needed to act; "
                               "looking again in %.0f s", spec.name, now["streak"],
                               spec.watch.confirm_looks, spec.watch.interval_s)
        time.sleep(spec.watch.interval_s)
    return seen


@flow(name="rollback-release", log_prints=False, validate_parameters=False)
def rollback_release(spec: ReleaseSpec | dict[str, Any], to: str | None = None,
                     reason: str = "rolled back by hand", only_if_champion: str | None = None
                     ) -> dict[str, Any]:
    """`hf2triton rollback` as a deployment, and what the watch's breach event starts."""
    spec = parse_spec(spec)
    done = rollback.roll_back(spec, reason, to=to, only_if_champion=only_if_champion or None)
    step_logger().info("rollback %s: %s", spec.name, done)
    return done


@flow(name="release-status", log_prints=False, validate_parameters=False)
def release_status(spec: ReleaseSpec | dict[str, Any]) -> dict[str, Any]:
    """`hf2triton status` as a deployment."""
    return status.status(parse_spec(spec))


def watch_deployment(release: str) -> str | None:
    """The `watch-release` deployment of `release` on the Prefect API, if one is deployed."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterTags,
        FlowFilter,
        FlowFilterName,
    )

    with get_client(sync_client=True) as client:
        found = client.read_deployments(
            flow_filter=FlowFilter(name=FlowFilterName(any_=["watch-release"])),
            deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(
                all_=[f"release:{release}"])))
    return f"watch-release/{found[0].name}" if found else None


def after_release(spec: ReleaseSpec) -> dict[str, Any]:
    """The release's own watch: on a Prefect server with the watch deployed, a run of it for the
    whole window (the release does not wait); otherwise an in-process watch for
    `watch.after_release_s` (0: one look). A watch that cannot look warns; the release stands."""
    if not spec.watch.enabled:
        return {"watch": "disabled"}
    log = step_logger()
    try:
        name = watch_deployment(spec.name)
        if name is not None:
            from prefect.deployments import run_deployment

            run = run_deployment(name, parameters={"duration_s": spec.watch.window_s},
                                 timeout=0, as_subflow=False)
            log.info("watch: started %s (flow run %s) for %.0f s", name, run.id,
                     spec.watch.window_s)
            return {"watch": name, "flow_run": str(run.id)}
        seen = watch_release(spec, duration_s=spec.watch.after_release_s)
        return {"watch": "in-process", "breaches": seen[-1]["breaches"],
                "champion": seen[-1]["champion"]}
    except Exception as exc:  # noqa: BLE001 - the release is done; the watch says why it is not
        log.warning("watch: could not watch %s after the release: %s", spec.name, exc)
        return {"watch": "failed", "error": str(exc)}
