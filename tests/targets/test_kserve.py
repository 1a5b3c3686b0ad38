"""Kubernetes and KServe manifests of a release, and the `kserve` deploy target.

There is no Kubernetes cluster here: the manifests are checked against the Kubernetes client's
models (a round trip through `ApiClient` that must lose no field) and the InferenceService against
the KServe SDK's models; the apply path is tested only for its clear error when no cluster is
configured.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import types
from pathlib import Path

import pytest

from hf2triton.errors import DeployError, SpecError
from hf2triton.spec import parse_spec
from hf2triton.targets import k8s
from hf2triton.targets.kserve import KServe, KServeDeploy, KubernetesSpec

ROOT = Path(__file__).resolve().parents[2]
KSERVE_SDK = ROOT / ".cache" / "kserve-sdk"
# What hf2triton/image.py's PushResult records for a pushed release image.
PUSHED = {
    "tag": "127.0.0.1:5000/tiny-embedder:3-0123456789ab",
    "digest": "sha256:" + "ab" * 32,
    "reference": "127.0.0.1:5000/tiny-embedder@sha256:" + "ab" * 32,
}
STORE = "s3://models/hf2triton/3/triton_repository"


def _render(openai=None, **kube) -> dict:
    return k8s.render(
        k8s.Served("tiny-embedder", "tiny-embedder", "3", PUSHED["reference"], STORE),
        KubernetesSpec(namespace="serving", **kube),
        openai,
    )


def test_rendered_manifests_are_valid_kubernetes_objects_pinned_to_the_digest():
    objs = _render(min_replicas=2, max_replicas=6, target_cpu_utilization=60)
    k8s.check_manifests(objs)  # raises on any field the Kubernetes models cannot read

    dep = objs["Deployment"]
    pod = dep["spec"]["template"]["spec"]
    (triton,) = pod["containers"]
    assert triton["image"] == PUSHED["reference"]
    assert dep["metadata"]["annotations"]["hf2triton.io/image-digest"] == PUSHED["digest"]
    assert triton["readinessProbe"]["httpGet"] == {"path": "/v2/health/ready", "port": "http"}
    assert triton["livenessProbe"]["httpGet"] == {"path": "/v2/health/live", "port": "http"}
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert {p["name"]: p["port"] for p in objs["Service"]["spec"]["ports"]} == {
        "http": 8000,
        "grpc": 8001,
        "metrics": 8002,
        "openai": 9000,
    }
    hpa = objs["HorizontalPodAutoscaler"]["spec"]
    assert (hpa["minReplicas"], hpa["maxReplicas"]) == (2, 6)
    assert hpa["metrics"][0]["resource"]["target"]["averageUtilization"] == 60
    assert hpa["scaleTargetRef"]["name"] == dep["metadata"]["name"]

    model = objs["InferenceService"]["spec"]["predictor"]["model"]
    assert model["storageUri"] == STORE
    assert model["image"] == PUSHED["reference"]
    assert model["modelFormat"] == {"name": "triton"}
    assert model["readinessProbe"]["httpGet"]["path"] == "/v2/health/ready"
    assert "--strict-readiness=true" in model["args"]


def test_every_workload_runs_the_openai_compatible_api_beside_triton(monkeypatch):
    """The image's API (same image) on the spec's port, with its limits and only the sha256 of
    its keys in the environment; off when the spec says so."""
    from hf2triton.targets.base import OpenAISpec
    from hf2triton.targets.kserve import KubernetesSpec as Kube
    from hf2triton.targets.kserve import openai_endpoint

    monkeypatch.setenv("HF2TRITON_OPENAI_API_KEYS", "sk-one,sk-two")
    api = OpenAISpec(port=9100, max_body_mb=8)
    objs = _render(api)
    k8s.check_manifests(objs)
    (triton,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert {"name": "openai", "containerPort": 9100} in triton["ports"]
    env = {e["name"]: e["value"] for e in triton["env"]}
    assert "--max-body-mb=8" in env["HF2TRITON_OPENAI_ARGS"]
    assert "sk-one" not in json.dumps(objs) and len(env["HF2TRITON_OPENAI_KEY_SHA256"]) == 129
    assert {"name": "openai", "port": 9100, "targetPort": "openai"} in objs["Service"]["spec"][
        "ports"
    ]
    model = objs["InferenceService"]["spec"]["predictor"]["model"]
    assert model["command"] == ["python3", "-m", "hf2triton_openai"]
    at = model["args"].index("--")
    assert "--port=9100" in model["args"][:at] and model["args"][at + 1] == "tritonserver"
    assert "--triton=127.0.0.1:8081" in model["args"] and "--grpc-port=8081" in model["args"]
    assert {e["name"] for e in model["env"]} == set(env)
    assert (
        openai_endpoint("e", Kube(namespace="s", workload="deployment"), api)
        == "http://e.s.svc.cluster.local:9100/v1"
    )
    assert openai_endpoint("e", Kube(namespace="s", workload="inferenceservice"), api) is None
    off = _render(OpenAISpec(enabled=False))
    (triton,) = off["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert triton["env"] == [{"name": "HF2TRITON_OPENAI", "value": "off"}]


def test_a_field_the_api_does_not_know_is_caught(tmp_path, monkeypatch):
    templates = tmp_path / "k8s"
    shutil.copytree(k8s.TEMPLATES, templates)
    deployment = templates / "triton-deployment.yaml"
    deployment.write_text(deployment.read_text().replace("readinessProbe:", "readinesProbe:"))
    monkeypatch.setattr(k8s, "TEMPLATES", templates)
    with pytest.raises(DeployError, match="readinesProbe"):
        k8s.check_manifests(_render())
    with pytest.raises(DeployError, match="not pinned by digest"):
        k8s.render(k8s.Served("x", "x", "1", PUSHED["tag"], STORE), KubernetesSpec())


def _kserve_models():
    """The KServe SDK's generated model classes (kserve.models), from the wheel unpacked without
    its dependencies by `infra/setup.sh --test`: importing the `kserve` package itself would pull
    its model server (fastapi, uvicorn, pandas<3, ...); kserve.models needs only six and urllib3."""
    if not (KSERVE_SDK / "kserve" / "models").is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no KServe SDK in {KSERVE_SDK}: run `bash infra/setup.sh --test`")
        pytest.skip(f"no KServe SDK in {KSERVE_SDK} (bash infra/setup.sh --test unpacks it)")
    if "kserve.models" not in sys.modules:
        pkg = types.ModuleType("kserve")
        pkg.__path__ = [str(KSERVE_SDK / "kserve")]
        sys.modules.setdefault("kserve", pkg)
    import kserve.models

    return kserve.models


def _build(models, data, klass: str):
    """`data` as an instance of the SDK model `klass`, refusing any key the model does not have;
    the models' constructors refuse missing required fields. Kubernetes types (V1Probe,
    V1ResourceRequirements, ...) are checked with the Kubernetes client's models."""
    if klass.startswith("list["):
        return [_build(models, x, klass[5:-1]) for x in data]
    if klass.startswith("dict("):
        return {k: _build(models, v, klass[5:-1].split(", ", 1)[1]) for k, v in data.items()}
    if klass in ("str", "int", "bool", "float", "object"):
        return data
    if not hasattr(models, klass):
        k8s.check_model(data, klass, klass)
        return data
    cls = getattr(models, klass)
    by_key = {v: k for k, v in cls.attribute_map.items()}
    unknown = sorted(set(data) - set(by_key))
    assert not unknown, f"{klass} has no field(s) {unknown}"
    return cls(
        **{by_key[k]: _build(models, v, cls.openapi_types[by_key[k]]) for k, v in data.items()}
    )


