"""End to end with the `docker` target: the default MiniLM release built into an image offline,
pushed to a real registry, run by digest and smoke-tested; then a second release that replaces it
blue/green, and new images that fail (smoke test, model load) while the first keeps serving."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

from hf2triton.errors import DeployError, SmokeTestError
from hf2triton.kinds.embedding import TorchEmbedder, cosine_rows, resolve_embedding_config
from tests.conftest import ROOT, free_port
from tests.served import read_sentences

pytestmark = pytest.mark.e2e
HF2TRITON = str(Path(sys.executable).parent / "hf2triton")
MODEL = "minilm-embedder"
PREFIX = f"hf2triton-test{os.getpid()}"
LIVE = f"{PREFIX}-{MODEL}"
# Planted in the release's environment, as a scheduled release has them: a hub token, the
# registry's password (this test registry needs none and ignores it) and a model store's secret.
# None may reach the image (test_planted_secrets_are_in_no_image_layer).
SECRETS = {
    "HF_TOKEN": f"hf_planted{os.getpid()}TokenValue",
    "HF2TRITON_REGISTRY_USERNAME": "ci",
    "HF2TRITON_REGISTRY_PASSWORD": f"planted-registry-pw-{os.getpid()}",
    "AWS_SECRET_ACCESS_KEY": f"planted-s3-secret-{os.getpid()}",
}


def _spec(path: Path, ports: dict[str, int], **deploy) -> Path:
    spec = yaml.safe_load((ROOT / "releases" / "minilm-embedder-docker.yaml").read_text())
    spec["validation"]["sentences"] = str(ROOT / "releases" / "data" / "embedding-validation.txt")
    spec["deploy"].update(ports, **deploy)
    # ONNX Runtime's candidates alone (int8, and fp32 behind it): what these tests check is the
    # image, the container and the switch, not OpenVINO's calibration and timing, which were
    # most of the first release's 5.6 min here.
    spec["runtime"] = {"candidates": [{"name": "onnxruntime", "precision": "fp32"}]}
    # The release's own watch compares the new version's p99 under the tests' traffic with the
    # old one's as last seen (idle) and would roll back: the switch is what these tests check.
    spec.setdefault("watch", {})["p99_slack_ms"] = 600_000
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


class DockerRelease:
    def __init__(self, tmp: Path, mlflow_uri: str, docker_env):
        self.tmp, self.mlflow_uri, self.docker_env = tmp, mlflow_uri, docker_env
        self.ports = {
            "http_port": free_port(),
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "openai": {"port": free_port()},
        }
        self.home = tmp / "home"
        self.env = {
            **os.environ,
            "HF2TRITON_HOME": str(self.home),
            "MLFLOW_TRACKING_URI": mlflow_uri,
            "HF2TRITON_CONTAINER_PREFIX": PREFIX,
            **docker_env.env(),
            **SECRETS,
        }
        self.env.pop("PREFECT_API_URL", None)

    def run(self, name: str, **deploy) -> subprocess.CompletedProcess:
        spec = _spec(self.tmp / f"{name}.yaml", self.ports, **deploy)
        return subprocess.run(
            [HF2TRITON, "release", str(spec)],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=1500,
        )

    def rollback(self, spec: str, to: str, reason: str) -> subprocess.CompletedProcess:
        """`hf2triton rollback SPEC --to VERSION`, as a user runs it; asserts it succeeded."""
        done = subprocess.run(
            [HF2TRITON, "rollback", spec, "--to", to, "--reason", reason],
            env=self.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        return done

    def url(self, protocol: str) -> str:
        return f"127.0.0.1:{self.ports[protocol + '_port']}"

    def urls(self) -> dict[str, str]:
        """What clients connect to: the front's HTTP, gRPC and OpenAI API."""
        return {
            "http": self.url("http"),
            "grpc": self.url("grpc"),
            "openai": f"http://127.0.0.1:{self.ports['openai']['port']}/v1",
        }


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


