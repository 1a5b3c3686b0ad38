"""The embedded deploy target: a local `tritonserver` process from the nvidia-pytriton wheel, run
from its own serving environment (numpy<2), in explicit model-control mode, bound to 127.0.0.1 by
default, and left serving after the release ends; beside it, the OpenAI-compatible API
(hf2triton/openai_api) as a process of its own from the same environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

from hf2triton.clients.triton import TritonAdmin
from hf2triton.errors import DeployError, Hf2TritonError, ServiceUnavailableError
from hf2triton.util.processes import alive, reap_group, running, spawn, stop_group
from hf2triton.util.waiting import wait_until
from hf2triton.util.workspace import CHECKOUT, atomic_write_text, digest, home, sha256_file

SERVER_ENV = {"HOME", "LANG", "TZ", "TMPDIR", "USER", "LOGNAME", "OMP_NUM_THREADS"}
SERVER_ENV_PREFIXES = ("LC_", "OPENBLAS_")


def serving_env() -> Path:
    """The Python environment Triton's Python backend runs models in: $HF2TRITON_SERVING_ENV,
    else the `.venv-serving` that infra/setup.sh makes in the checkout (for an installed
    package: beside the environment hf2triton runs in)."""
    default = (CHECKOUT or Path(sys.prefix).parent) / ".venv-serving"
    return Path(os.environ.get("HF2TRITON_SERVING_ENV") or default)


def _pytriton_dir(env: Path) -> Path:
    found = sorted(env.glob("lib/python3*/site-packages/pytriton/tritonserver"))
    if not found or not (found[0] / "bin" / "tritonserver").is_file():
        raise DeployError(
            f"no tritonserver in the serving environment {env}: run `bash infra/setup.sh` (or "
            "set HF2TRITON_SERVING_ENV to an environment with nvidia-pytriton, onnxruntime, "
            "tokenizers and numpy<2)"
        )
    return found[0]


@dataclass(frozen=True)
class ServerPorts:
    """Where a tritonserver listens: the address it binds, and its HTTP, gRPC and metrics
    ports."""

    host: str
    http_port: int
    grpc_port: int
    metrics_port: int

    def __str__(self) -> str:
        return f"{self.host} ports {self.http_port}/{self.grpc_port}/{self.metrics_port}"


@dataclass(frozen=True)
class ServerState:
    pid: int
    host: str
    http_port: int
    grpc_port: int
    metrics_port: int
    model_repository: str
    log_file: str

    @property
    def ports(self) -> ServerPorts:
        return ServerPorts(self.host, self.http_port, self.grpc_port, self.metrics_port)

    @property
    def http_url(self) -> str:
        return f"{self.host}:{self.http_port}"

    @property
    def grpc_url(self) -> str:
        return f"{self.host}:{self.grpc_port}"


def state_dir() -> Path:
    return home() / "triton"


def _state_file() -> Path:
    return state_dir() / "server.json"


T = TypeVar("T", bound=Any)


def _read_recorded(path: Path, cls: type[T]) -> T | None:
    """The state a process left in `path`, whether or not that process still lives."""
    try:
        return cls(**json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def _read_live(path: Path, cls: type[T]) -> T | None:
    """The state a process left in `path`, while that process lives."""
    state = _read_recorded(path, cls)
    return state if state is not None and alive(state.pid) else None


def _reap_dead(path: Path, cls: type[T], what: str) -> None:
    """What is left of the process recorded in `path` once it died (its Python-backend stubs,
    for a tritonserver), reaped; the record removed."""
    state = _read_recorded(path, cls)
    if state is not None and not alive(state.pid):
        reap_group(state.pid, what)
        path.unlink(missing_ok=True)


def reap_orphans() -> None:
    """Reap the process groups of dead servers started from this home: a Python-backend stub
    from its backends directory (see `_backends`) whose tritonserver, the leader of its group,
    is dead. A live server's stubs are never touched, nor those of another home's servers."""
    stubs = str(state_dir() / "backends-py")
    dead = {
        pgid
        for pgid, argv in running().values()
        if argv and argv[0].startswith(stubs) and not alive(pgid)
    }
    for pgid in sorted(dead):
        reap_group(pgid, "tritonserver")


def read_state() -> ServerState | None:
    return _read_live(_state_file(), ServerState)


def is_live(state: ServerState) -> bool:
    with TritonAdmin(state.http_url, timeout_s=2.0) as admin:
        return admin.live()


def python_version(pytriton: Path) -> str:
    """The serving environment's Python ("3.12"), read off the site-packages holding the wheel."""
    found = re.fullmatch(r"python(\d+\.\d+)", pytriton.parents[2].name)
    if found is None:
        raise DeployError(
            f"cannot tell the Python version of the serving environment from "
            f"{pytriton}: install nvidia-pytriton under lib/python3.X/site-packages"
        )
    return found.group(1)


