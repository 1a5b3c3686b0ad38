"""The image steps on their own: the spec's image section, the tag, credentials, and build and push
against a real Docker engine and real registries (one open, one with htpasswd auth, one absent)."""

from __future__ import annotations

import json
import logging
import subprocess
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

from hf2triton import image as image_step
from hf2triton.clients import docker as engine_client
from hf2triton.clients.credentials import REGISTRY_PASSWORD, REGISTRY_USERNAME, RegistryCredentials
from hf2triton.errors import (
    DockerUnavailableError,
    ImageBuildError,
    RegistryAuthError,
    RegistryUnavailableError,
    SpecError,
    is_retryable,
)
from hf2triton.image import ImageSpec
from hf2triton.image import build as image_build
from hf2triton.spec import parse_spec
from hf2triton.tasks.image import release_image
from tests.conftest import ROOT, free_port, write_spec

PASSWORD = "s3cret-Registry-pw"


def _spec(**image) -> dict:
    import yaml

    data = yaml.safe_load((ROOT / "releases" / "minilm-embedder.yaml").read_text())
    data["image"] = image
    return data


@pytest.mark.parametrize(
    "image, problem",
    [
        ({"registry": "http://reg:5000"}, "'image.registry' = 'http://reg:5000'"),
        ({"repository": "Team/Embedder"}, "'image.repository' = 'Team/Embedder'"),
        ({"build": "sometimes"}, "'image.build"),
        ({"colour": "blue"}, "unknown key 'image.colour'"),
    ],
)
def test_bad_image_section_names_the_key(image, problem):
    with pytest.raises(SpecError, match=problem.replace("(", r"\(").replace(".", r"\.")):
        parse_spec(_spec(**image), ROOT / "releases")


def test_docker_target_cannot_turn_the_image_off():
    data = _spec(build=False)
    data["deploy"]["target"] = "docker"
    with pytest.raises(SpecError, match="deploy.target 'docker' .* image.build cannot be false"):
        parse_spec(data, ROOT / "releases")


def test_default_and_docker_release_specs_load():
    from hf2triton.spec import load_spec

    default = load_spec(ROOT / "releases" / "minilm-embedder.yaml")
    assert default.image.build == "auto" and default.deploy.target == "local-triton"
    docker = load_spec(ROOT / "releases" / "minilm-embedder-docker.yaml")
    assert docker.deploy.target == "docker" and docker.image.build is True
    assert docker.image_repository == "minilm-embedder"


def test_tag_carries_name_version_and_short_content_hash(monkeypatch):
    monkeypatch.delenv("HF2TRITON_REGISTRY", raising=False)
    monkeypatch.delenv("HF2TRITON_BASE_IMAGE", raising=False)
    key = "0123456789abcdef" * 4
    target = image_step.image_target(
        ImageSpec(registry="reg.example:5000"), "my-embedder", "7", key
    )
    assert target["tag"] == "reg.example:5000/my-embedder:7-0123456789ab"
    assert target["base_image"] == "python:3.11-slim-bookworm" and target["python"] == "3.11"
    gpu = image_step.image_target(ImageSpec(), "my-embedder", "7", key, "gpu")
    assert gpu["base_image"] == "python:3.12-slim-bookworm" and gpu["python"] == "3.12"
    monkeypatch.setenv("HF2TRITON_REGISTRY", "127.0.0.1:5999")
    monkeypatch.setenv("HF2TRITON_BASE_IMAGE", "local/base:1")
    target = image_step.image_target(ImageSpec(), "my-embedder", "7", key)
    assert target["tag"].startswith("127.0.0.1:5999/my-embedder:7-")
    assert target["base_image"] == "local/base:1"
    # The environment is held to what the spec's image.registry is.
    monkeypatch.setenv("HF2TRITON_REGISTRY", "https://reg.example:5000")
    with pytest.raises(SpecError, match="HF2TRITON_REGISTRY='https://reg.example:5000' is not a"):
        image_step.image_target(ImageSpec(), "my-embedder", "7", key)