@pytest.fixture(scope="module")
def release(tmp_path_factory, mlflow_server, docker_env):
    """The first release, shared by the module. Only the blue/green test changes what it serves
    (to version 2); every other test checks whichever version is live, so none depends on
    running before or after it."""
    rel = DockerRelease(tmp_path_factory.mktemp("docker-e2e"), mlflow_server, docker_env)
    rel.first = rel.run("first")
    yield rel
    from hf2triton.clients.docker import engine

    client = engine()
    for c in client.containers.list(all=True, filters={"name": PREFIX}):
        c.remove(force=True)
    for n in client.networks.list(names=[f"{LIVE}-net"]):
        n.remove()


@pytest.fixture(scope="module")
def minilm_reference(minilm_dir):
    return TorchEmbedder(minilm_dir, resolve_embedding_config(minilm_dir))


def _mlflow(uri: str):
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _live(client):
    return client.containers.get(LIVE)


def _live_version(client) -> str:
    """The MLflow version the live container serves, from its image's label."""
    return _live(client).attrs["Config"]["Labels"]["org.opencontainers.image.version"]


def test_the_digest_that_runs_is_the_digest_in_mlflow(release, docker_client):
    summary = _summary(release.first)
    image = summary["image"]
    assert image["reference"] == f"{release.docker_env.registry}/{MODEL}@{image['digest']}"
    assert image["tag"] == f"{release.docker_env.registry}/{MODEL}:1-" + image["tag"][-12:]
    mv = _mlflow(release.mlflow_uri).get_model_version(MODEL, "1")
    assert mv.tags["image.digest"] == image["digest"]
    assert mv.tags["image.reference"] == image["reference"]
    # The live container (version 1, or 2 once the blue/green test ran) runs, by digest, the
    # image its MLflow version records.
    live = _live(docker_client)
    reference = (
        _mlflow(release.mlflow_uri)
        .get_model_version(MODEL, _live_version(docker_client))
        .tags["image.reference"]
    )
    assert live.attrs["Config"]["Image"] == reference
    assert reference in docker_client.images.get(live.attrs["Image"]).attrs["RepoDigests"]
    # The registry itself holds that digest under the tag.
    assert (
        docker_client.api.inspect_distribution(image["tag"])["Descriptor"]["digest"]
        == image["digest"]
    )
    assert summary["container"]["container_name"] == LIVE
    # The release's watch looked at the container: its Triton metrics (latency quantiles on)
    # and a smoke probe on the published ports.
    import json

    state = release.home / "watch" / f"{MODEL}.json"
    look = json.loads(state.read_text())["last"] if state.is_file() else None
    assert summary["watch"]["watch"] == "in-process" and summary["watch"]["breaches"] == []
    assert look is not None, sorted(p.name for p in (release.home / "watch").iterdir())
    [row] = look["rows"]
    assert row["endpoint"].startswith("docker container 127.0.0.1:")
    assert row["version"] == _live_version(docker_client)
    assert "probe_error" not in row and row.get("grpc_min_cosine", 0) >= 0.99, row


def test_image_size_is_reported_and_under_1_gb(release):
    summary = _summary(release.first)
    assert 100e6 < summary["image"]["size_bytes"] <= 1e9
    assert "MB; minilm-embedder version 1 carries its digest" in release.first.stderr


def test_image_carries_lineage_labels_and_runs_as_non_root(release, docker_client):
    summary = _summary(release.first)
    img = docker_client.images.get(summary["image"]["reference"])
    labels = img.labels
    assert labels["io.hf2triton.source-id"] == "sentence-transformers/all-MiniLM-L6-v2"
    assert labels["io.hf2triton.content-hash"] == summary["source"]["content_hash"]
    assert labels["io.hf2triton.mlflow.model-name"] == MODEL
    assert labels["io.hf2triton.mlflow.model-version"] == "1"
    assert labels["org.opencontainers.image.version"] == "1"
    assert "/v2/health/ready" in " ".join(img.attrs["Config"]["Healthcheck"]["Test"])
    live = _live(docker_client)
    uid = live.exec_run(["python3", "-c", "import os; print(os.getuid())"]).output.strip()
    assert uid != b"0" and uid.isdigit()
    # The runtime user can read the model but not change it (the live version's folder).
    # The graph file serving.json names (model.onnx, or OpenVINO's model.xml).
    probe = (
        f"import json, os; d='/models/{MODEL}/{_live_version(docker_client)}'; "
        "p=os.path.join(d, json.load(open(os.path.join(d, 'serving.json')))['onnx']); "
        "print(os.access(p, os.R_OK), os.access(p, os.W_OK), os.access(d, os.W_OK))"
    )
    assert live.exec_run(["python3", "-c", probe]).output.strip() == b"True False False"


