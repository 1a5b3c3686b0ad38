"""The Prefect API a local release talks to: without a Prefect server, Prefect's temporary API is
started (and its database checked) up front, so that a failure is one line with its cause and fix
instead of a start-up deadline running out later, and it is stopped before the CLI's last line.
On a Prefect server, every deployment run makes sure the automation that marks dead runs Crashed
is there (`ensure_dead_run_automation`).
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import cast

from hf2triton.errors import EnvironmentSetupError
from hf2triton.util.net import free_port
from hf2triton.util.workspace import ensure_home

# Prefect's 20 s default start-up deadline is too short on a busy 2-core machine.
STARTUP_TIMEOUT_S = "180"
# Exit code of Prefect's API process when its port is taken; Prefect then retries another port.
PORT_TAKEN = 3
# A flow run whose process died with its machine (or with its worker, killed) stays Running with
# nobody left to end it, and keeps its deployment's one-at-a-time slot until the slot's lease runs
# out (5 minutes): the next run of the release waits behind a run that will never finish. Its
# heartbeats stop, though (the flow engine sends one every PREFECT_FLOWS_HEARTBEAT_FREQUENCY
# seconds, 180 by default): after this many missed ones the automation marks it Crashed, which
# frees the slot (Prefect's "detect zombie flows"; Prefect Cloud has it built in).
DEAD_RUN_AUTOMATION = "hf2triton: mark runs whose heartbeats stopped as crashed"
MISSED_HEARTBEATS = 3


def set_process_defaults() -> None:
    """Prefect settings every hf2triton command runs with, unless the user set them. Called before
    Prefect is imported: its settings are read from the environment at import."""
    # The temporary API's telemetry races on its SQLite file; none is sent from here either.
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", STARTUP_TIMEOUT_S)
    os.environ.setdefault("DO_NOT_TRACK", "1")


def prepare_local_run() -> None:
    """Everything a local release hands to a library exists before the library sees it: the
    hf2triton home, Prefect's home in it, and (without a Prefect server) Prefect's temporary API,
    started here so that its failure is explained in one line instead of timing out later.

    Raises EnvironmentSetupError naming the cause and the fix.
    """
    root = ensure_home("prefect")
    if os.environ.get("PREFECT_API_URL"):
        return  # a Prefect server is configured: runs go there
    # Set before Prefect reads its settings (the first prefect import below).
    os.environ.setdefault("PREFECT_HOME", str(root / "prefect"))
    check_database()
    start_temporary_api()


def check_database() -> None:
    """Prefect's temporary API keeps its state in SQLite; a database it cannot open makes the
    API fail every request (and Prefect wait out its start-up deadline). Check it first."""
    from prefect.settings import get_current_settings

    secret = get_current_settings().server.database.connection_url
    url = secret.get_secret_value() if secret is not None else ""
    if not url.startswith("sqlite") or ":memory:" in url:
        return
    path = url.split(":///", 1)[-1].split("?", 1)[0]
    try:
        with sqlite3.connect(path, timeout=30) as db:
            db.execute("BEGIN IMMEDIATE")  # takes the write lock: proves the file is writable
            db.rollback()
    except sqlite3.Error as exc:
        raise EnvironmentSetupError(
            f"Prefect's temporary API cannot use its database {path}: {exc}. Make its folder "
            "writable (it is PREFECT_HOME, by default in the hf2triton home), set "
            "HF2TRITON_HOME to a writable folder, or point PREFECT_API_URL at a running Prefect "
            "server (`prefect server start`)"
        ) from None


def start_temporary_api() -> None:
    """Start Prefect's temporary API (the one a flow run without PREFECT_API_URL uses) and fail
    at once, with the cause, if its process dies or it does not answer in time.

    Prefect has no public call that starts it: its clients start the default
    `SubprocessASGIServer()` on first use, so the same instance is started here, in a thread,
    while its process is watched (Prefect's own wait notices only a taken port).
    """
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    timeout = get_current_settings().server.ephemeral.startup_timeout_seconds
    server = SubprocessASGIServer()  # the same instance the flow run's client will use
    if server.port is None:
        # Prefect picks a random port in 8000-8999, where Triton's default ports are: a release
        # whose temporary API took 8002 found its Triton's metrics port in use. A reserved port
        # outside that range and the kernel's ephemeral range, instead.
        server.port = free_port()
    failure: list[BaseException] = []

    def start() -> None:
        try:
            server.start(timeout=timeout)
        except BaseException as exc:  # noqa: BLE001 - reported below, with its cause
            failure.append(exc)

    starter = threading.Thread(target=start, daemon=True)
    starter.start()
    while starter.is_alive():
        starter.join(0.2)
        proc = server.server_process
        code = proc.poll() if proc is not None else None
        if code is not None and code != PORT_TAKEN:
            server.stop()  # nothing to keep: the flow run must not wait on it either
            raise EnvironmentSetupError(
                f"Prefect's temporary API exited with code {code} while starting (its output is "
                "above). Point PREFECT_API_URL at a running Prefect server (`prefect server "
                "start`), or re-run with PREFECT_LOGGING_LEVEL=DEBUG to see why"
            )
    if failure:
        proc = server.server_process
        code = proc.poll() if proc is not None else None
        state = (
            "still not answering"
            if proc is not None and code is None
            else f"exited with code {code if code is not None else '?'}"
        )
        server.stop()
        raise EnvironmentSetupError(
            f"Prefect's temporary API did not start within {timeout} s ({state}; "
            f"{type(failure[0]).__name__}). On a busy machine raise "
            "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS, or point PREFECT_API_URL at a "
            "running Prefect server (`prefect server start`)"
        )


def stop_temporary_api() -> None:
    """Stop Prefect's temporary API now rather than at exit, so the last line is ours. Pending
    logs and events are delivered first: afterwards there is no API to send them to."""
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.server.api.server import SubprocessASGIServer

    for service in (APILogWorker, EventsWorker):
        service.drain_all(timeout=10)
    SubprocessASGIServer().stop()  # the default instance the run's clients used


def deployment_tagged(flow_name: str, tag: str) -> str | None:
    """`flow/deployment` of the first deployment of `flow_name` carrying `tag` on the Prefect
    API, or None."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterTags,
        FlowFilter,
        FlowFilterName,
    )

    with get_client(sync_client=True) as client:
        found = client.read_deployments(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow_name])),
            deployment_filter=DeploymentFilter(tags=DeploymentFilterTags(all_=[tag])),
        )
    return f"{flow_name}/{found[0].name}" if found else None