def test_credentials_from_env_or_a_prefect_block(monkeypatch):
    monkeypatch.delenv(REGISTRY_USERNAME, raising=False)
    monkeypatch.delenv(REGISTRY_PASSWORD, raising=False)
    assert image_step.registry_auth(ImageSpec(), "r:5000") is None
    monkeypatch.setenv(REGISTRY_USERNAME, "ci")
    with pytest.raises(
        RegistryAuthError,
        match=f"{REGISTRY_PASSWORD} is not set, but "
        f"{REGISTRY_USERNAME} is: set {REGISTRY_USERNAME} and {REGISTRY_PASSWORD}",
    ):
        image_step.registry_auth(ImageSpec(), "r:5000")
    monkeypatch.setenv(REGISTRY_PASSWORD, PASSWORD)
    assert image_step.registry_auth(ImageSpec(), "r:5000") == {
        "username": "ci",
        "password": PASSWORD,
        "serveraddress": "r:5000",
    }
    RegistryCredentials(username="blockuser", password="block-pw").save(
        "test-registry", overwrite=True
    )
    auth = image_step.registry_auth(ImageSpec(credentials_block="test-registry"), "r:5000")
    assert auth["username"] == "blockuser" and auth["password"] == "block-pw"
    with pytest.raises(RegistryAuthError, match="image.credentials_block 'nope': no saved"):
        image_step.registry_auth(ImageSpec(credentials_block="nope"), "r:5000")
    # A saved block wins over the environment, and neither is echoed in the block's repr.
    assert "block-pw" not in repr(RegistryCredentials.load("test-registry"))


@pytest.fixture()
def answering(tmp_path):
    """A registry stand-in on loopback that answers the v2 API root with a given status (a fault
    no real registry can be asked to produce on demand)."""
    import http.server
    import threading

    status = {"code": 200}

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            self.send_response(status["code"])
            if status["code"] == 401:
                self.send_header("WWW-Authenticate", 'Basic realm="test"')
            self.end_headers()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}", status
    server.shutdown()


def test_registry_failures_are_classified_by_status_code(answering):
    registry, status = answering
    auth = RegistryCredentials(username="ci", password="pw").auth_config(registry)
    status["code"] = 503
    with pytest.raises(RegistryUnavailableError) as busy:
        engine_client.check_credentials(registry, auth)
    assert is_retryable(busy.value) and "HTTP 503" in str(busy.value)
    status["code"] = 401
    with pytest.raises(RegistryAuthError) as refused:
        engine_client.check_credentials(registry, auth)
    assert not is_retryable(refused.value) and "'ci'" in str(refused.value)
    with pytest.raises(RegistryAuthError, match="needs credentials"):
        engine_client.check_credentials(registry, None)
    status["code"] = 200
    engine_client.check_credentials(registry, None)  # an open registry takes anyone
    with pytest.raises(RegistryUnavailableError, match="did not answer"):
        engine_client.check_credentials(f"127.0.0.1:{free_port()}", None)


# ---- against the real engine and registries ------------------------------------------------


