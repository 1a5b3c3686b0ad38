"""A real Prefect server for the tests that operate releases through it: `prefect server start`
(SQLite) on a free port with a process work pool, once per session, and small helpers to run
commands against it and read its flow runs."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ROOT = Path(__file__).resolve().parents[1]


def _run(cmd: list[str], env: dict, timeout: float = 300, cwd: Path = ROOT):
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{' '.join(cmd)}\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}"
    return proc


def _start(cmd: list[str], env: dict, log: Path) -> subprocess.Popen:
    return subprocess.Popen(
        cmd,
        env=env,
        cwd=ROOT,
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def _stop(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        os.killpg(proc.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory):
    """`prefect server start` (SQLite) on a free port, and a process work pool."""
    from tests.conftest import free_port, wait_http

    tmp = tmp_path_factory.mktemp("prefect-server")
    port = free_port()
    api = f"http://127.0.0.1:{port}/api"
    env = {
        **os.environ,
        "PREFECT_HOME": str(tmp / "prefect-home"),
        "PREFECT_API_URL": api,
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
        "PWD": str(ROOT),
    }
    env.pop("PREFECT_API_KEY", None)
    server = _start(
        [str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env,
        tmp / "server.log",
    )
    try:
        wait_http(f"{api}/health", timeout=180, proc=server)
        _run(
            [str(BIN / "prefect"), "work-pool", "create", "hf2triton-process", "--type", "process"],
            env,
        )
        yield {"env": env, "api": api, "ui": f"http://127.0.0.1:{port}", "tmp": tmp}
    finally:
        _stop(server)


async def _flow_runs(api_env: dict, **filters):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        DeploymentFilter,
        DeploymentFilterName,
        FlowFilter,
        FlowFilterName,
    )

    # Deployment names are unique per flow only: a release's watch deployments share its name.
    flow = filters.get("flow", "release-model")
    async with get_client() as client:
        deployments = await client.read_deployments(
            flow_filter=FlowFilter(name=FlowFilterName(any_=[flow])),
            deployment_filter=DeploymentFilter(name=DeploymentFilterName(any_=[filters["name"]])),
        )
        assert deployments, f"no deployment {filters['name']}"
        runs = await client.read_flow_runs(
            deployment_filter=DeploymentFilter(id={"any_": [deployments[0].id]})
        )
        return deployments[0], runs


async def _cancel_open_runs() -> list[str]:
    """Cancel every flow run on the server that has not ended (scheduled, late, pending, running,
    paused): what one module's release left queued (its watch run, a schedule's next run) must not
    take a later module's worker slot, or the one-at-a-time slot of a deployment."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Cancelled

    open_types = [
        StateType.SCHEDULED,
        StateType.PENDING,
        StateType.RUNNING,
        StateType.PAUSED,
        StateType.CANCELLING,
    ]
    async with get_client() as client:
        runs = await client.read_flow_runs(
            flow_run_filter=FlowRunFilter(
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=open_types))
            )
        )
        for run in runs:
            await client.set_flow_run_state(run.id, Cancelled(message="test clean-up"), force=True)
    return [run.name for run in runs]


def cancel_open_runs(env: dict) -> list[str]:
    return _with_api(env, _cancel_open_runs)


def _with_api(env: dict, coro_fn, *args, **kwargs):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: env["PREFECT_API_URL"]}):
        return asyncio.run(coro_fn(*args, **kwargs))


def screenshot(url: str, shot: Path, scratch: Path, size: str = "1400,1100") -> Path:
    """A page of the Prefect UI as headless Chromium renders it (infra/setup.sh --test)."""
    import shutil

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    assert chromium, "chromium is needed for the UI screenshot (infra/setup.sh --test installs it)"
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={scratch / 'chrome'}",
            f"--window-size={size}",
            "--virtual-time-budget=15000",
            f"--screenshot={shot}",
            url,
        ],
        capture_output=True,
        timeout=120,
        check=False,
    )
    return shot


async def _start_run(name: str, flow: str = "release-model") -> str:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        deployment = await client.read_deployment_by_name(f"{flow}/{name}")
        run = await client.create_flow_run_from_deployment(deployment.id)
    return str(run.id)


def start_run(env: dict, name: str, flow: str = "release-model") -> str:
    """A new run of deployment `flow/name`, as `prefect deployment run` makes one; its id."""
    return _with_api(env, _start_run, name, flow)


async def _read_run(run_id: str):
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        return await client.read_flow_run(run_id)


def read_run(env: dict, run_id: str):
    return _with_api(env, _read_run, run_id)


async def _delete_automations(name: str) -> int:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = await client.read_automations_by_name(name)
        for automation in found:
            await client.delete_automation(automation.id)
    return len(found)


def delete_automations(env: dict, name: str) -> int:
    """Delete the server's automations called `name`; how many there were."""
    return _with_api(env, _delete_automations, name)


def kill_worker(worker: subprocess.Popen) -> list[int]:
    """SIGKILL a worker and every process under it at once, as losing its machine would: its
    flow runs run in sessions of their own, out of reach of a signal to its process group."""
    import psutil

    procs = [psutil.Process(worker.pid), *psutil.Process(worker.pid).children(recursive=True)]
    for proc in procs:  # frozen first, so none of them acts on another's death
        proc.send_signal(signal.SIGSTOP)
    for proc in procs:
        proc.send_signal(signal.SIGKILL)
    worker.wait(30)
    return [proc.pid for proc in procs]