def backend_stub(pytriton: Path) -> Path:
    """The Python backend stub built for the serving environment's Python: the stub runs the
    model's code with that Python's packages (a stub of another version cannot import them)."""
    version = python_version(pytriton)
    stubs = pytriton / "python_backend_stubs"
    stub = stubs / version / "triton_python_backend_stub"
    if not stub.is_file():
        have = sorted(
            (p.parent.name for p in stubs.glob("*/triton_python_backend_stub")),
            key=lambda v: tuple(int(x) for x in v.split(".")),
        )
        raise DeployError(
            f"the serving environment runs Python {version}, and this tritonserver wheel has no "
            f"Python backend stub for it (it has {', '.join(have) or 'none'}): create the serving "
            "environment with one of those Pythons (HF2TRITON_SERVING_ENV)"
        )
    return stub


def _backends(pytriton: Path) -> Path:
    """Triton wants the Python backend stub beside the backend library; the wheel keeps it apart."""
    stub = backend_stub(pytriton)
    # One directory per Python version: a serving environment rebuilt on another Python gets
    # its own stub, never the one copied for the last.
    target = state_dir() / f"backends-py{stub.parent.name}"
    python_dir = target / "python"
    if not (python_dir / "triton_python_backend_stub").is_file():
        tmp = state_dir() / f".backends.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(pytriton / "backends", tmp)
        shutil.copy2(stub, tmp / "python" / "triton_python_backend_stub")
        shutil.rmtree(target, ignore_errors=True)
        os.rename(tmp, target)
    return target


