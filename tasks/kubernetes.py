"""Deploy target `kserve`: the release's image (by digest) on a Kubernetes cluster, as a KServe
InferenceService or a plain Deployment + Service + HorizontalPodAutoscaler.

The manifests are always rendered from `infra/k8s/`, checked against the Kubernetes client's
models and written to the release's work directory; they are applied only when a cluster is
configured (a kubeconfig, or a pod's service account). Without one the step fails and says so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, TypedDict

from prefect import task

from hf2triton import k8s
from hf2triton.errors import DeployError
from hf2triton.spec import KubernetesSpec
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT

REMOTE_STORES = ("s3://", "gs://", "azureblob://", "https://", "hdfs://", "webhdfs://", "pvc://",
                 "oci://")


class KubernetesDeployResult(TypedDict):
    workload: str
    namespace: str
    name: str
    image: str
    storage_uri: str | None
    manifests: list[str]
    http_url: str  # host:port the smoke test uses
    grpc_url: str
    reused: bool


def endpoints(name: str, kube: KubernetesSpec) -> tuple[str, str]:
    """(http, grpc) host:port of the served model: the spec's, else the cluster-internal ones."""
    if kube.workload == "inferenceservice":  # KServe's predictor Service; gRPC rides h2c on 80
        internal = f"{name}-predictor.{kube.namespace}.svc.cluster.local"
        default = (f"{internal}:80", f"{internal}:80")
    else:
        internal = f"{name}.{kube.namespace}.svc.cluster.local"
        default = (f"{internal}:8000", f"{internal}:8001")
    return kube.endpoint_http or default[0], kube.endpoint_grpc or default[1]


def registered_source(model_name: str, version: str) -> str | None:
    """Where MLflow keeps the version's triton_repository artifact."""
    from tasks.register import _call, _client, tracking_uri

    uri = tracking_uri()
    return _call("read the model version", uri, _client(uri).get_model_version, model_name,
                 version).source


def storage_uri_for(kube: KubernetesSpec, registered_source: str | None) -> str | None:
    """The model repository KServe downloads: the spec's, else the MLflow version's
    triton_repository artifact when it lives in a store the cluster can read."""
    if kube.storage_uri:
        return kube.storage_uri
    if registered_source and registered_source.startswith(REMOTE_STORES):
        return registered_source
    return None


def _wait_deployment(name: str, kube: KubernetesSpec, timeout_s: float) -> None:
    from kubernetes.client import AppsV1Api

    apps = AppsV1Api(k8s._client(kube))
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        dep = apps.read_namespaced_deployment_status(name, kube.namespace)
        want = dep.spec.replicas or 0
        st = dep.status
        if (st.observed_generation or 0) >= dep.metadata.generation and \
                (st.updated_replicas or 0) == want and (st.available_replicas or 0) >= want:
            return
        time.sleep(5)
    raise DeployError(f"Deployment {kube.namespace}/{name} did not roll out within "
                      f"{timeout_s:.0f}s: `kubectl -n {kube.namespace} describe deploy {name}`")


def deploy_kubernetes(name: str, model_name: str, mlflow_model: str, version: str,
                      image: dict[str, Any], kube: KubernetesSpec, ready_timeout_s: float,
                      work: str) -> KubernetesDeployResult:
    """Render, check, write and (with a cluster) apply the release's manifests, then wait until
    the workload is ready.

    Example:
        >>> deploy_kubernetes("my-embedder", "my-embedder", "my-embedder", "3",
        ...                   {"reference": "reg/x@sha256:..."},
        ...                   KubernetesSpec(storage_uri="s3://models/my-embedder/3"),
        ...                   600, "/tmp/work")["manifests"][0]
        '/tmp/work/k8s/3/deployment.yaml'
    """
    if not image.get("reference"):
        raise DeployError(
            "deploy.target 'kserve' runs the release's image, but no image was built: "
            f"{image.get('skipped', 'unknown reason')}"
        )
    storage = storage_uri_for(
        kube, None if kube.storage_uri else registered_source(mlflow_model, version))
    objs = k8s.render(name, model_name, version, image["reference"], storage, kube)
    k8s.check_manifests(objs)
    written = k8s.write(objs, Path(work) / "k8s" / version)
    if kube.workload == "inferenceservice" and storage is None:
        raise DeployError(
            "an InferenceService needs a model repository the cluster can read: set "
            "deploy.kubernetes.storage_uri (s3://..., gs://..., pvc://...), or run MLflow with an "
            f"object-store artifact root; the manifests are rendered in {Path(written[0]).parent}"
        )
    if k8s.configured_cluster(kube) is None:
        raise k8s.no_cluster_error(kube, written)
    if kube.workload == "inferenceservice":
        k8s.apply([objs["InferenceService"]], kube)
        k8s.wait_inference_service(name, kube, ready_timeout_s)
    else:
        k8s.apply([objs[k] for k in ("Deployment", "Service", "HorizontalPodAutoscaler")], kube)
        _wait_deployment(name, kube, ready_timeout_s)
    http, grpc = endpoints(name, kube)
    return KubernetesDeployResult(workload=kube.workload, namespace=kube.namespace, name=name,
                                  image=image["reference"], storage_uri=storage,
                                  manifests=written, http_url=http, grpc_url=grpc, reused=False)


deploy_k8s = task(deploy_kubernetes, name="deploy-kubernetes",
                  task_run_name="deploy {name} v{version} to Kubernetes",
                  **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