def test_planted_secrets_are_in_no_image_layer(release, docker_client, tmp_path):
    """`docker save` of the released image: every layer (decompressed), the image config and
    its history are searched for the secrets the release had in its environment."""
    import gzip
    import tarfile

    summary = _summary(release.first)
    saved = tmp_path / "image.tar"
    with open(saved, "wb") as f:
        for chunk in docker_client.images.get(summary["image"]["reference"]).save(
            chunk_size=1 << 20
        ):
            f.write(chunk)
    needles = [v.encode() for k, v in SECRETS.items() if k != "HF2TRITON_REGISTRY_USERNAME"]
    # A control the search must find: the model's config.pbtxt, inside a layer.
    control = f'name: "{MODEL}"'.encode()
    needles.append(control)
    keep = max(len(n) for n in needles)
    found, searched, layers = [], 0, 0
    with tarfile.open(saved) as outer:
        for member in outer:
            if not member.isfile():
                continue
            stream = outer.extractfile(member)
            head = stream.read(2)
            stream.seek(0)
            if head == b"\x1f\x8b":
                stream = gzip.GzipFile(fileobj=stream)
            layers += member.size > 1 << 20
            tail = b""
            for chunk in iter(lambda: stream.read(1 << 20), b""):  # noqa: B023 - read at once
                window = tail + chunk
                found += [(member.name, n.decode()[:12]) for n in needles if n in window]
                tail = window[-keep:]
                searched += len(chunk)
    assert layers >= 2 and searched > 100e6, (layers, searched)  # the whole image was read
    label = control.decode()[:12]
    assert label in {n for _, n in found}, "the search did not find config.pbtxt in any layer"
    leaked = [f for f in found if f[1] != label]
    assert not leaked, f"planted secrets in the image: {leaked}"
    # The same secrets are not in the container's environment either.
    env = _live(docker_client).attrs["Config"]["Env"]
    assert not [e for e in env for n in needles if n != control and n.decode() in e]


def test_healthcheck_reports_healthy(release, docker_client):
    _summary(release.first)
    # Docker's verdict, however long its checks take here: "starting" until one passes (healthy)
    # or the start period and retries are used up (unhealthy). The deadline only stops a hang.
    deadline = time.monotonic() + 900
    health = _live(docker_client).attrs["State"].get("Health", {})
    while health.get("Status") == "starting" and time.monotonic() < deadline:
        time.sleep(2)
        health = _live(docker_client).attrs["State"].get("Health", {})
    assert health.get("Status") == "healthy", health


def test_container_serves_pytorch_embeddings_on_unseen_sentences(
    release, minilm_reference, docker_client
):
    from tests.served import embed_remote

    _summary(release.first)
    heldout = read_sentences(ROOT / "tests" / "data" / "heldout-sentences.txt")[:40]
    served, _ = embed_remote(
        "grpc", release.url("grpc"), MODEL, _live_version(docker_client), heldout
    )
    assert cosine_rows(minilm_reference.embed(heldout), served).min() >= 0.99
    # The same container serves the OpenAI-compatible API (its entrypoint runs Triton as its
    # child), on the spec's port, as the release summary says.
    import openai

    api = _summary(release.first)["endpoint"]["openai"]
    assert api.endswith(f":{release.ports['openai']['port']}/v1")
    got = openai.OpenAI(base_url=api, api_key="unused").embeddings.create(
        model=MODEL, input=heldout
    )
    assert cosine_rows(np.array([d.embedding for d in got.data]), served).min() >= 0.9999


def _logs(client) -> dict[str, str]:
    """The last lines of each container of the release (what a failed switch test shows)."""
    found = client.containers.list(all=True, filters={"name": PREFIX})
    return {c.name: c.logs(tail=25).decode(errors="replace") for c in found}


def _versions(url: str) -> list[str] | None:
    """The versions the server at `url` serves, or None while it does not answer."""
    import urllib.request

    try:
        with urllib.request.urlopen(f"http://{url}/v2/models/{MODEL}", timeout=5) as r:
            return json.loads(r.read())["versions"]
    except OSError:
        return None


