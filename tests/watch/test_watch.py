"""Watching what serves, with the real parts: a tiny model released twice (real Triton, MLflow on
SQLite, Prefect's test API) on free ports; Triton's metrics read by the watch; `hf2triton
rollback` and `status` under client traffic; a planted serving fault on the new version (it
errors on long inputs, which the validation set barely has) rolled back by the watch within its
window while the client keeps sending."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from hf2triton.util.net import free_port
from tests.conftest import ROOT, tiny_spec
from tests.served import Traffic, serving_versions, triton_client, watched_under_traffic

pytestmark = pytest.mark.e2e  # every test here starts a server or runs a release

HF2TRITON = str(Path(sys.executable).parent / "hf2triton")
# Short looks; latency is not judged here (a shared 2-core machine's p99 is noise): the p99
# budget's arithmetic is tests/watch/test_observe.py's, its PromQL promtool's.
WATCH = {
    "watch__interval_s": 1.0,
    "watch__min_requests": 5,
    "watch__window_s": 900,
    "watch__max_failure_rate": 0.05,
    "watch__p99_slack_ms": 600_000,
    # ONNX Runtime's fp32 alone: the watch is what these tests check, not the gate's choice.
    "runtime__candidates": [{"name": "onnxruntime", "precision": "fp32"}],
}


def _until(done, what: str, timeout_s: float = 180) -> None:
    """Wait for `done()`; fail naming `what` when it does not come (no timing is asserted)."""
    from hf2triton.util.waiting import wait_until

    assert wait_until(done, timeout_s), f"timed out waiting for {what}"


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "HF2TRITON_HOME": str(home), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _mlflow(home: Path):
    from mlflow import MlflowClient

    uri = f"sqlite:///{home / 'mlflow.db'}"
    return MlflowClient(uri, registry_uri=uri)


@pytest.fixture(scope="module")
def watched(tmp_path_factory, tiny_bert, other_tiny_bert):
    """tiny-embedder released as version 1 (tiny_bert) and then 2 (other weights), watched."""
    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec
    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("watched")
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    (tmp / "v1").mkdir()
    first = tiny_spec(tmp / "v1" / "tiny-embedder.yaml", tiny_bert, ports, **WATCH)
    second = tiny_spec(tmp / "tiny-embedder.yaml", other_tiny_bert, ports, **WATCH)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            one = release_model(load_spec(first))
            two = release_model(load_spec(second))
            yield {
                "home": tmp / "home",
                "spec": second,
                "ports": ports,
                "first": one,
                "second": two,
                "http": f"127.0.0.1:{ports['http_port']}",
            }
        finally:
            mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
            triton_local.stop_server()


@pytest.fixture()
def home_of(watched, monkeypatch):
    monkeypatch.setenv("HF2TRITON_HOME", str(watched["home"]))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return watched


def _cli(args: list[str], home: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hf2triton.cli.main", *args],
        env=_env(home),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_release_watches_its_champion_and_publishes_the_table(home_of):
    from hf2triton.spec import load_spec
    from hf2triton.watch import observe
    from hf2triton.watch.publish import table

    assert home_of["second"]["watch"]["watch"] == "in-process"
    assert home_of["second"]["watch"]["breaches"] == []
    spec = load_spec(home_of["spec"])
    with Traffic(home_of["http"], "tiny-embedder") as traffic:
        _until(lambda: len(traffic.answered) >= 30, "answers")
    seen = observe.look(spec)
    row = seen["rows"][0]
    assert seen["champion"] == "2" and row["version"] == "2" and row["loaded"]
    # Triton's own counters and latency quantiles for version 2, and the probe's gate metrics.
    assert row["requests"] >= 30 and row["failure_rate"] == 0.0
    assert row["p99_ms"] is not None and row["p99_ms"] > 0 and row["p50_ms"] <= row["p99_ms"]
    assert row["request_rate"] > 0 and row["queue_ms"] is not None
    assert row["grpc_min_cosine"] >= 0.98 and not seen["breaches"]
    assert {"endpoint", "request_rate", "failure_rate", "p50_ms", "p99_ms", "verdict"} <= set(
        table(seen)[0]
    )
    assert seen["in_window"] and seen["previous"] == "1"


def test_rollback_command_under_traffic_then_status(home_of):
    rel = home_of
    with Traffic(rel["http"], "tiny-embedder") as traffic:
        _until(lambda: len(traffic.answered) >= 10, "answers")
        back = _cli(["rollback", str(rel["spec"]), "--reason", "operator test"], rel["home"])
        after = len(traffic.answered)
        _until(lambda: len(traffic.answered) >= after + 10, "answers after it")
    assert back.returncode == 0, back.stderr[-3000:]
    assert json.loads(back.stdout)["champion"] == "1"
    assert not traffic.failed, traffic.failed[:3]
    assert "2" in traffic.answered and traffic.answered[-1] == "1"
    assert serving_versions(triton_client(rel["http"]), "tiny-embedder") == ["1"]
    client = _mlflow(rel["home"])
    assert str(client.get_model_version_by_alias("tiny-embedder", "champion").version) == "1"
    assert (
        client.get_model_version("tiny-embedder", "2").tags["hf2triton.rolled_back"]
        == "operator test"
    )
    shown = _cli(["status", str(rel["spec"]), "--json"], rel["home"])
    assert shown.returncode == 0, shown.stderr[-3000:]
    status = json.loads(shown.stdout)
    assert status["champion"] == "1" and status["candidate"] == "2"
    assert list(status["serving"].values()) == [["1"]]
    assert status["watch"]["rows"][0]["version"] == "2"  # the watch's last figures
    assert status["restored_from"] == "2"
    # Every release of the home at a glance, the watch's time in local time.
    import re
    import time as clock

    listed = _cli(["status"], rel["home"])
    assert listed.returncode == 0, listed.stderr[-3000:]
    header, *rows = listed.stdout.strip().splitlines()
    assert header.split() == [
        "RELEASE",
        "CHAMPION",
        "CANDIDATE",
        "SERVING",
        "WATCH",
        "LAST",
        "LOOK",
    ]
    mine = next(r for r in rows if r.startswith("tiny-embedder "))
    assert mine.split()[1:3] == ["1", "2"] and "v1 on local Triton" in mine
    shown_at = re.search(r"\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}", mine).group(0)
    assert shown_at == clock.strftime("%Y-%m-%d %H:%M:%S", clock.localtime(status["watch"]["at"]))
    one = _cli(["status", "tiny-embedder"], rel["home"])  # by the name the home ran
    assert one.returncode == 0, one.stderr[-3000:]
    assert "champion:   1 (restored from 2)" in one.stdout and "watch:" in one.stdout


FAULT = """
    def execute(self, requests):
        # Planted by tests/watch/test_watch.py: the serving code crashes on inputs longer than any
        # validated one, a regression only real traffic shows. Triton counts what an execute
        # that raises fails as failed requests of this version.
        for request in requests:
            text = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
            if max(len(t[0]) for t in text) > 200:
                raise RuntimeError("planted fault: input too long")
        return self.serving.triton_execute(self.model, requests, pb_utils)