def _log_tail(path: str, lines: int = 15) -> str:
    try:
        return "\n".join(Path(path).read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def launch(
    repo: Path | str, ports: ServerPorts, log_file: Path, extra_env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Start one `tritonserver` on `repo` in explicit model-control mode, in its own session (it
    keeps serving after the caller ends); the caller waits for it to become live. What dead
    servers of this home left running is reaped first (`reap_orphans`).

    `ensure_server` runs the one local server with it; a replica set (tasks/replicas.py) is any
    number of servers started like this, here or on other machines.
    """
    env = serving_env()
    pytriton = _pytriton_dir(env)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    reap_orphans()
    return spawn(
        _server_command(pytriton, repo, ports),
        log_file,
        _server_environment(env, pytriton, extra_env),
    )


def _server_command(pytriton: Path, repo: Path | str, ports: ServerPorts) -> list[str]:
    host = ports.host
    return [
        str(pytriton / "bin" / "tritonserver"),
        f"--model-repository={repo}",
        f"--backend-directory={_backends(pytriton)}",
        "--model-control-mode=explicit",
        "--load-model=*",  # what is already in the repository (the last release) serves again
        f"--http-address={host}",
        f"--http-port={ports.http_port}",
        f"--grpc-address={host}",
        f"--grpc-port={ports.grpc_port}",
        f"--metrics-address={host}",
        f"--metrics-port={ports.metrics_port}",
        "--exit-on-error=false",
        "--strict-readiness=true",
        # p50/p99 per model version on the metrics port, for the watch (hf2triton.watch).
        "--metrics-config=summary_latencies=true",
    ]


def _server_environment(
    env: Path, pytriton: Path, extra_env: dict[str, str] | None
) -> dict[str, str]:
    """The server's environment: only what it needs (no token or password of the pipeline's
    reaches it), the serving environment first on PATH, and `extra_env`."""
    run_env = {
        k: v for k, v in os.environ.items() if k in SERVER_ENV or k.startswith(SERVER_ENV_PREFIXES)
    }
    # The Python backend stub imports numpy, onnxruntime and tokenizers from the python found
    # first on PATH, so the serving environment goes first.
    run_env["PATH"] = f"{env / 'bin'}:{os.environ.get('PATH', '')}"
    run_env["TOKENIZERS_PARALLELISM"] = "false"
    # The stub finds its bundled CUDA runtime stubs only through the wheel's .libs directory.
    libs = pytriton.parent.parent / "nvidia_pytriton.libs"
    run_env["LD_LIBRARY_PATH"] = ":".join(
        p for p in (str(libs), os.environ.get("LD_LIBRARY_PATH", "")) if p
    )
    run_env.update(extra_env or {})
    return run_env


def ensure_server(
    ports: ServerPorts,
    timeout_s: float = 120,
    repository: str | None = None,
    extra_env: dict[str, str] | None = None,
) -> ServerState:
    """Return the running local server, starting one if none runs.

    `repository` is the server's --model-repository (default: `models/` of the state directory;
    an s3:// URI makes it read an S3-compatible store, whose credentials come in `extra_env` and
    are kept in the server's environment only).
    """
    state = read_state()
    wanted_repo = repository or str(state_dir() / "models")
    if state is not None:
        _check_running(state, ports, wanted_repo)
        _wait_live(state, timeout_s)
        return state
    _reap_dead(_state_file(), ServerState, "tritonserver")
    if not wanted_repo.startswith("s3://"):
        Path(wanted_repo).mkdir(parents=True, exist_ok=True)
    log_file = state_dir() / "server.log"
    log_offset = log_file.stat().st_size if log_file.exists() else 0
    proc = launch(wanted_repo, ports, log_file, extra_env)
    state = ServerState(
        proc.pid,
        ports.host,
        ports.http_port,
        ports.grpc_port,
        ports.metrics_port,
        wanted_repo,
        str(log_file),
    )
    atomic_write_text(_state_file(), json.dumps(asdict(state), indent=1))
    _wait_live(state, timeout_s, proc, log_offset)
    return state


def _check_running(state: ServerState, ports: ServerPorts, repository: str) -> None:
    """Raise unless the running server is the one asked for: its repository and its ports."""
    if state.model_repository != repository:
        raise DeployError(
            f"the local Triton (pid {state.pid}) serves the model repository "
            f"{state.model_repository}, not the spec's {repository}: run `hf2triton server "
            "stop` first (its models stop serving), or change deploy.model_store"
        )
    if state.ports != ports:
        raise DeployError(
            f"a local Triton (pid {state.pid}) already serves on {state.ports}, not the spec's "
            f"{ports.host} {ports.http_port}/{ports.grpc_port}/{ports.metrics_port}: change "
            "deploy ports in the spec or run `hf2triton server stop`"
        )


# The server's own start-up failures (e.g. "repository path is not a valid directory"): with
# --exit-on-error=false it keeps running but never becomes live.
STARTUP_ERROR = re.compile(r'^E\S* \S+ \d+ tritonserver\.cc:\d+\] "(.*)"$', re.MULTILINE)


def _startup_error(log_file: str, offset: int) -> str | None:
    """The first start-up error the server logged after `offset` (the log is appended to)."""
    try:
        with open(log_file, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    found = STARTUP_ERROR.search(text)
    return found.group(1) if found else None


def _wait_live(
    state: ServerState, timeout_s: float, proc: subprocess.Popen | None = None, log_offset: int = 0
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if is_live(state):
            return
        failed = _startup_error(state.log_file, log_offset) if proc is not None else None
        # A model that fails under --load-model=* is logged the same way, and the server then
        # goes live anyway: only an error that is still not followed by liveness is fatal.
        if failed and wait_until(lambda: is_live(state), STARTUP_GRACE_S):
            return
        if failed:
            assert proc is not None  # a startup error is only read of a server started here
            terminate(proc)
            _state_file().unlink(missing_ok=True)
            raise DeployError(
                f"tritonserver could not start on the model repository "
                f"{state.model_repository}: {failed}. Log: {state.log_file}"
            )
        if proc is not None and proc.poll() is not None:
            _state_file().unlink(missing_ok=True)
            raise DeployError(
                f"tritonserver exited with code {proc.returncode} while starting (is a port of "
                f"{state.http_port}/{state.grpc_port}/{state.metrics_port} taken?). Log "
                f"{state.log_file}:\n{_log_tail(state.log_file)}"
            )
        time.sleep(0.3)
    raise ServiceUnavailableError(
        f"tritonserver (pid {state.pid}) did not become live on {state.http_url} within "
        f"{timeout_s:.0f}s; log: {state.log_file}"
    )


STARTUP_GRACE_S = 15


def terminate(proc: subprocess.Popen, what: str = "tritonserver") -> None:
    """`stop_group` for a process this one started, which is then reaped (by the thread
    `spawn` started: the wait is for its returncode)."""
    stop_group(proc.pid, what=what)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def stop_server(timeout_s: float = 30) -> ServerState | None:
    """Stop the local server; returns what was stopped, or None if nothing ran (what a dead one
    left running is reaped)."""
    stop_api()  # nothing to serve without the server
    state = read_state()
    if state is None:
        _reap_dead(_state_file(), ServerState, "tritonserver")
        _state_file().unlink(missing_ok=True)
        return None
    stop_group(state.pid, timeout_s, "tritonserver")
    _state_file().unlink(missing_ok=True)
    return state


def status() -> dict:
    """What the local server serves: process, readiness and each model's versions and state;
    the OpenAI-compatible API beside it."""
    state = read_state()
    if state is None:
        return {"running": False}
    with TritonAdmin(state.http_url, timeout_s=5.0) as admin:
        info: dict = {
            "running": True,
            **asdict(state),
            "live": admin.live(),
            "ready": admin.ready(),
        }
        try:
            info["models"] = admin.index()
        except Hf2TritonError as exc:
            info["models_error"] = str(exc)
    api = read_api()
    info["openai"] = (
        {"running": False}
        if api is None
        else {
            "running": True,
            "pid": api.pid,
            "url": api.url,
            "live": api_live(api),
            "keys": api.keys,
            "log_file": api.log_file,
        }
    )
    return info


# -- the OpenAI-compatible API beside the local server (hf2triton/openai_api) -----------------


@dataclass(frozen=True)
class ApiState:
    pid: int
    host: str
    port: int
    triton: str  # the gRPC endpoint it reaches
    code: str  # digest of its code, arguments and key hashes: a change restarts it
    keys: int  # how many keys it accepts (0: none asked)
    log_file: str

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"


API = "the OpenAI-compatible API"


def _api_file() -> Path:
    return state_dir() / "openai.json"


def read_api() -> ApiState | None:
    return _read_live(_api_file(), ApiState)


def api_live(state: ApiState, timeout_s: float = 2.0) -> bool:
    import urllib.request

    try:
        with urllib.request.urlopen(
            f"http://{state.host}:{state.port}/health", timeout=timeout_s
        ) as r:
            return r.status == 200
    except OSError:
        return False


def api_package() -> Path:
    """The API's code as the serving environment imports it: the package copied under the
    state directory as `hf2triton_openai` (its imports are relative, its dependencies the
    serving environment's), replaced whole when it changed."""
    from hf2triton import openai_api

    source = Path(openai_api.__file__).parent
    files = sorted(source.glob("*.py"))
    key = digest([f.name + ":" + sha256_file(f) for f in files])[:16]
    root = state_dir() / f"openai-{key}"
    if not (root / openai_api.PACKAGE_DIR / "__main__.py").is_file():
        tmp = state_dir() / f".openai.{os.getpid()}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        (tmp / openai_api.PACKAGE_DIR).mkdir(parents=True)
        for f in files:
            shutil.copy2(f, tmp / openai_api.PACKAGE_DIR / f.name)
        shutil.rmtree(root, ignore_errors=True)
        os.rename(tmp, root)
    return root


def ensure_api(
    server: ServerState,
    host: str,
    port: int,
    key_hashes: list[str],
    arguments: list[str],
    timeout_s: float = 60,
) -> ApiState:
    """The OpenAI-compatible API beside the local server, on `host`:`port`, started (or
    restarted, when its code, arguments, keys or server changed) in its own session from the
    serving environment; it keeps serving after the caller ends, like the server."""
    package = api_package()
    keys_file = state_dir() / "openai-keys.sha256"
    code = digest([str(package), server.grpc_url, host, port, arguments, key_hashes])[:16]
    state = read_api()
    if state is not None and (state.host, state.port) != (host, port):
        raise DeployError(
            f"the local OpenAI-compatible API (pid {state.pid}) already serves on "
            f"{state.host}:{state.port}, not the spec's {host}:{port}: releases served by one "
            "local Triton share its API; give them the same deploy.openai.port, or run "
            "`hf2triton server stop`"
        )
    if state is not None and state.code == code and api_live(state):
        return state
    if state is not None:
        stop_group(state.pid, what=API)
    _reap_dead(_api_file(), ApiState, API)
    _api_file().unlink(missing_ok=True)
    _write_keys(keys_file, key_hashes)
    env = serving_env()
    log_file = state_dir() / "openai.log"
    cmd = [
        str(env / "bin" / "python"),
        "-m",
        "hf2triton_openai",
        f"--triton={server.grpc_url}",
        f"--host={host}",
        f"--port={port}",
        *arguments,
        *([f"--keys-file={keys_file}"] if key_hashes else []),
    ]
    run_env = {
        k: v for k, v in os.environ.items() if k in SERVER_ENV or k.startswith(SERVER_ENV_PREFIXES)
    }
    run_env.update(PATH=f"{env / 'bin'}:{os.environ.get('PATH', '')}", PYTHONPATH=str(package))
    log_file.parent.mkdir(parents=True, exist_ok=True)
    offset = log_file.stat().st_size if log_file.exists() else 0
    proc = spawn(cmd, log_file, run_env, cwd=str(package))
    state = ApiState(proc.pid, host, port, server.grpc_url, code, len(key_hashes), str(log_file))
    atomic_write_text(_api_file(), json.dumps(asdict(state), indent=1))
    _wait_api(proc, state, log_file, offset, timeout_s)
    return state


def _write_keys(keys_file: Path, key_hashes: list[str]) -> None:
    """The API keys' hashes, readable by this user only (none: no file)."""
    if not key_hashes:
        keys_file.unlink(missing_ok=True)
        return
    tmp = keys_file.with_suffix(".tmp")
    tmp.write_text("")
    tmp.chmod(0o600)
    tmp.write_text("".join(f"{h}\n" for h in key_hashes))
    os.replace(tmp, keys_file)


def _wait_api(
    proc: subprocess.Popen, state: ApiState, log_file: Path, offset: int, timeout_s: float
) -> None:
    """Until the API started as `proc` is live; DeployError with its log's end otherwise."""
    host, port = state.host, state.port
    deadline = time.monotonic() + timeout_s
    while not api_live(state):
        if proc.poll() is not None or time.monotonic() > deadline:
            terminate(proc, API)
            _api_file().unlink(missing_ok=True)
            with open(log_file, "rb") as f:
                f.seek(offset)
                tail = "\n".join(f.read().decode(errors="replace").splitlines()[-10:])
            why = (
                f"it exited with code {proc.returncode}"
                if proc.returncode is not None
                else f"not live within {int(timeout_s)} s"
            )
            raise DeployError(
                f"the OpenAI-compatible API did not start on {host}:{port} ({why}"
                f"; is the port taken? set deploy.openai.port, or deploy.openai.enabled: "
                f"false). Log {log_file}:\n{tail}"
            )
        time.sleep(0.2)


def stop_api() -> ApiState | None:
    state = read_api()
    if state is not None:
        stop_group(state.pid, what=API)
    _reap_dead(_api_file(), ApiState, API)
    _api_file().unlink(missing_ok=True)
    return state