@pytest.fixture(scope="module")
def auth_registry(tmp_path_factory, docker_env):
    """A second real registry that demands a user and password (htpasswd, bcrypt)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

    root = tmp_path_factory.mktemp("auth-registry")
    (root / "htpasswd").write_text(
        f"ci:{crypt.crypt(PASSWORD, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"
    )
    port = free_port()
    (root / "config.yml").write_text(
        "version: 0.1\nlog: {level: warn}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
        f"http: {{addr: 127.0.0.1:{port}}}\n"
        f"auth: {{htpasswd: {{realm: hf2triton-test, path: {root / 'htpasswd'}}}}}\n"
    )
    log = open(root / "registry.log", "wb")
    proc = subprocess.Popen(
        ["docker-registry", "serve", str(root / "config.yml")], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + 30
        while engine_client.registry_answers(f"127.0.0.1:{port}") is not None:
            assert proc.poll() is None and time.monotonic() < deadline, (
                root / "registry.log"
            ).read_text()
            time.sleep(0.3)
        yield f"127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(20)
        log.close()


@pytest.fixture(scope="module")
def tiny_image(docker_client, tmp_path_factory) -> str:
    """A one-file image built FROM scratch: pushes in a moment, needs no base."""
    ctx = tmp_path_factory.mktemp("tiny-image")
    (ctx / "hello.txt").write_text("hello\n")
    (ctx / "Dockerfile").write_text("FROM scratch\nCOPY hello.txt /\n")
    image, _ = docker_client.images.build(path=str(ctx), tag="hf2triton-test/tiny:1", rm=True)
    return image.id


def _tagged(docker_client, tiny_image: str, registry: str, name: str) -> image_step.ImageTarget:
    tag = f"{registry}/{name}:1-abc"
    docker_client.images.get(tiny_image).tag(tag)
    return image_step.ImageTarget(
        registry=registry, repository=f"{registry}/{name}", base_image="scratch", tag=tag
    )


def test_push_needs_the_right_credentials_and_never_logs_them(
    auth_registry, tiny_image, docker_client, monkeypatch, caplog
):
    caplog.set_level(logging.DEBUG)
    target = _tagged(docker_client, tiny_image, auth_registry, "auth-check")
    monkeypatch.delenv(REGISTRY_USERNAME, raising=False)
    monkeypatch.delenv(REGISTRY_PASSWORD, raising=False)
    with pytest.raises(RegistryAuthError) as none_given:
        image_step.push_serving_image(target)
    assert not is_retryable(none_given.value)
    monkeypatch.setenv(REGISTRY_USERNAME, "ci")
    monkeypatch.setenv(REGISTRY_PASSWORD, "wrong-" + PASSWORD)
    with pytest.raises(RegistryAuthError) as wrong:
        image_step.push_serving_image(target)
    assert PASSWORD not in str(wrong.value)
    monkeypatch.setenv(REGISTRY_PASSWORD, PASSWORD)
    pushed = image_step.push_serving_image(target)
    assert pushed["digest"].startswith("sha256:") and pushed["reference"].endswith(pushed["digest"])
    assert PASSWORD not in caplog.text and "image: pushed" in caplog.text


def test_push_to_a_registry_that_does_not_answer_is_transient(tiny_image, docker_client):
    target = _tagged(docker_client, tiny_image, f"127.0.0.1:{free_port()}", "nowhere")
    with pytest.raises(RegistryUnavailableError) as err:
        image_step.push_serving_image(target)
    assert is_retryable(err.value)


def test_prerequisites_say_what_is_missing(docker_env, monkeypatch):
    monkeypatch.setenv("HF2TRITON_BASE_IMAGE", docker_env.base_image)
    ok = image_step.image_target(ImageSpec(registry=docker_env.registry), "x", "1", "a" * 64)
    assert image_step.check_prerequisites(ok) is None
    nowhere = image_step.image_target(
        ImageSpec(registry=f"127.0.0.1:{free_port()}"), "x", "1", "a" * 64
    )
    assert "no registry answers" in image_step.check_prerequisites(nowhere)
    monkeypatch.setenv("HF2TRITON_BASE_IMAGE", "hf2triton-test/no-such-base:1")
    missing = image_step.image_target(ImageSpec(registry=docker_env.registry), "x", "1", "a" * 64)
    why = image_step.check_prerequisites(missing)
    assert "no-such-base:1 is not on this engine and cannot be pulled" in why
    assert "HF2TRITON_BASE_IMAGE" in why


def test_auto_skips_the_image_and_says_why_while_docker_target_fails(docker_env, monkeypatch):
    monkeypatch.setenv("HF2TRITON_REGISTRY", f"127.0.0.1:{free_port()}")
    spec = parse_spec(_spec(build="auto"), ROOT / "releases")
    reg = {"model_name": "m", "version": "1"}
    record = {"release_key": "a" * 64, "lineage": {}}
    out = release_image(spec, {"repository": "/nonexistent", "files": {}}, reg, record)
    assert "no registry answers" in out["skipped"]
    data = _spec(build=True)
    data["deploy"]["target"] = "docker"
    with pytest.raises(DockerUnavailableError, match="needs its image .deploy.target is docker"):
        release_image(
            parse_spec(data, ROOT / "releases"),
            {"repository": "/nonexistent", "files": {}},
            reg,
            record,
        )


def _tiny_repository(root: Path) -> tuple[str, dict[str, str]]:
    from hf2triton.util.workspace import hash_files

    (root / "m" / "1").mkdir(parents=True)
    (root / "m" / "config.pbtxt").write_text('name: "m"\nbackend: "python"\n')
    (root / "m" / "1" / "model.py").write_text("# not served in this test\n")
    return str(root), hash_files(root)


def _repo(repository: str, files: dict[str, str]) -> dict:
    """The repository step's record of model `m` (what the image step is given)."""
    return {"repository": repository, "model_name": "m", "files": files}


