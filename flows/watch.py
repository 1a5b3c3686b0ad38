"""The watch's flows, each also a Prefect deployment (hf2triton.orchestration.deployments):
`watch-release` looks at what a release serves and publishes it, and on a breach emits an event
(and, in the window, rolls back itself when nothing else answers the event); `rollback-release` is
the rollback the event's automation and `hf2triton rollback` run; `release-status` reports champion,
candidate, what serves and the watch's last figures. The steps are tasks/watch.py's, the work
hf2triton/watch/'s."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal, cast

from prefect import flow
from prefect.deployments import run_deployment

from hf2triton.orchestration.deployments import release_tag
from hf2triton.orchestration.prefect_api import deployment_tagged
from hf2triton.spec import ReleaseSpec, parse_spec
from hf2triton.tasks.watch import breach, look
from hf2triton.util.json_types import JSONObject, RawSpec
from hf2triton.util.runs import step_logger
from hf2triton.watch import observe, rollback, status

if TYPE_CHECKING:
    from prefect.client.schemas.objects import FlowRun


@flow(name="watch-release", log_prints=False, validate_parameters=False)
def watch_release(
    spec: ReleaseSpec | RawSpec,
    duration_s: float = 0,
    act: Literal["rollback", "event"] = "rollback",
) -> list[observe.Look]:
    """Look every `watch.interval_s` for `duration_s` (at least once, and on until a breach is
    confirmed or gone). A breach seen `watch.confirm_looks` looks in a row emits
    `hf2triton.watch.breach`; in the window, `act: rollback` rolls back here (a local release),
    `act: event` leaves it to the automation that answers the event (prefect.yaml)."""
    spec = parse_spec(spec)
    return observe.watch(spec, duration_s, look, lambda seen: breach(spec, seen, act))


@flow(name="rollback-release", log_prints=False, validate_parameters=False)
def rollback_release(
    spec: ReleaseSpec | RawSpec,
    to: str | None = None,
    reason: str = "rolled back by hand",
    only_if_champion: str | None = None,
) -> JSONObject:
    """`hf2triton rollback` as a deployment, and what the watch's breach event starts."""
    spec = parse_spec(spec)
    done = rollback.roll_back(spec, reason, to=to, only_if_champion=only_if_champion or None)
    step_logger().info("rollback %s: %s", spec.name, done)
    return done


@flow(name="release-status", log_prints=False, validate_parameters=False)
def release_status(spec: ReleaseSpec | RawSpec) -> JSONObject:
    """`hf2triton status` as a deployment."""
    return status.status(parse_spec(spec))


def after_release(spec: ReleaseSpec) -> JSONObject:
    """The release's own watch: on a Prefect server with the watch deployed, a run of it for the
    whole window (the release does not wait); otherwise an in-process watch for
    `watch.after_release_s` (0: one look). A watch that cannot look warns; the release stands."""
    if not spec.watch.enabled:
        return {"watch": "disabled"}
    log = step_logger()
    try:
        name = deployment_tagged("watch-release", release_tag(spec.name))
        if name is not None:
            # Prefect's run_deployment answers a coroutine only inside an event loop, not here.
            run = cast(
                "FlowRun",
                run_deployment(
                    name,
                    parameters={"duration_s": spec.watch.window_s},
                    timeout=0,
                    as_subflow=False,
                ),
            )
            log.info(
                "watch: started %s (flow run %s) for %.0f s", name, run.id, spec.watch.window_s
            )
            return {"watch": name, "flow_run": str(run.id)}
        seen = watch_release(spec, duration_s=spec.watch.after_release_s)
        return {
            "watch": "in-process",
            "breaches": seen[-1]["breaches"],
            "champion": seen[-1]["champion"],
        }
    except Exception as exc:  # noqa: BLE001 - the release is done; the watch says why it is not
        log.warning("watch: could not watch %s after the release: %s", spec.name, exc)
        return {"watch": "failed", "error": str(exc)}