def test_second_release_replaces_the_container_blue_green(release, docker_client, minilm_reference):
    """Version 2 replaces version 1 behind the front while clients of every protocol send
    (HTTP, gRPC, the OpenAI API): none sees an error, and once the front switched only version
    2 answers."""
    from tests.served import embed_remote
    from tests.traffic import MixedTraffic

    first = _summary(release.first)
    assert _live_version(docker_client) == "1"
    old_id = _live(docker_client).id
    # One client per protocol with a pause: the release's own steps (an image build among them)
    # share this machine's cores; the 16-client figures come from the switches test below.
    with MixedTraffic(release.urls(), MODEL, clients=3, pause_s=0.1) as traffic:
        release.second = release.run("second", max_queue_delay_us=1000)
        time.sleep(1)
    second = _summary(release.second)
    seen = traffic.summary()
    print(f"second release under traffic: {json.dumps(seen)}")
    assert seen["failed"] == 0, (seen["errors"], _logs(docker_client), release.second.stderr)
    assert seen["requests"] > 30 and all(seen["by_protocol"].values()), seen
    assert second["mlflow"]["version"] == "2"
    assert second["image"]["digest"] != first["image"]["digest"]
    assert second["container"]["previous"]["version"] == "1"
    assert second["container"]["switch_seconds"] == 0.0  # behind the front: no gap
    assert "keeps serving" in release.second.stderr  # the candidate was checked beside the old
    assert "drained in" in release.second.stderr
    # The new container serves version 2, run by the digest MLflow records for it ...
    live = _live(docker_client)
    assert live.attrs["Config"]["Image"] == second["image"]["reference"], release.second.stderr
    assert live.id != old_id
    assert _live_version(docker_client) == "2" and _versions(release.url("http")) == ["2"]
    tags = _mlflow(release.mlflow_uri).get_model_version(MODEL, "2").tags
    assert tags["image.digest"] == second["image"]["digest"]
    texts = ["the new container answers", "thank you"]
    served, _ = embed_remote("http", release.url("http"), MODEL, "2", texts)
    assert cosine_rows(minilm_reference.embed(texts), served).min() >= 0.99
    # ... and the old one is stopped and kept for a rollback; the candidate is gone.
    kept = docker_client.containers.get(f"{LIVE}-rollback")
    assert kept.id == old_id and kept.status == "exited"
    names = {c.name for c in docker_client.containers.list(all=True, filters={"name": PREFIX})}
    assert names == {LIVE, f"{LIVE}-rollback", f"{LIVE}-front"}, "the candidate is removed"
    # What clients saw: version 1, then only version 2 once the front switched.
    versions = [a.version for a in sorted(traffic.log, key=lambda a: a.end) if a.version]
    assert versions[0] == "1" and versions[-1] == "2", versions[:5]
    switched = versions.index("2")
    assert set(versions[:switched]) == {"1"} and set(versions[switched:]) <= {"1", "2"}
    assert set(versions[switched + 10 :]) <= {"2"}, "requests in flight finish; new ones go to 2"


def test_three_switches_under_16_clients_fail_no_request(release, docker_client):
    """`hf2triton rollback --to` back and forth three times (the watch's path too) while 16
    clients send without pause over HTTP, gRPC and the OpenAI API: no request fails, and the
    figures (requests, longest stretch with no answer, latency) are printed for
    docs/reliability.md."""
    from tests.traffic import MixedTraffic

    if f"{LIVE}-rollback" not in {c.name for c in docker_client.containers.list(all=True)}:
        release.second = release.run("second", max_queue_delay_us=1000)
        _summary(release.second)
    spec = str(release.tmp / "second.yaml")
    with MixedTraffic(release.urls(), MODEL, clients=16) as traffic:
        time.sleep(3)
        for _ in range(3):
            kept = docker_client.containers.get(f"{LIVE}-rollback")
            to = kept.labels["io.hf2triton.mlflow.model-version"]
            started = time.time()
            done = release.rollback(spec, to, "switch under traffic")
            assert _live_version(docker_client) == to
            seen = traffic.summary(started, time.time())
            print(f"switch to version {to} under 16 clients: {json.dumps(seen)}")
            assert seen["failed"] == 0, (seen["errors"], _logs(docker_client), done.stderr)
            assert to in seen["versions"] and all(seen["by_protocol"].values()), seen
        time.sleep(2)
    whole = traffic.summary()
    print(f"three switches under 16 clients, whole run: {json.dumps(whole)}")
    assert whole["failed"] == 0 and whole["requests"] > 300, whole


