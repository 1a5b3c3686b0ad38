"""Kubernetes and KServe: render the manifests of `infra/k8s/` for one release (image pinned by
digest), check them against the Kubernetes client's models, and apply them to a cluster when one
is configured.
"""

from __future__ import annotations

import json
import os
import re
import string
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import Field, field_validator, model_validator

from hf2triton.errors import DeployError, ServiceUnavailableError
from hf2triton.targets.base import OpenAISpec
from hf2triton.util.specbase import Strict, matching, without_login
from hf2triton.util.workspace import resource_dir

K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


class KubernetesSpec(Strict):
    """`deploy.target: kserve`: where and how the release's image runs on a cluster."""

    namespace: Annotated[
        str, matching(K8S_NAME, "a Kubernetes namespace name (RFC 1123 label)")
    ] = "default"
    workload: Literal["inferenceservice", "deployment"] = Field(
        "inferenceservice",
        description="what is applied: a KServe InferenceService (Triton runtime, model from "
        "storage_uri), or a plain Deployment + Service + HorizontalPodAutoscaler running the "
        "image with its baked-in model; both are always rendered",
    )
    storage_uri: Annotated[
        str | None, without_login("the storage secret of KServe's service account")
    ] = Field(
        None,
        description="the model repository KServe downloads (s3://, gs://, pvc://, https://); "
        "default: the MLflow version's triton_repository artifact when it is such a URI",
    )
    min_replicas: int = Field(1, ge=0, le=1000)
    max_replicas: int = Field(3, ge=1, le=1000)
    target_cpu_utilization: int = Field(70, ge=1, le=100, description="HPA target, percent")
    cpu_request: str = "1"
    memory_request: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "4Gi"
    kubeconfig: str | None = Field(
        None,
        description="default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
        "service account",
    )
    context: str | None = None
    endpoint_http: str | None = Field(
        None,
        description="host:port where the pipeline reaches the served model over HTTP for "
        "the smoke test; default: the cluster-internal Service (a pipeline run as a Prefect "
        "Kubernetes work pool job reaches it)",
    )
    endpoint_grpc: str | None = Field(None, description="as endpoint_http, for gRPC")
    endpoint_openai: str | None = Field(
        None,
        description="base URL (http://host:port/v1) where the pipeline reaches the "
        "OpenAI-compatible API beside the served model; default: the plain Deployment's "
        "Service (KServe routes an InferenceService's port 8080 only: without this the smoke "
        "test does not go through the API there)",
    )

    @field_validator("cpu_request", "memory_request", "cpu_limit", "memory_limit")
    @classmethod
    def _check_quantity(cls, v: str) -> str:
        if not QUANTITY.match(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity such as '500m', '2' or '4Gi'")
        return v

    @model_validator(mode="after")
    def _replica_range(self) -> KubernetesSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(
                f"min_replicas {self.min_replicas} exceeds max_replicas {self.max_replicas}"
            )
        return self


TEMPLATES = resource_dir("infra") / "k8s"
MANIFESTS = {  # file -> (kind, the Kubernetes client model that checks it, or None for a CRD)
    "triton-deployment.yaml": ("Deployment", "V1Deployment"),
    "triton-service.yaml": ("Service", "V1Service"),
    "triton-hpa.yaml": ("HorizontalPodAutoscaler", "V2HorizontalPodAutoscaler"),
    "kserve-inferenceservice.yaml": ("InferenceService", None),
    # Written beside the others, not applied: it needs the Prometheus Operator's CRD.
    "triton-servicemonitor.yaml": ("ServiceMonitor", None),
}
WORK_POOL_TEMPLATE = TEMPLATES / "prefect-work-pool.json"
# The InferenceService's storageUri when the release has no model repository the cluster reads.
NO_STORAGE = "s3://CHANGE-ME/triton_repository"
# Where the rendered objects say which MLflow version they serve.
VERSION_ANNOTATION = "hf2triton.io/mlflow-version"


@dataclass(frozen=True)
class Served:
    """What the manifests run: the release (the objects' name), the model and its MLflow
    version, the image (pinned by digest) and the model repository the cluster reads (None:
    the release has none the cluster reads)."""

    name: str
    model_name: str
    version: str
    image: str
    storage_uri: str | None = None


def render(
    served: Served, k8s: KubernetesSpec, openai: OpenAISpec | None = None
) -> dict[str, dict[str, Any]]:
    """The release's manifests as objects, keyed by kind.

    Example:
        >>> objs = render(Served("my-embedder", "my-embedder", "3",
        ...               "registry.example.com/my-embedder@sha256:...", "s3://models/my-embedder/3"),
        ...               KubernetesSpec(namespace="serving"))
        >>> objs["Deployment"]["spec"]["template"]["spec"]["containers"][0]["image"]
        'registry.example.com/my-embedder@sha256:...'
    """
    if "@sha256:" not in served.image:
        raise DeployError(
            f"the image {served.image!r} is not pinned by digest (registry/repo@sha256:...): "
            "Kubernetes must run exactly the image the release pushed and recorded"
        )
    values = {
        "name": served.name,
        "namespace": k8s.namespace,
        "model_name": served.model_name,
        "version": served.version,
        "image": served.image,
        "digest": served.image.split("@", 1)[1],
        # Rendered even without a store, so the plain Deployment can be inspected and applied.
        "storage_uri": served.storage_uri or NO_STORAGE,
        "min_replicas": k8s.min_replicas,
        "hpa_min_replicas": max(1, k8s.min_replicas),
        "max_replicas": k8s.max_replicas,
        "target_cpu_utilization": k8s.target_cpu_utilization,
        "cpu_request": k8s.cpu_request,
        "memory_request": k8s.memory_request,
        "cpu_limit": k8s.cpu_limit,
        "memory_limit": k8s.memory_limit,
        # The OpenAI-compatible API beside Triton (deploy.openai): its port and environment.
        "openai_port": openai.port if openai is not None else 9000,
        "openai_env": json.dumps(
            [
                {"name": k, "value": v}
                for k, v in sorted(
                    (openai.container_environment() if openai is not None else {}).items()
                )
            ]
        ),
    }
    out = {}
    for file, (kind, _) in MANIFESTS.items():
        text = string.Template((TEMPLATES / file).read_text()).substitute(values)
        obj = yaml.safe_load(text)
        if obj.get("kind") != kind:
            raise DeployError(f"{TEMPLATES / file} renders a {obj.get('kind')}, not a {kind}")
        out[kind] = obj
    return out


def metrics_url(objs: dict[str, dict[str, Any]]) -> str:
    """What the ServiceMonitor has Prometheus scrape, by the Service's cluster DNS name: the
    Service's port of the name the ServiceMonitor's endpoint names, and its path."""
    service, scrape = objs["Service"], objs["ServiceMonitor"]["spec"]["endpoints"][0]
    ports = {p["name"]: p["port"] for p in service["spec"]["ports"]}
    if scrape["port"] not in ports:
        raise DeployError(
            f"the ServiceMonitor scrapes port {scrape['port']!r}, which the "
            f"Service does not have (it has {', '.join(ports)}): see {TEMPLATES}"
        )
    meta = service["metadata"]
    return (
        f"http://{meta['name']}.{meta['namespace']}.svc.cluster.local:"
        f"{ports[scrape['port']]}{scrape.get('path', '/metrics')}"
    )


def served_version(obj: dict[str, Any] | None) -> str | None:
    """The MLflow version a rendered (or live) object serves, None where it does not say."""
    meta = (obj or {}).get("metadata") or {}
    return (meta.get("annotations") or {}).get(VERSION_ANNOTATION) or (
        meta.get("labels") or {}
    ).get("app.kubernetes.io/version")


def _api_client():
    from kubernetes.client import ApiClient

    return ApiClient()


def check_model(obj: dict[str, Any], model: str, what: str = "") -> None:
    """Raise unless `obj` survives a round trip through the Kubernetes client's `model`: every
    key known to the API, every required field present, every value of the right type."""
    what = what or f"{obj.get('kind')} {obj.get('metadata', {}).get('name')}"
    client = _api_client()
    try:
        typed = client._ApiClient__deserialize(obj, model)
    except (ValueError, TypeError) as exc:
        raise DeployError(f"{what}: not a valid {model}: {exc}") from None
    lost = _differences(obj, client.sanitize_for_serialization(typed))
    if lost:
        raise DeployError(
            f"{what}: fields the Kubernetes API does not know or cannot read as {model}: {lost[:5]}"
        )


def _differences(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in a for d in _differences(a[k], b.get(k), f"{path}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in _differences(x, y, f"{path}[{i}]")]
    if a == b or str(a) == str(b):  # quantities and int-or-string come back as strings
        return []
    return [f"{path.lstrip('.')}: {a!r}"]


# ModelSpec fields of KServe's own; the rest of an InferenceService's model is a Kubernetes
# Container.
KSERVE_MODEL_FIELDS = (
    "modelFormat",
    "protocolVersion",
    "runtime",
    "runtimeVersion",
    "storageUri",
    "storage",
)


def check_manifests(objs: dict[str, dict[str, Any]]) -> None:
    """Check every rendered object against the Kubernetes client's models; of the
    InferenceService (a CRD the client has no model for), its metadata and its container."""
    for kind, model in MANIFESTS.values():
        if model:
            check_model(objs[kind], model)
    isvc = objs["InferenceService"]
    check_model(isvc["metadata"], "V1ObjectMeta", "InferenceService metadata")
    check_model(objs["ServiceMonitor"]["metadata"], "V1ObjectMeta", "ServiceMonitor metadata")
    container = {
        k: v for k, v in isvc["spec"]["predictor"]["model"].items() if k not in KSERVE_MODEL_FIELDS
    }
    check_model(
        {"name": "kserve-container", **container}, "V1Container", "InferenceService predictor.model"
    )


def write(objs: dict[str, dict[str, Any]], out_dir: Path) -> list[str]:
    """Write each manifest as YAML (for `kubectl apply -f`); returns the paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for kind, obj in objs.items():
        path = out_dir / f"{kind.lower()}.yaml"
        tmp = path.with_suffix(".tmp")
        tmp.write_text(yaml.safe_dump(obj, sort_keys=False))
        os.replace(tmp, path)
        paths.append(str(path))
    return paths


def work_pool_template() -> dict[str, Any]:
    """The Prefect Kubernetes work pool's base job template (`prefect work-pool create --type
    kubernetes --base-job-template infra/k8s/prefect-work-pool.json`)."""
    return json.loads(WORK_POOL_TEMPLATE.read_text())


def configured_cluster(k8s: KubernetesSpec) -> str | None:
    """Where the cluster's credentials come from, or None when no cluster is configured."""
    if k8s.kubeconfig:
        return k8s.kubeconfig if Path(k8s.kubeconfig).expanduser().is_file() else None
    for candidate in [
        *os.environ.get("KUBECONFIG", "").split(os.pathsep),
        str(Path.home() / ".kube" / "config"),
    ]:
        if candidate and Path(candidate).expanduser().is_file():
            return candidate
    if os.environ.get("KUBERNETES_SERVICE_HOST"):
        return "in-cluster service account"
    return None


def no_cluster_error(k8s: KubernetesSpec, written: list[str]) -> DeployError:
    return DeployError(
        "no Kubernetes cluster is configured: no kubeconfig at "
        f"{k8s.kubeconfig or '$KUBECONFIG or ~/.kube/config'} and not running in a pod. "
        f"The manifests are rendered in {Path(written[0]).parent}; point deploy.kubernetes."
        "kubeconfig (or $KUBECONFIG) at a cluster to apply them, or `kubectl apply -f` them"
    )


def _client(k8s: KubernetesSpec):
    from kubernetes import config
    from kubernetes.client import ApiClient

    where = configured_cluster(k8s)
    if where is None:
        raise DeployError("no Kubernetes cluster is configured")
    if where == "in-cluster service account":
        config.load_incluster_config()
        return ApiClient()
    return config.new_client_from_config(config_file=where, context=k8s.context)


def apply(objs: list[dict[str, Any]], k8s: KubernetesSpec) -> None:
    """Server-side apply of `objs` as field manager hf2triton (create or update in place)."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    dyn = dynamic.DynamicClient(_client(k8s))
    for obj in objs:
        try:
            resource = dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])
            resource.server_side_apply(
                body=obj,
                name=obj["metadata"]["name"],
                namespace=obj["metadata"]["namespace"],
                field_manager="hf2triton",
                force_conflicts=True,
            )
        except ApiException as exc:
            if exc.status and exc.status >= 500:
                raise ServiceUnavailableError(
                    f"the Kubernetes API answered {exc.status} applying {obj['kind']}"
                ) from exc
            raise DeployError(
                f"the cluster refused {obj['kind']} {obj['metadata']['name']}: "
                f"{exc.status} {exc.reason}: {str(exc.body)[:300]}"
            ) from None


def wait_inference_service(name: str, k8s: KubernetesSpec, timeout_s: float) -> str:
    """Wait until the InferenceService reports Ready; returns its URL."""
    from kubernetes.client import CustomObjectsApi

    objects = CustomObjectsApi(_client(k8s))
    deadline = time.monotonic() + timeout_s
    last = "no status yet"
    while time.monotonic() < deadline:
        isvc = objects.get_namespaced_custom_object(
            "serving.kserve.io", "v1beta1", k8s.namespace, "inferenceservices", name
        )
        status = isvc.get("status") or {}
        for cond in status.get("conditions") or []:
            if cond.get("type") == "Ready":
                if cond.get("status") == "True":
                    return str(status.get("url") or "")
                last = f"{cond.get('reason')}: {cond.get('message')}"
        time.sleep(5)
    raise DeployError(
        f"InferenceService {k8s.namespace}/{name} was not Ready within {timeout_s:.0f}s ({last})"
    )


def _resource(dyn: Any, obj: dict[str, Any]) -> Any:
    return dyn.resources.get(api_version=obj["apiVersion"], kind=obj["kind"])


def current(objs: list[dict[str, Any]], k8s: KubernetesSpec) -> list[dict[str, Any] | None]:
    """What the cluster holds now under the names of `objs` (None where nothing), so a rollback
    can put it back."""
    from kubernetes import dynamic
    from kubernetes.client.exceptions import ApiException

    dyn = dynamic.DynamicClient(_client(k8s))
    found: list[dict[str, Any] | None] = []
    for obj in objs:
        try:
            live = (
                _resource(dyn, obj)
                .get(name=obj["metadata"]["name"], namespace=obj["metadata"]["namespace"])
                .to_dict()
            )
        except ApiException as exc:
            if exc.status == 404:
                found.append(None)
                continue
            raise DeployError(
                f"the cluster refused to read {obj['kind']}: {exc.status} {exc.reason}"
            ) from None
        meta = live.get("metadata", {})
        live["metadata"] = {
            k: meta[k] for k in ("name", "namespace", "labels", "annotations") if k in meta
        }
        live.pop("status", None)
        found.append(live)
    return found


def restore(
    applied: list[dict[str, Any]], before: list[dict[str, Any] | None], k8s: KubernetesSpec
) -> None:
    """Undo `apply(applied)`: re-apply what was there before, delete what was not."""
    from kubernetes import dynamic

    dyn = dynamic.DynamicClient(_client(k8s))
    for obj, old in zip(applied, before):
        if old is not None:
            apply([old], k8s)
        else:
            _resource(dyn, obj).delete(
                name=obj["metadata"]["name"], namespace=obj["metadata"]["namespace"]
            )