def test_inference_service_matches_the_kserve_sdk_models():
    models = _kserve_models()
    isvc = _build(models, _render()["InferenceService"], "V1beta1InferenceService")
    assert isvc.spec.predictor.model.storage_uri == STORE
    assert isvc.spec.predictor.model.runtime == "kserve-tritonserver"
    assert isvc.spec.predictor.min_replicas == 1


def test_a_field_kserve_does_not_know_is_caught(tmp_path, monkeypatch):
    """A misspelt field in the InferenceService template fails the release's own manifest check
    (there is no cluster to refuse it), naming the field."""
    templates = tmp_path / "k8s"
    shutil.copytree(k8s.TEMPLATES, templates)
    isvc = templates / "kserve-inferenceservice.yaml"
    assert "storageUri:" in isvc.read_text()
    isvc.write_text(isvc.read_text().replace("storageUri:", "storageURI:"))
    monkeypatch.setattr(k8s, "TEMPLATES", templates)
    with pytest.raises(DeployError, match="InferenceService predictor.model.*storageURI"):
        k8s.check_manifests(_render())


def test_prefect_kubernetes_work_pool_template_renders_a_valid_job():
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.utilities.templating import apply_values

    template = k8s.work_pool_template()
    WorkPoolCreate(name="hf2triton-k8s", type="kubernetes", base_job_template=template)
    values = {k: v.get("default") for k, v in template["variables"]["properties"].items()}
    values["env"] = {"MLFLOW_TRACKING_URI": "http://mlflow.hf2triton.svc:5000"}
    job = apply_values(template["job_configuration"], values)["job_manifest"]
    container = job["spec"]["template"]["spec"]["containers"][0]
    # The worker turns the env mapping into a list of name/value pairs, as here.
    container["env"] = [{"name": k, "value": v} for k, v in container["env"].items()]
    k8s.check_model(job, "V1Job", "work pool job")
    assert container["args"] == ["prefect", "flow-run", "execute"]