# Planted in the live container by the watch test: version 2's serving code fails some inputs,
# a regression only live traffic shows (its smoke probe still passes).
PLANT = """
import os, pathlib
path = pathlib.Path(os.environ["MODEL_PY"])
text = path.read_text()
path.write_text(text[:text.index("    def execute")] + os.environ["FAULT"])
"""


def test_watch_rolls_back_a_regression_on_docker_then_rollback_by_hand(
    release, docker_client, docker_env, monkeypatch
):
    """Version 2 (promoted by the blue/green test, version 1's container kept stopped) starts
    failing long inputs under live traffic; the watch reads the container's metrics and rolls
    back blue/green to version 1's image within its window: version 1 fails no request, and
    MLflow says why. Then `hf2triton rollback --to 2` goes forward again by hand."""
    from hf2triton.spec import load_spec
    from tests.served import LONG, watched_under_traffic
    from tests.watch.test_watch import FAULT, _until

    if _live_version(docker_client) != "2":  # the blue/green test did not run before this one
        release.second = release.run("second", max_queue_delay_us=1000)
        _summary(release.second)
    assert (
        docker_client.containers.get(f"{LIVE}-rollback").labels["io.hf2triton.mlflow.model-version"]
        == "1"
    )
    live = _live(docker_client)
    # The image warms its model up on long texts at start, so the fault picks the traffic's
    # long texts by their words instead of their length (a regression on one kind of input).
    fault = FAULT.replace(
        "max(len(t[0]) for t in text) > 200", "any(b'prices and markets' in t[0] for t in text)"
    )
    assert fault != FAULT
    done = live.exec_run(
        ["python3", "-c", PLANT],
        user="0",
        environment={"MODEL_PY": f"/models/{MODEL}/2/model.py", "FAULT": fault.lstrip("\n")},
    )
    assert done.exit_code == 0, done.output
    live.restart(timeout=20)  # Triton reads the changed serving code at start
    _until(lambda: _versions(release.url("http")) == ["2"], "the planted version to load")
    for k, v in {
        **docker_env.env(),
        "HF2TRITON_HOME": str(release.home),
        "MLFLOW_TRACKING_URI": release.mlflow_uri,
        "HF2TRITON_CONTAINER_PREFIX": PREFIX,
    }.items():
        monkeypatch.setenv(k, v)
    spec = load_spec(release.tmp / "second.yaml")
    spec = spec.model_copy(
        update={
            "watch": spec.watch.model_copy(
                update={
                    "interval_s": 2.0,
                    "min_requests": 5,
                    "window_s": 3600,
                    "max_failure_rate": 0.05,
                    "p99_slack_ms": 600_000,
                }
            )
        }
    )
    seen, traffic = watched_under_traffic(release.url("http"), MODEL, spec, duration_s=120)
    breached = next(s for s in seen if s["breaches"])
    assert breached["champion"] == "2" and breached["in_window"]
    assert any("failure rate" in b for b in breached["breaches"]), breached["breaches"]
    assert seen[-1]["champion"] == "1" and not seen[-1]["breaches"]
    # Version 1's image serves again, run anew; version 2's container is kept in turn.
    assert _live_version(docker_client) == "1" and _versions(release.url("http")) == ["1"]
    assert (
        docker_client.containers.get(f"{LIVE}-rollback").labels["io.hf2triton.mlflow.model-version"]
        == "2"
    )
    # What clients saw: version 2's planted failures, then the switch behind the front (no
    # connection refused), then version 1 answering every request.
    first_one = next(i for i, (_, _, v, _) in enumerate(traffic.log) if v == "1")
    after = [(v, e) for _, _, v, e in traffic.log[first_one:] if e is not None or v != "1"]
    assert not after, f"{len(after)} answers after version 1's first were not 1's: {after[:5]}"
    gap = [(at, e) for at, _, _, e in traffic.log[:first_one] if e and "planted" not in e]
    assert not gap, f"failed requests other than the planted fault during the switch: {gap[:3]}"
    client = _mlflow(release.mlflow_uri)
    assert str(client.get_model_version_by_alias(MODEL, "champion").version) == "1"
    assert "failure rate" in client.get_model_version(MODEL, "2").tags["hf2triton.rolled_back"]

    # By hand: forward to version 2 again: its image, run anew, has no planted fault.
    forward = release.rollback(str(release.tmp / "second.yaml"), "2", "fixed")
    assert json.loads(forward.stdout)["champion"] == "2"
    assert _live_version(docker_client) == "2"
    from tests.served import embed_remote

    served, _ = embed_remote("http", release.url("http"), MODEL, "2", [LONG])
    assert served.shape[0] == 1