LINEAGE = {
    "release": "m",
    "source_id": "t/m",
    "revision": "local",
    "content_hash": "c" * 64,
    "release_key": "k" * 64,
    "variant": "fp32",
    "model_name": "m",
}


def test_an_error_in_the_build_stream_raises(docker_env, serving_wheelhouse, tmp_path, monkeypatch):
    broken = tmp_path / "Dockerfile"
    broken.write_text("ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN echo building && exit 3\n")
    monkeypatch.setattr(image_build, "DOCKERFILE", broken)
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    repo, files = _tiny_repository(tmp_path / "repo")
    target = image_step.ImageTarget(
        registry=docker_env.registry,
        repository=f"{docker_env.registry}/m",
        base_image=docker_env.base_image,
        tag=f"{docker_env.registry}/m:1-kkkk",
    )
    with pytest.raises(ImageBuildError, match="returned a non-zero code: 3") as err:
        image_step.build_serving_image(_repo(repo, files), "1", target, LINEAGE)
    assert "building" in str(err.value)  # the last build output comes with the error
    assert not is_retryable(err.value)


def test_build_is_offline_and_refuses_a_tampered_repository(
    docker_env, serving_wheelhouse, tmp_path, monkeypatch
):
    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF2TRITON_BASE_IMAGE", docker_env.base_image)
    repo, files = _tiny_repository(tmp_path / "repo")
    (Path(repo) / "m" / "1" / "model.py").write_text("# changed after it was recorded\n")
    target = image_step.image_target(ImageSpec(registry=docker_env.registry), "m", "1", "k" * 64)
    with pytest.raises(Exception, match="do not match the sha256 recorded"):
        image_step.build_serving_image(_repo(repo, files), "1", target, LINEAGE)
    # No RUN step of the build can reach the network: the Dockerfile's steps get none.
    probe = tmp_path / "Dockerfile"
    probe.write_text(
        'ARG BASE_IMAGE\nFROM ${BASE_IMAGE}\nRUN python3 -c "import socket; '
        "socket.create_connection(('deb.debian.org', 80), 5)\"\n"
    )
    monkeypatch.setattr(image_build, "DOCKERFILE", probe)
    repo, files = _tiny_repository(tmp_path / "repo2")
    with pytest.raises(ImageBuildError, match="non-zero code") as err:
        image_step.build_serving_image(_repo(repo, files), "1", target, LINEAGE)
    assert "deb.debian.org" in str(err.value)


def test_wheelhouse_is_cached_and_holds_the_pinned_serving_wheels(serving_wheelhouse):
    names = {p.name.split("-")[0].lower() for p in serving_wheelhouse.glob("*.whl")}
    assert {"nvidia_pytriton", "onnxruntime", "tokenizers", "numpy"} <= names
    assert any(p.name.startswith("numpy-1.") for p in serving_wheelhouse.glob("*.whl"))
    assert image_step.ensure_wheelhouse() == serving_wheelhouse  # the second call downloads nothing
    assert not any(serving_wheelhouse.parent.glob(".*.tmp"))


def test_registry_answers_over_http_on_loopback(docker_env):
    with urllib.request.urlopen(f"http://{docker_env.registry}/v2/", timeout=5) as r:
        assert r.status == 200


# ---- the rendered Dockerfile: checked here, built only where there are GPUs and 1.6 GB to fetch --

HF2TRITON = str(ROOT / ".venv" / "bin" / "hf2triton")
SERVING_SITE = next((ROOT / ".venv-serving" / "lib").glob("python3.*/site-packages"))
# Planted in the render's environment: none may reach what it writes.
SECRETS = {
    "HF_TOKEN": "hf_renderSecret0123",
    "HF2TRITON_REGISTRY_PASSWORD": PASSWORD,
    "AWS_SECRET_ACCESS_KEY": "aws-render-secret-4567",
}


def _rendered(tmp_path: Path, **overrides) -> tuple[Path, list[dict]]:
    """`hf2triton image render` of the default spec with overrides, as a user runs it: the
    context directory and the Dockerfile's instructions as a Dockerfile parser reads them."""
    import os

    from dockerfile_parse import DockerfileParser

    tmp_path.mkdir(parents=True, exist_ok=True)
    spec = write_spec(tmp_path / "spec.yaml", **overrides)
    out = tmp_path / "context"
    proc = subprocess.run(
        [HF2TRITON, "image", "render", str(spec), "--output", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **SECRETS},
    )
    assert proc.returncode == 0, proc.stderr
    for secret in SECRETS.values():
        assert secret not in proc.stdout + proc.stderr
        for path in out.rglob("*"):
            assert not path.is_file() or secret not in path.read_text(), path
    return out, DockerfileParser(path=str(out / "Dockerfile")).structure