@pytest.fixture()
def no_cluster(tmp_path, monkeypatch):
    """No kubeconfig and no pod's service account: the apply path stops before any cluster call
    (there is no cluster here: this is the only part of it a test can reach)."""
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))


def test_kserve_target_without_a_cluster_fails_saying_so(tmp_path, no_cluster):
    kube = KubernetesSpec(namespace="serving", storage_uri=STORE)
    target = KServe(
        KServeDeploy(target="kserve", kubernetes=kube, ready_timeout_s=60),
        "tiny-embedder",
        str(tmp_path / "work"),
        "tiny-embedder",
    )
    with pytest.raises(DeployError, match="no Kubernetes cluster is configured") as err:
        target.deploy("/nonexistent", "tiny-embedder", "3", {}, PUSHED, lambda e: {})
    written = tmp_path / "work" / "k8s" / "3"
    assert str(written) in str(err.value)
    assert sorted(p.name for p in written.iterdir()) == [
        "deployment.yaml",
        "horizontalpodautoscaler.yaml",
        "inferenceservice.yaml",
        "service.yaml",
        "servicemonitor.yaml",
    ]
    with pytest.raises(DeployError, match="no image was built: no registry answers"):
        target.deploy(
            "/nonexistent",
            "tiny-embedder",
            "3",
            {},
            {"skipped": "no registry answers"},
            lambda e: {},
        )


def test_kserve_target_needs_the_image():
    base = {
        "name": "x",
        "source": {"path": "/m"},
        "validation": {"sentences": "/s"},
        "registry": {"model_name": "x"},
        "deploy": {"target": "kserve"},
    }
    with pytest.raises(SpecError, match="'kserve' runs the release's image"):
        parse_spec({**base, "image": {"build": False}})
    with pytest.raises(SpecError, match="not a Kubernetes quantity"):
        parse_spec({**base, "deploy": {"target": "kserve", "kubernetes": {"cpu_limit": "lots"}}})
    assert parse_spec(base).deploy.kubernetes.workload == "inferenceservice"


def _image_of(version: str) -> dict:
    """A pushed image of `version` (each version its own digest), as image.target records it."""
    digest = "sha256:" + version.zfill(2) * 32
    return {
        "tag": f"127.0.0.1:5000/tiny-embedder:{version}-0123456789ab",
        "digest": digest,
        "reference": f"127.0.0.1:5000/tiny-embedder@{digest}",
    }


def _storage_of(version: str) -> str:
    return f"s3://models/tiny-embedder/{version}/triton_repository"


@pytest.fixture()
def kserve_versions(tmp_path, hf2triton_home, no_cluster):
    """tiny-embedder in a local MLflow store: version 1 with its pushed image recorded (as the
    release's record-image step tags it), version 2 deployed by the kserve target (its
    manifests written; no cluster), version 3 released with no image. Each version's model
    repository is in an object store. Returns the target."""
    from hf2triton.clients.mlflow import Registry
    from hf2triton.image.release import image_tags

    registry = Registry()
    registry.client.create_registered_model("tiny-embedder")
    for version in ("1", "2", "3"):
        mv = registry.client.create_model_version("tiny-embedder", _storage_of(version))
        assert str(mv.version) == version
    built = {"image_id": "sha256:" + "ee" * 32, "size_bytes": 1, "base_image": "debian:12"}
    registry.tag_version("tiny-embedder", "1", image_tags(built, _image_of("1")))
    target = KServe(
        KServeDeploy(
            target="kserve", kubernetes=KubernetesSpec(namespace="serving"), ready_timeout_s=60
        ),
        "tiny-embedder",
        str(tmp_path / "work"),
        "tiny-embedder",
    )
    with pytest.raises(DeployError, match="no Kubernetes cluster is configured"):
        target.deploy("/nonexistent", "tiny-embedder", "2", {}, _image_of("2"), lambda e: {})
    return target


def _written(folder: Path) -> dict:
    import yaml

    objs = [yaml.safe_load(p.read_text()) for p in sorted(folder.glob("*.yaml"))]
    return {obj["kind"]: obj for obj in objs}