def _tampered_image(release, version: str, mark: str, serving_changes: dict):
    """Build and push an image of the served release with serving.json changed: a bad model."""
    from hf2triton.image import ImageSpec, build_serving_image, image_target, push_serving_image
    from hf2triton.util.workspace import hash_files

    src = next((release.home / "work" / MODEL / "repository").glob(f"*/{MODEL}")).parent
    repo = release.tmp / f"tampered-{mark}"
    shutil.copytree(src, repo)
    serving = repo / MODEL / "1" / "serving.json"
    serving.write_text(json.dumps({**json.loads(serving.read_text()), **serving_changes}))
    files = hash_files(repo)
    files.pop("hf2triton-done.json", None)
    key = mark * 64
    target = image_target(ImageSpec(), MODEL, version, key)
    lineage = {
        "release": MODEL,
        "source_id": "test/tampered",
        "revision": "local",
        "content_hash": key,
        "release_key": key,
        "variant": "fp32",
        "model_name": MODEL,
    }
    build_serving_image(
        {"repository": str(repo), "model_name": MODEL, "files": files}, version, target, lineage
    )
    return push_serving_image(target)["reference"]


def _reference(release) -> str:
    return str(next((release.home / "work" / MODEL / "validate").glob("*/reference.json")))


@pytest.mark.parametrize("case", ["smoke-fails", "model-fails-to-load"])
def test_a_failing_new_image_leaves_the_old_container_serving(
    release, docker_env, docker_client, case, monkeypatch, minilm_reference
):
    from hf2triton.spec import kind_for, load_spec
    from hf2triton.targets.docker import DockerContainers, DockerDeploy
    from hf2triton.tasks.deploy import _check
    from tests.served import embed_remote

    _summary(release.first)
    version = _live_version(docker_client)  # 1, or 2 once the blue/green test ran
    monkeypatch.setenv("HF2TRITON_CONTAINER_PREFIX", PREFIX)
    for k, v in docker_env.env().items():
        monkeypatch.setenv(k, v)
    live_before = _live(docker_client).id
    # CLS pooling serves embeddings unlike PyTorch's mean pooling; an unknown pooling makes the
    # model's initialize() raise, so Triton exits at start.
    changes = {"pooling": "cls"} if case == "smoke-fails" else {"pooling": "bogus"}
    reference = _tampered_image(release, version, "9" if case == "smoke-fails" else "8", changes)
    deploy = DockerDeploy(target="docker", host="127.0.0.1", ready_timeout_s=120, **release.ports)
    kind = kind_for(load_spec(release.tmp / "first.yaml"))
    expected = SmokeTestError if case == "smoke-fails" else DeployError
    target = DockerContainers(deploy, MODEL)
    with pytest.raises(expected, match=f"{LIVE} \\(version {version}\\) keeps serving"):
        target.deploy(
            "",
            MODEL,
            version,
            {},
            {"reference": reference},
            _check(target, kind, MODEL, _reference(release)),
        )
    assert _live(docker_client).id == live_before
    names = {c.name for c in docker_client.containers.list(all=True, filters={"name": PREFIX})}
    assert names - {f"{LIVE}-rollback", f"{LIVE}-front"} == {LIVE}, "the failed candidate is gone"
    texts = ["the old container still answers", "thank you"]
    served, _ = embed_remote("http", release.url("http"), MODEL, version, texts)
    assert cosine_rows(minilm_reference.embed(texts), served).min() >= 0.99