def dead_run_automation(heartbeat_s: int):
    """The automation marking an hf2triton flow run (tag
    hf2triton.orchestration.deployments.RUN_TAG) Crashed
    when neither a heartbeat nor its end came for MISSED_HEARTBEATS heartbeats of `heartbeat_s`."""
    from datetime import timedelta

    from prefect.client.schemas.objects import StateType
    from prefect.events.actions import ChangeFlowRunState
    from prefect.events.schemas.automations import AutomationCore, EventTrigger, Posture

    from hf2triton.orchestration.deployments import RUN_TAG

    return AutomationCore(
        name=DEAD_RUN_AUTOMATION,
        description=f"An hf2triton flow run that missed {MISSED_HEARTBEATS} heartbeats (every "
        f"{heartbeat_s} s) lost its process: marked Crashed, its deployment's slot "
        "is free for the next run, which reuses the steps it finished.",
        trigger=EventTrigger(
            match={"prefect.resource.id": "prefect.flow-run.*"},
            match_related={
                "prefect.resource.role": "tag",
                "prefect.resource.id": f"prefect.tag.{RUN_TAG}",
            },
            after={"prefect.flow-run.heartbeat"},
            expect={
                "prefect.flow-run.heartbeat",
                "prefect.flow-run.Completed",
                "prefect.flow-run.Failed",
                "prefect.flow-run.Cancelled",
                "prefect.flow-run.Crashed",
            },
            for_each={"prefect.resource.id"},
            posture=Posture.Proactive,
            threshold=1,
            within=timedelta(seconds=MISSED_HEARTBEATS * heartbeat_s),
        ),
        actions=[
            ChangeFlowRunState(
                state=StateType.CRASHED,
                message=f"No heartbeat for {MISSED_HEARTBEATS * heartbeat_s} s: the run's process "
                "is gone (its machine or worker died). Run the release again: it reuses "
                "the steps this run finished and redoes the one it was in.",
            )
        ],
    )


def ensure_dead_run_automation() -> dict[str, str]:
    """Pull step of every hf2triton deployment (prefect.yaml), so that any Prefect server the
    releases run on has the dead-run automation before a run of theirs can die: created when
    missing, its window widened when this run's heartbeats are further apart than it allows
    (never narrowed: that would crash the live runs of a worker with slower heartbeats).

    A failure here is logged and the run goes on: the slot's lease still frees it, later."""
    from prefect.client.orchestration import get_client
    from prefect.events.schemas.automations import EventTrigger
    from prefect.logging import get_logger
    from prefect.settings import get_current_settings

    log = get_logger("hf2triton")
    heartbeat_s = get_current_settings().flows.heartbeat_frequency
    if not heartbeat_s:
        log.warning(
            "flow run heartbeats are off (PREFECT_FLOWS_HEARTBEAT_FREQUENCY): a run "
            "whose process dies stays Running until its slot's lease runs out"
        )
        return {}
    wanted = dead_run_automation(heartbeat_s)
    try:
        with get_client(sync_client=True) as client:
            found = client.read_automations_by_name(DEAD_RUN_AUTOMATION)
            if not found:
                return {"dead_run_automation": str(client.create_automation(wanted))}
            current = found[0]
            # The automation of this name is the one made here: its trigger an EventTrigger.
            if cast(EventTrigger, current.trigger).within < wanted.trigger.within:
                client.update_automation(
                    current.id, wanted.model_copy(update={"enabled": current.enabled})
                )
                log.info("%s: window widened to %s", DEAD_RUN_AUTOMATION, wanted.trigger.within)
            return {"dead_run_automation": str(current.id)}
    except Exception as exc:  # noqa: BLE001 - the release itself does not depend on it
        log.warning(
            "could not make sure the automation %r exists (%s: %s): a run whose process "
            "dies stays Running until its slot's lease runs out",
            DEAD_RUN_AUTOMATION,
            type(exc).__name__,
            exc,
        )
        return {}