def _runs(structure: list[dict]) -> list[str]:
    return [i["value"] for i in structure if i["instruction"] == "RUN"]


def _stages(structure: list[dict]) -> list[list[dict]]:
    stages: list[list[dict]] = []
    for instruction in structure:
        if instruction["instruction"] == "FROM":
            stages.append([])
        if stages:
            stages[-1].append(instruction)
    return stages


def _requirements(path: Path) -> dict[str, str]:
    import re

    return dict(re.split(r"==", line) for line in path.read_text().split())


def test_a_gpu_spec_renders_the_gpu_image_installed_like_the_cpu_image(tmp_path):
    import re

    cpu, cpu_df = _rendered(tmp_path / "cpu")
    gpu, gpu_df = _rendered(tmp_path / "gpu", deploy__device="gpu", deploy__gpu_gate="cpu-numerics")
    # onnxruntime-gpu with its CUDA 13 libraries at the pinned ORT version, in place of
    # onnxruntime, and every other serving package pinned as in the CPU image.
    cpu_pins, gpu_pins = (_requirements(d / "wheelhouse" / "runtime.txt") for d in (cpu, gpu))
    assert gpu_pins.pop("onnxruntime-gpu[cuda,cudnn]") == cpu_pins.pop("onnxruntime") == "1.31.1"
    assert gpu_pins == cpu_pins
    assert (gpu / "wheelhouse" / "triton.txt").read_text() == (
        cpu / "wheelhouse" / "triton.txt"
    ).read_text()

    # ... installed the same way: offline, from the wheelhouse only, by the same instruction.
    def installs(structure: list[dict]) -> list[str]:
        return [
            " ".join(cmd.split())
            for run in _runs(structure)
            for cmd in re.findall(r"pip install [^&]*", run)
        ]

    assert installs(gpu_df) == installs(cpu_df) and len(installs(gpu_df)) == 2
    assert all("--no-index --find-links /wheelhouse" in cmd for cmd in installs(gpu_df))
    assert "-r /wheelhouse/runtime.txt" in installs(gpu_df)[0]
    for run in _runs(gpu_df):
        assert not any(word in run.split() for word in ("curl", "wget", "apt-get", "git")), run
    assert not [i for i in gpu_df if i["instruction"] == "ADD"]
    # A CUDA-capable image: the CUDA libraries are on the linker's path, ONNX Runtime's CUDA
    # provider is checked to resolve against them, and the NVIDIA container toolkit is asked
    # for the GPUs; the CPU image has none of it.
    build, final = _stages(gpu_df)
    assert any("nvidia/*/lib" in i["value"] for i in build if i["instruction"] == "RUN")
    assert any("ldconfig" in r and "libonnxruntime_providers_cuda.so" in r for r in _runs(final))
    env = " ".join(i["value"] for i in final if i["instruction"] == "ENV")
    assert "NVIDIA_VISIBLE_DEVICES=all" in env and "NVIDIA_DRIVER_CAPABILITIES=compute" in env
    assert "NVIDIA" not in (cpu / "Dockerfile").read_text().replace("nvidia-pytriton", "").replace(
        "nvidia_pytriton", ""
    )
    # It still runs as the unprivileged user, on the base given as a build argument.
    assert [i["value"] for i in final if i["instruction"] == "USER"][-1] == "triton:triton"
    assert [i["value"] for i in gpu_df if i["instruction"] == "FROM"] == [
        "${BASE_IMAGE} AS build",
        "${BASE_IMAGE}",
    ]
    assert json.loads((gpu / "build-args.json").read_text()) == {
        "BASE_IMAGE": "python:3.12-slim-bookworm"
    }


