"""What a new user meets first: the README's commands on a clean checkout. The hf2triton home is
created wherever it is put, a home that cannot be created and a Prefect API that cannot start
each end in one line with the cause and the fix, and CI runs exactly the README's commands."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_port, run_cli, tiny_spec

HF2TRITON = str(Path(sys.executable).parent / "hf2triton")


def _env(**changes: str | None) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_", "HF2TRITON_", "MLFLOW_"))
    }
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    for key, value in changes.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


def _release(
    spec: Path,
    cwd: Path,
    env: dict[str, str],
    timeout: float = 900,
    prefix: list[str] | None = None,
) -> subprocess.CompletedProcess:
    return run_cli([*(prefix or []), HF2TRITON, "release", str(spec)], timeout, cwd=cwd, env=env)


def _one_error_line(proc: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert lines and lines[-1].startswith("hf2triton: error:"), proc.stderr[-3000:]
    assert sum(ln.startswith("hf2triton: error:") for ln in lines) == 1
    return lines[-1]


def _stop_server(home: Path) -> None:
    subprocess.run(
        [HF2TRITON, "server", "stop"],
        env=_env(HF2TRITON_HOME=str(home)),
        capture_output=True,
        timeout=120,
    )


@pytest.fixture()
def spec(tmp_path, tiny_bert) -> Path:
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    (tmp_path / "specs").mkdir()
    # ONNX Runtime's candidates alone: these tests check the home a first run makes, not the
    # gate (OpenVINO's calibration and timing were most of their 2-3 minutes each).
    return tiny_spec(
        tmp_path / "specs" / "tiny.yaml",
        tiny_bert,
        ports,
        runtime__candidates=[{"name": "onnxruntime", "precision": "fp32"}],
    )


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.mark.e2e
def test_a_clean_working_directory_gets_its_home_created(spec, tmp_path):
    cwd = tmp_path / "fresh-checkout"
    cwd.mkdir()
    try:
        summary = _summary(_release(spec, cwd, _env()))
    finally:
        _stop_server(cwd / ".hf2triton")
    assert summary["mlflow"]["version"] == "1"
    assert (cwd / ".hf2triton" / "prefect").is_dir()
    assert (cwd / ".hf2triton" / "mlflow.db").is_file()


@pytest.mark.e2e
def test_a_nested_home_that_does_not_exist_yet_is_created(spec, tmp_path):
    home = tmp_path / "a" / "b" / "c"
    try:
        summary = _summary(_release(spec, tmp_path, _env(HF2TRITON_HOME=str(home))))
    finally:
        _stop_server(home)
    assert summary["endpoint"]["model"] == "tiny-embedder"
    assert (home / "prefect").is_dir() and (home / "triton" / "server.log").is_file()


def test_a_read_only_working_directory_fails_at_once_naming_it(spec, tmp_path):
    cwd = tmp_path / "read-only"
    cwd.mkdir()
    cwd.chmod(
        stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH
    )
    prefix = []
    if os.geteuid() == 0:
        # Root ignores directory permissions: run the CLI as an ordinary user instead.
        setpriv = shutil.which("setpriv")
        assert setpriv, "setpriv (util-linux) is needed to drop root for this test"
        model = Path(_source_path(spec))  # read before the home is made: the user can read it
        for parent in [*spec.parents, *cwd.parents, model, *model.parents]:
            if parent != Path("/"):
                parent.chmod(parent.stat().st_mode | stat.S_IXOTH | stat.S_IROTH)
        for path in [*spec.parent.rglob("*"), *model.rglob("*")]:
            path.chmod(path.stat().st_mode | stat.S_IROTH)
        prefix = [setpriv, "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
    proc = _release(spec, cwd, _env(HOME="/nonexistent"), timeout=120, prefix=prefix)
    line = _one_error_line(proc)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert str(cwd / ".hf2triton") in line and "HF2TRITON_HOME" in line
    assert "[ENVIRONMENT]" in line and "UNEXPECTED" not in proc.stderr
    # "At once": refused by the home check, before Prefect or any step ran; nothing left behind.
    assert "did not start within" not in line and not any(cwd.iterdir())


@pytest.mark.e2e
def test_a_file_in_the_way_of_the_home_fails_at_once(spec, tmp_path):
    blocker = tmp_path / "home-is-a-file"
    blocker.write_text("not a folder")
    proc = _release(spec, tmp_path, _env(HF2TRITON_HOME=str(blocker / "sub")), timeout=120)
    line = _one_error_line(proc)
    assert proc.returncode == 3
    assert str(blocker / "sub") in line and "HF2TRITON_HOME" in line
    assert "did not start within" not in line and blocker.read_text() == "not a folder"


@pytest.mark.e2e
def test_a_model_folder_that_is_no_model_fails_before_any_step(spec, tmp_path):
    """source.path at a folder without config.json: one line naming it, and nothing made
    (no Prefect API started, no home written)."""
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    spec.write_text(spec.read_text().replace(str(Path(_source_path(spec))), str(empty)))
    home = tmp_path / "home"
    proc = _release(spec, tmp_path, _env(HF2TRITON_HOME=str(home)), timeout=120)
    line = _one_error_line(proc)
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"{empty} has no config.json" in line and "save_pretrained()" in line
    assert not home.exists()


def _source_path(spec: Path) -> str:
    import yaml

    return yaml.safe_load(spec.read_text())["source"]["path"]


@pytest.mark.e2e
def test_a_prefect_database_that_cannot_be_opened_is_named(spec, tmp_path):
    db = tmp_path / "no-such-folder" / "prefect.db"
    env = _env(
        HF2TRITON_HOME=str(tmp_path / "home"),
        PREFECT_SERVER_DATABASE_CONNECTION_URL=f"sqlite+aiosqlite:///{db}",
    )
    proc = _release(spec, tmp_path, env, timeout=120)
    line = _one_error_line(proc)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert str(db) in line and "PREFECT_API_URL" in line and "UNEXPECTED" not in line
    # Named by the database check, not after the API failed its start-up deadline.
    assert "did not start within" not in line and not db.parent.exists()


@pytest.mark.e2e
def test_a_prefect_api_that_does_not_start_in_time_says_what_to_do(spec, tmp_path):
    """The temporary API's database is a PostgreSQL address that accepts connections and never
    answers, so the API cannot start within any deadline, however fast the machine."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"postgresql+asyncpg://prefect:unused@127.0.0.1:{silent.getsockname()[1]}/prefect"
        env = _env(
            HF2TRITON_HOME=str(tmp_path / "home"),
            PREFECT_SERVER_DATABASE_CONNECTION_URL=url,
            PREFECT_SERVER_DATABASE_CONNECTION_TIMEOUT="600",
            PREFECT_SERVER_DATABASE_TIMEOUT="600",
            PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="5",
        )
        proc = _release(spec, tmp_path, env, timeout=300)
    line = _one_error_line(proc)
    assert proc.returncode == 3, proc.stderr[-2000:]
    assert "[ENVIRONMENT]" in line and "did not start within 5 s (still not answering" in line
    assert "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in line and "UNEXPECTED" not in line
    assert not (tmp_path / "home" / "work").exists()  # no step ran
    # The API process it gave up on was stopped, not left behind holding a port.
    assert not _processes_with(f"PREFECT_SERVER_DATABASE_CONNECTION_URL={url}")


def _processes_with(variable: str) -> list[int]:
    """Pids of processes whose environment holds `variable` (NAME=value)."""
    pids = []
    for environ in Path("/proc").glob("[0-9]*/environ"):
        try:
            if variable.encode() in environ.read_bytes().split(b"\0"):
                pids.append(int(environ.parent.name))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return pids


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("## The two commands", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)][:2]


def test_ci_runs_the_readme_commands_in_order():
    main, tests = _readme_commands()
    assert "hf2triton release" in main and "pytest" in tests
    lines = [
        ln.strip()
        for ln in (ROOT / ".ci" / "run").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert main in lines, f".ci/run does not run the README's main command {main!r}"
    assert tests in lines, f".ci/run does not run the README's test command {tests!r}"
    assert lines.index(main) < lines.index(tests)