"""


def _plant_fault(rel) -> None:
    from hf2triton.clients.triton import TritonAdmin

    model_py = rel["home"] / "triton" / "models" / "tiny-embedder" / "2" / "model.py"
    text = model_py.read_text()
    model_py.write_text(text[: text.index("    def execute")] + FAULT.lstrip("\n"))
    with TritonAdmin(rel["http"]) as admin:
        admin.load("tiny-embedder")  # Triton reloads version 2 with its changed file


def test_watch_rolls_back_a_regression_within_its_window(home_of):
    """Version 2 starts failing inputs longer than any validated one under traffic (its smoke
    probe still passes); the watch sees the failure rate, rolls back to 1 within the window, and
    version 1 answers every request sent to it throughout."""
    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec

    rel = home_of
    spec = load_spec(rel["spec"])
    released = release_model(spec)  # version 2 again (every step reused), promoted over 1
    assert released["mlflow"]["version"] == "2"
    assert released["watch"]["breaches"] == []  # it passed its smoke test and first look
    _plant_fault(rel)
    seen, traffic = watched_under_traffic(rel["http"], "tiny-embedder", spec, answers_after=10)
    breached = next(s for s in seen if s["breaches"])
    assert breached["champion"] == "2" and breached["in_window"]
    # The first breaching look does not act; the watch looks again and acts on the second.
    acted = next(s for s in seen if s["confirmed"])
    assert (breached["streak"], breached["confirmed"]) == (1, False)
    assert acted["streak"] == spec.watch.confirm_looks == 2 and acted["champion"] == "2"
    assert any("failure rate" in b for b in breached["breaches"]), breached["breaches"]
    assert seen[-1]["champion"] == "1" and not seen[-1]["breaches"]
    assert all("planted fault" in f for f in traffic.failed), traffic.failed[:3]
    assert traffic.answered[-1] == "1"
    assert serving_versions(triton_client(rel["http"]), "tiny-embedder") == ["1"]
    client = _mlflow(rel["home"])
    assert str(client.get_model_version_by_alias("tiny-embedder", "champion").version) == "1"
    why = client.get_model_version("tiny-embedder", "2")
    assert "failure rate" in why.tags["hf2triton.rolled_back"]
    assert "Rolled back to version 1" in why.description


def test_rendered_rules_pass_promtool_and_prometheus_reads_the_p99(home_of, tmp_path):
    """The release wrote its scrape config, rules, rule tests and dashboard (and logged them to
    MLflow); promtool accepts them; a real Prometheus scrapes the tiny Triton with them and the
    release's p99 record returns a number."""
    import shutil
    import time
    import urllib.parse
    import urllib.request

    from tests.conftest import wait_http
    from tests.prefect_fixtures import _start, _stop

    promtool, prometheus = shutil.which("promtool"), shutil.which("prometheus")
    assert promtool and prometheus, "Debian's prometheus package is needed (infra/setup.sh --test)"
    rel = home_of
    written = rel["home"] / "work" / "tiny-embedder" / "monitoring" / "2"
    files = sorted(p.name for p in written.iterdir())
    assert files == [
        "tiny-embedder-grafana.json",
        "tiny-embedder-prometheus.yml",
        "tiny-embedder-rules-test.yml",
        "tiny-embedder-rules.yml",
    ]
    logged = _mlflow(rel["home"]).list_artifacts(rel["second"]["mlflow"]["run_id"], "monitoring")
    assert {Path(a.path).name for a in logged} == set(files)
    for args in (
        ["check", "rules", "tiny-embedder-rules.yml"],
        ["test", "rules", "tiny-embedder-rules-test.yml"],
        ["check", "config", "tiny-embedder-prometheus.yml"],
    ):
        proc = subprocess.run(
            [promtool, *args], cwd=written, capture_output=True, text=True, check=False
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    dashboard = json.loads((written / "tiny-embedder-grafana.json").read_text())
    assert [p["title"] for p in dashboard["panels"]] == [
        "Requests per second",
        "Failed requests (share)",
        "Request latency p50 / p99 (ms)",
        "Queue time per request (ms)",
    ]

    shutil.copy(written / "tiny-embedder-rules.yml", tmp_path)
    shutil.copy(written / "tiny-embedder-prometheus.yml", tmp_path)
    port = free_port()
    server = _start(
        [
            prometheus,
            f"--config.file={tmp_path / 'tiny-embedder-prometheus.yml'}",
            f"--storage.tsdb.path={tmp_path / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
        ],
        os.environ.copy(),
        tmp_path / "prometheus.log",
    )
    try:
        wait_http(f"http://127.0.0.1:{port}/-/ready", timeout=120, proc=server)
        query = urllib.parse.quote('hf2triton:request_p99_ms{model="tiny-embedder"}')
        with Traffic(rel["http"], "tiny-embedder"):
            deadline = time.monotonic() + 120
            while True:
                with urllib.request.urlopen(
                    f"http://127.0.0.1:{port}/api/v1/query?query={query}"
                ) as r:
                    found = json.load(r)["data"]["result"]
                if found or time.monotonic() > deadline:
                    break
                time.sleep(1)
    finally:
        _stop(server)
    assert found, (tmp_path / "prometheus.log").read_text()[-2000:]
    p99 = float(found[0]["value"][1])
    assert found[0]["metric"]["version"] in ("1", "2") and not math.isnan(p99) and p99 > 0


def test_prefect_yaml_declares_the_watch_and_the_rollback_automation():
    everything = yaml.safe_load((ROOT / "prefect.yaml").read_text())["deployments"]
    mine = {d["entrypoint"]: d for d in everything if d["name"] == "minilm-embedder"}
    watch = mine["flows/watch.py:watch_release"]
    assert watch["schedules"][0]["cron"] == "*/15 * * * *"
    assert watch["parameters"]["act"] == "event"
    trigger = mine["flows/watch.py:rollback_release"]["triggers"][0]
    assert trigger["expect"] == ["hf2triton.watch.breach"]
    assert trigger["match"] == {
        "prefect.resource.id": "hf2triton.release.minilm-embedder",
        "hf2triton.in-window": "true",
    }
    assert trigger["parameters"]["only_if_champion"] == "{{ event.resource['hf2triton.version'] }}"
    assert "flows/watch.py:release_status" in mine


def test_prefect_server_runs_the_watch_and_its_automation_rolls_back(
    home_of, prefect_server, tmp_path
):
    """On a real Prefect server and process worker: the watch deployment sees version 2 fail
    under traffic and emits its breach event; the automation prefect.yaml declares for that
    event starts the rollback deployment, which puts version 1 back. The UI's artifact page
    shows the watch's table (HF2TRITON_SCREENSHOT_TO=path keeps the screenshot)."""
    import shutil

    from hf2triton.flows.release import release_model
    from hf2triton.orchestration.deployments import render
    from hf2triton.spec import load_spec
    from tests.prefect_fixtures import (
        BIN,
        _run,
        _start,
        _stop,
        _with_api,
        cancel_open_runs,
        screenshot,
    )

    rel = home_of
    env = {**prefect_server["env"], "HF2TRITON_HOME": str(rel["home"]), "PYTHONPATH": str(ROOT)}
    env.pop("MLFLOW_TRACKING_URI", None)
    prefect_file = tmp_path / "prefect.yaml"
    # The watch deployment allows one run at a time (CANCEL_NEW): its quarter-hourly schedule is
    # paused here and the release runs before the deployments exist (so it watches in-process
    # instead of starting a 600 s run), or either would take the slot and cancel this test's run.
    text = render([rel["spec"]])
    assert "active: true" in text
    prefect_file.write_text(text.replace("active: true", "active: false"))
    assert release_model(load_spec(rel["spec"]))["mlflow"]["version"] == "2"
    _run(
        [
            str(BIN / "prefect"),
            "--no-prompt",
            "deploy",
            "--all",
            "--prefect-file",
            str(prefect_file),
        ],
        env,
    )
    # Runs other modules left open on this session's server (a release's watch run, a schedule's
    # next run) would take this worker first and the watch deployment's one slot.
    cancel_open_runs(env)
    import datetime as dt

    began = dt.datetime.now(dt.UTC)
    _plant_fault(rel)
    client = _mlflow(rel["home"])
    worker = _start(
        [str(BIN / "prefect"), "worker", "start", "--pool", "hf2triton-process"],
        env,
        tmp_path / "worker.log",
    )
    try:
        with Traffic(rel["http"], "tiny-embedder") as traffic:
            _until(lambda: len(traffic.failed) >= 10, "failed requests")
            watch = _run(
                [
                    str(BIN / "prefect"),
                    "deployment",
                    "run",
                    "watch-release/tiny-embedder",
                    "--watch",
                    "--watch-timeout",
                    "400",
                ],
                env,
                timeout=450,
            )
            assert "Completed" in watch.stdout + watch.stderr
            _until(
                lambda: (
                    str(client.get_model_version_by_alias("tiny-embedder", "champion").version)
                    == "1"
                ),
                "the automation's rollback",
                400,
            )
            after = len(traffic.answered)
            _until(lambda: len(traffic.answered) >= after + 10, "answers after it")
    finally:
        _stop(worker)
    assert all("planted fault" in f for f in traffic.failed), traffic.failed[:3]
    assert traffic.answered[-1] == "1"
    assert serving_versions(triton_client(rel["http"]), "tiny-embedder") == ["1"]
    why = client.get_model_version("tiny-embedder", "2").tags["hf2triton.rolled_back"]
    assert why.startswith("watch: ") and "failure rate" in why

    # The rollback deployment's own run did it (started by the automation: nothing else runs it).
    async def rollback_runs():
        from prefect.client.orchestration import get_client
        from prefect.client.schemas.filters import FlowFilter, FlowFilterName

        async with get_client() as api:
            return await api.read_flow_runs(
                flow_filter=FlowFilter(name=FlowFilterName(any_=["rollback-release"]))
            )

    # This test's: started after it began, by the automation (its parameters from the event).
    done = [
        r
        for r in _with_api(env, rollback_runs)
        if r.state.type.value == "COMPLETED"
        and r.start_time
        and r.start_time >= began
        and str(r.parameters.get("only_if_champion")) == "2"
    ]
    assert done, (tmp_path / "worker.log").read_text()[-3000:]

    shot = screenshot(
        f"{prefect_server['ui']}/artifacts/key/tiny-embedder-watch",
        tmp_path / "watch.png",
        tmp_path,
        size="1400,1000",
    )
    assert shot.is_file() and shot.stat().st_size > 20_000
    if os.environ.get("HF2TRITON_SCREENSHOT_TO"):
        shutil.copy(shot, os.environ["HF2TRITON_SCREENSHOT_TO"])