def test_the_gpu_image_serves_the_model_on_gpu_instances(tmp_path):
    """The model config the GPU image carries: KIND_GPU instances (the repository step renders
    it; the image copies the repository as it is)."""
    from hf2triton.kinds.embedding import EmbeddingConfig
    from hf2triton.release.repository import BATCHING, render_config
    from hf2triton.spec import kind_for

    spec = parse_spec(
        __import__("yaml").safe_load(
            write_spec(
                tmp_path / "s.yaml",
                deploy__device="gpu",
                deploy__gpu_gate="cpu-numerics",
                deploy__gpus=[0],
            ).read_text()
        ),
        ROOT / "releases",
    )
    config = render_config(
        kind_for(spec),
        "m",
        EmbeddingConfig(pooling="mean", normalize=True, max_length=16),
        {"embedding_dim": 8},
        {k: getattr(spec.deploy, k) for k in BATCHING},
        "",
    )
    assert "kind: KIND_GPU\n    gpus: [ 0 ]" in config and "KIND_CPU" not in config


@pytest.mark.parametrize(
    "overrides, python",
    [
        ({}, "3.11"),
        ({"deploy__device": "gpu", "deploy__gpu_gate": "cpu-numerics"}, "3.12"),
        ({"image__base_image": "python:3.12-slim-bookworm"}, "3.12"),
        (
            {
                "deploy__device": "gpu",
                "deploy__gpu_gate": "cpu-numerics",
                "image__base_image": "registry.example/cuda-py:13",
                "image__python": "3.11",
            },
            "3.11",
        ),
    ],
)
def test_the_python_backend_stub_follows_the_image_python(tmp_path, overrides, python):
    import re

    out, structure = _rendered(tmp_path, **overrides)
    runs = " ".join(_runs(structure))
    stubs = re.findall(r"python_backend_stubs/([0-9.]+)/triton_python_backend_stub", runs)
    assert stubs == [python]
    # The build stops, saying so, on a base whose python3 is another version.
    assert f'if [ "$have" != "{python}" ]' in runs
    # The Triton wheel has that stub where the Dockerfile copies it from.
    assert (
        SERVING_SITE
        / "pytriton"
        / "tritonserver"
        / "python_backend_stubs"
        / python
        / "triton_python_backend_stub"
    ).is_file()
    # And the wheelhouse is downloaded for that Python.
    from hf2triton.image.wheelhouse import pip_platform

    assert pip_platform(python)[:7] == [
        "--only-binary=:all:",
        "--python-version",
        python,
        "--implementation",
        "cp",
        "--abi",
        "cp" + python.replace(".", ""),
    ]


def test_an_image_python_without_a_triton_stub_or_unquoted_is_refused():
    with pytest.raises(SpecError, match="'image.python' = '3.7'"):
        parse_spec(_spec(python="3.7"), ROOT / "releases")
    with pytest.raises(SpecError, match="write the version quoted, e.g. '3.12'"):
        parse_spec(_spec(python=3.12), ROOT / "releases")


def test_the_gpu_image_wheels_resolve_for_its_platform(tmp_path):
    """pip resolves the GPU image's requirements for CPython 3.12 on manylinux from the package
    index, reading metadata only (the wheels themselves are 1.6 GB): every pin exists for the
    image's platform, and the CUDA 13 libraries come with onnxruntime-gpu."""
    import sys

    from hf2triton.image import VARIANTS
    from hf2triton.image.wheelhouse import pip_platform, serving_requirements

    triton, runtime = serving_requirements(VARIANTS["gpu"])
    report = tmp_path / "report.json"
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--dry-run",
            "--quiet",
            "--ignore-installed",
            "--disable-pip-version-check",
            "--target",
            str(tmp_path / "t"),
            "--report",
            str(report),
            *pip_platform("3.12"),
            *runtime,
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    names = {
        i["metadata"]["name"].lower(): i["metadata"]["version"]
        for i in json.loads(report.read_text())["install"]
    }
    assert names["onnxruntime-gpu"] == "1.31.1" and "onnxruntime" not in names
    assert names["nvidia-cudnn-cu13"].startswith("9.")
    assert {"nvidia-cuda-runtime", "nvidia-cublas"} <= set(names)
    assert names["nvidia-cuda-runtime"].startswith("13.")