@pytest.mark.parametrize(
    "version, recorded_by",
    [("1", "its MLflow version's image tag"), ("2", "its deploy's manifests")],
)
def test_restore_without_a_cluster_writes_the_version_pinned_and_applies_nothing(
    kserve_versions, tmp_path, version, recorded_by
):
    """`hf2triton rollback` to a version: its own image digest and model repository, rendered,
    checked and written; without a cluster the error names them, and nothing is checked on an
    endpoint (nothing was applied)."""
    checked = []
    with pytest.raises(DeployError, match="no Kubernetes cluster is configured") as err:
        kserve_versions.restore("tiny-embedder", version, checked.append)
    folder = tmp_path / "work" / "k8s" / f"{version}-restore"
    message = str(err.value)
    assert message.startswith(
        f"tiny-embedder version {version} is not served again and the "
        "champion alias stays where it is"
    )
    assert str(folder) in message and "kubectl apply -f" in message
    assert checked == []
    objs = _written(folder)
    k8s.check_manifests(objs)
    image = _image_of(version)
    model = objs["InferenceService"]["spec"]["predictor"]["model"]
    assert model["image"] == image["reference"], recorded_by
    assert model["storageUri"] == _storage_of(version), recorded_by
    (triton,) = objs["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert triton["image"] == image["reference"]
    for kind in ("InferenceService", "Deployment"):
        meta = objs[kind]["metadata"]
        assert meta["annotations"]["hf2triton.io/image-digest"] == image["digest"]
        assert meta["annotations"]["hf2triton.io/mlflow-version"] == version
        assert meta["labels"]["app.kubernetes.io/version"] == version
    # The version's deploy manifests are left as they were.
    deployed = _written(tmp_path / "work" / "k8s" / "2")["InferenceService"]
    assert deployed["spec"]["predictor"]["model"]["image"] == _image_of("2")["reference"]


def test_restore_of_a_version_with_no_recorded_image_says_what_to_do(kserve_versions, tmp_path):
    with pytest.raises(DeployError, match="tiny-embedder version 3 has no recorded image") as err:
        kserve_versions.restore("tiny-embedder", "3", lambda e: {})
    assert "'image.reference' tag" in str(err.value) and "--to VERSION" in str(err.value)
    with pytest.raises(DeployError, match="tiny-embedder has no version 9 in MLflow"):
        kserve_versions.restore("tiny-embedder", "9", lambda e: {})
    assert sorted(p.name for p in (tmp_path / "work" / "k8s").iterdir()) == ["2"]


@pytest.mark.parametrize(
    "workload, http, grpc, openai",
    [
        (
            "deployment",
            "tiny-embedder.serving.svc.cluster.local:8000",
            "tiny-embedder.serving.svc.cluster.local:8001",
            "http://tiny-embedder.serving.svc.cluster.local:9000/v1",
        ),
        (
            "inferenceservice",
            "tiny-embedder-predictor.serving.svc.cluster.local:80",
            "tiny-embedder-predictor.serving.svc.cluster.local:80",
            None,
        ),
    ],
)
def test_watch_reads_the_rendered_services_metrics_port_and_probes_the_served_endpoints(
    workload, http, grpc, openai
):
    kube = KubernetesSpec(namespace="serving", workload=workload)
    target = KServe(KServeDeploy(target="kserve", kubernetes=kube), "tiny-embedder")
    (point,) = target.watch_points()
    objs = _render(workload=workload)
    (scrape,) = objs["ServiceMonitor"]["spec"]["endpoints"]
    ports = {p["name"]: p["port"] for p in objs["Service"]["spec"]["ports"]}
    assert (scrape["port"], ports["metrics"], scrape["path"]) == ("metrics", 8002, "/metrics")
    assert point["metrics"] == "http://tiny-embedder.serving.svc.cluster.local:8002/metrics"
    assert (point["http"], point["grpc"], point.get("openai")) == (http, grpc, openai)
    assert point["name"] == f"{workload} serving/tiny-embedder"


def test_watch_follows_the_templates_metrics_port(tmp_path, monkeypatch):
    """The port comes from the rendered Service, by the name the ServiceMonitor scrapes; a
    ServiceMonitor naming a port the Service lacks is refused."""
    templates = tmp_path / "k8s"
    shutil.copytree(k8s.TEMPLATES, templates)
    service = templates / "triton-service.yaml"
    service.write_text(service.read_text().replace("port: 8002", "port: 9102"))
    monkeypatch.setattr(k8s, "TEMPLATES", templates)
    kube = KubernetesSpec(
        namespace="serving", workload="deployment", endpoint_http="gateway.example.com:80"
    )
    target = KServe(KServeDeploy(target="kserve", kubernetes=kube), "tiny-embedder")
    (point,) = target.watch_points()
    assert point["metrics"] == "http://tiny-embedder.serving.svc.cluster.local:9102/metrics"
    assert point["http"] == "gateway.example.com:80"
    monitor = templates / "triton-servicemonitor.yaml"
    monitor.write_text(monitor.read_text().replace("port: metrics", "port: prometheus"))
    with pytest.raises(
        DeployError, match="scrapes port 'prometheus', which the Service does not have"
    ):
        target.watch_points()