class Registry:
    """An open `docker-registry` of the test's own on a fixed port and storage, that can be
    killed and started again (the same data) like a registry host that restarts."""

    def __init__(self, root: Path):
        self.root, self.port = root, free_port()
        self.url = f"127.0.0.1:{self.port}"
        (root / "config.yml").write_text(
            "version: 0.1\nlog: {level: warn}\n"
            f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}}}\n"
            f"http: {{addr: {self.url}}}\n"
        )
        self.proc = None

    def start(self) -> None:
        log = open(self.root / "registry.log", "ab")
        self.proc = subprocess.Popen(
            ["docker-registry", "serve", str(self.root / "config.yml")],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + 30
        while engine_client.registry_answers(self.url) is not None:
            assert self.proc.poll() is None and time.monotonic() < deadline, (
                self.root / "registry.log"
            ).read_text()
            time.sleep(0.1)

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(20)

    def uploading(self) -> bool:
        return any((self.root / "data").glob("docker/registry/v2/repositories/*/_uploads/*"))


@pytest.fixture()
def own_registry(tmp_path, docker_env):
    registry = Registry(tmp_path)
    registry.start()
    yield registry
    if registry.proc.poll() is None:
        registry.kill()


def test_registry_down_during_push_is_retried_then_one_clear_error(
    own_registry, docker_client, tmp_path
):
    """The registry is killed in the middle of a push (a 96 MB layer on its way): the push step
    retries; the registry back in time, the push completes and the registry holds the image
    under the digest the step returns; a registry that stays down ends the step in one error
    naming it, after the retries (nothing after the push runs: the serving version is never
    touched by it)."""
    import os
    import threading

    from prefect import flow

    from hf2triton.tasks.image import push_image

    def big_image(n: int) -> str:  # a layer the registry does not hold yet
        ctx = tmp_path / f"big-image-{n}"
        ctx.mkdir()
        (ctx / "weights.bin").write_bytes(os.urandom(96 * 1024 * 1024))
        (ctx / "Dockerfile").write_text("FROM scratch\nCOPY weights.bin /\n")
        built, _ = docker_client.images.build(path=str(ctx), tag=f"hf2triton-test/big:{n}", rm=True)
        return built.id

    target = _tagged(docker_client, big_image(1), own_registry.url, "outage")
    spec = parse_spec(
        {
            "name": "x",
            "source": {"path": "/m"},
            "validation": {"sentences": "/s"},
            "registry": {"model_name": "x"},
        }
    )

    @flow(name="push-during-outage")
    def push() -> dict:
        return push_image(target, spec)

    killed = threading.Event()
    mid_upload: list[bool] = []  # per outage: was a layer on its way when the registry died

    def outage(back_after_s: float | None) -> None:
        deadline = time.monotonic() + 60
        while not (seen := own_registry.uploading()) and time.monotonic() < deadline:
            time.sleep(0.002)
        mid_upload.append(seen)
        own_registry.kill()
        killed.set()
        if back_after_s is not None:
            time.sleep(back_after_s)
            own_registry.start()

    # Back in time: down for 3 s in the middle of the upload; the retry finishes the push.
    thread = threading.Thread(target=outage, args=(3.0,), daemon=True)
    thread.start()
    pushed = push()
    assert killed.is_set(), "the registry went down before the push finished"
    thread.join(60)
    assert mid_upload == [True], "the registry was killed in the middle of an upload"
    with urllib.request.urlopen(
        urllib.request.Request(
            f"http://{own_registry.url}/v2/outage/manifests/{pushed['digest']}",
            method="HEAD",
            headers={"Accept": "application/vnd.docker.distribution.manifest.v2+json"},
        )
    ) as got:
        assert got.status == 200
    assert pushed["reference"] == f"{own_registry.url}/outage@{pushed['digest']}"

    # Stays down: one error naming the registry, once the retries are spent.
    target = _tagged(docker_client, big_image(2), own_registry.url, "outage-2")
    killed.clear()
    mid_upload.clear()
    thread = threading.Thread(target=outage, args=(None,), daemon=True)
    thread.start()
    with pytest.raises(RegistryUnavailableError) as down:
        push()
    assert killed.is_set()
    thread.join(60)
    assert mid_upload == [True], "the registry was killed in the middle of an upload"
    assert own_registry.url in str(down.value) and "\n" not in str(down.value)


def test_a_build_context_that_cannot_be_written_is_one_error_line(tmp_path):
    spec = write_spec(tmp_path / "spec.yaml")
    afile = tmp_path / "afile"
    afile.write_text("not a folder\n")
    proc = subprocess.run(
        [HF2TRITON, "image", "render", str(spec), "--output", str(afile)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"hf2triton: error: cannot write the build context into {afile}: Not a directory"
    ]
    assert afile.read_text() == "not a folder\n"
