"""Target `kserve`: the release's image (by digest) on a Kubernetes cluster, as a KServe
InferenceService or a plain Deployment + Service + HorizontalPodAutoscaler (hf2triton.k8s).

The manifests are always rendered from `infra/k8s/`, checked against the Kubernetes client's
models and written to the release's work directory; they are applied only when a cluster is
configured (a kubeconfig, or a pod's service account). Without one the step fails and says so.
The InferenceService's model repository is `deploy.kubernetes.storage_uri`, else the bucket of a
`deploy.model_store` of kind s3 (the version is written there first, like the local target
does), else the MLflow version's `triton_repository` artifact when it lives in an object store.
A rollback re-applies the objects that served before (or deletes the new ones).
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from hf2triton import k8s
from hf2triton.clients.mlflow import Registry
from hf2triton.errors import DeployError
from hf2triton.smoke import Endpoint
from hf2triton.specbase import Strict, matching
from hf2triton.stores import ModelStoreSpec, default_store
from hf2triton.targets import TARGETS
from hf2triton.targets.base import Check, Deployment, DeploySection, DeployTarget
from hf2triton.targets.local import expected_files

REMOTE_STORES = ("s3://", "gs://", "azureblob://", "https://", "hdfs://", "webhdfs://", "pvc://",
                 "oci://")


def endpoints(name: str, kube: KubernetesSpec) -> tuple[str, str]:
    """(http, grpc) host:port of the served model: the spec's, else the cluster-internal ones."""
    if kube.workload == "inferenceservice":  # KServe's predictor Service; gRPC rides h2c on 80
        internal = f"{name}-predictor.{kube.namespace}.svc.cluster.local"
        default = (f"{internal}:80", f"{internal}:80")
    else:
        internal = f"{name}.{kube.namespace}.svc.cluster.local"
        default = (f"{internal}:8000", f"{internal}:8001")
    return kube.endpoint_http or default[0], kube.endpoint_grpc or default[1]


def openai_endpoint(name: str, kube: KubernetesSpec, openai: Any) -> str | None:
    """The OpenAI-compatible API's base URL: the spec's, else the plain Deployment's Service
    (an InferenceService's API has no route of KServe's: none)."""
    if not openai.enabled:
        return None
    if kube.endpoint_openai:
        return kube.endpoint_openai.rstrip("/")
    if kube.workload == "inferenceservice":
        return None
    return f"http://{name}.{kube.namespace}.svc.cluster.local:{openai.port}/v1"


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


K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


class KubernetesSpec(Strict):
    """`deploy.target: kserve`: where and how the release's image runs on a cluster."""

    namespace: Annotated[str, matching(K8S_NAME, "a Kubernetes namespace name (RFC 1123 "
                                        "label)")] = "default"
    workload: Literal["inferenceservice", "deployment"] = Field(
        "inferenceservice",
        description="what is applied: a KServe InferenceService (Triton runtime, model from "
        "storage_uri), or a plain Deployment + Service + HorizontalPodAutoscaler running the "
        "image with its baked-in model; both are always rendered",
    )
    storage_uri: str | None = Field(
        None, description="the model repository KServe downloads (s3://, gs://, pvc://, https://); "
        "default: the MLflow version's triton_repository artifact when it is such a URI"
    )
    min_replicas: int = Field(1, ge=0, le=1000)
    max_replicas: int = Field(3, ge=1, le=1000)
    target_cpu_utilization: int = Field(70, ge=1, le=100, description="HPA target, percent")
    cpu_request: str = "1"
    memory_request: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "4Gi"
    kubeconfig: str | None = Field(
        None, description="default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
        "service account"
    )
    context: str | None = None
    endpoint_http: str | None = Field(
        None, description="host:port where the pipeline reaches the served model over HTTP for "
        "the smoke test; default: the cluster-internal Service (a pipeline run as a Prefect "
        "Kubernetes work pool job reaches it)"
    )
    endpoint_grpc: str | None = Field(None, description="as endpoint_http, for gRPC")
    endpoint_openai: str | None = Field(
        None, description="base URL (http://host:port/v1) where the pipeline reaches the "
        "OpenAI-compatible API beside the served model; default: the plain Deployment's "
        "Service (KServe routes an InferenceService's port 8080 only: without this the smoke "
        "test does not go through the API there)")

    @field_validator("cpu_request", "memory_request", "cpu_limit", "memory_limit")
    @classmethod
    def _check_quantity(cls, v: str) -> str:
        if not QUANTITY.match(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity such as '500m', '2' or '4Gi'")
        return v

    @model_validator(mode="after")
    def _replica_range(self) -> KubernetesSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas "
                             f"{self.max_replicas}")
        return self


class KServeDeploy(DeploySection):
    """`target: kserve`: the image on a Kubernetes cluster (see `kubernetes`); with a model store
    of kind s3 the version is written to the bucket and the InferenceService reads it there."""

    target: Literal["kserve"]
    runs_image: ClassVar[bool] = True
    kubernetes: KubernetesSpec = KubernetesSpec()
    model_store: ModelStoreSpec = Field(
        default_factory=default_store, description="kind s3: the InferenceService's "
        "storageUri is this bucket")


@TARGETS.register
class KServe(DeployTarget):
    Spec = KServeDeploy

    def _storage(self, repository: str, model_name: str, version: str,
                 files: dict[str, str]) -> str | None:
        kube, store = self.spec.kubernetes, self.spec.model_store
        if kube.storage_uri:
            return kube.storage_uri
        if store.storage_uri():
            store.prepare()
            store.put_version(repository, model_name, version,
                              expected_files(files, model_name))
            return store.storage_uri()
        return storage_uri_for(kube, Registry().version(self.registry_model, version).source)

    def deploy(self, repository: str, model_name: str, version: str, files: dict[str, str],
               image: dict[str, Any], check: Check) -> Deployment:
        kube = self.spec.kubernetes
        if not image.get("reference"):
            raise DeployError(
                "deploy.target 'kserve' runs the release's image, but no image was built: "
                f"{image.get('skipped', 'unknown reason')}")
        storage = self._storage(repository, model_name, version, files)
        objs = k8s.render(self.release, model_name, version, image["reference"], storage, kube,
                          self.spec.openai)
        k8s.check_manifests(objs)
        written = k8s.write(objs, Path(self.work) / "k8s" / version)
        if kube.workload == "inferenceservice" and storage is None:
            raise DeployError(
                "an InferenceService needs a model repository the cluster can read: set "
                "deploy.kubernetes.storage_uri (s3://..., gs://..., pvc://...), a "
                "deploy.model_store of kind s3, or run MLflow with an object-store artifact "
                f"root; the manifests are rendered in {Path(written[0]).parent}")
        if k8s.configured_cluster(kube) is None:
            raise k8s.no_cluster_error(kube, written)
        kinds = ["InferenceService"] if kube.workload == "inferenceservice" else \
            ["Deployment", "Service", "HorizontalPodAutoscaler"]
        applied = [objs[k] for k in kinds]
        before = k8s.current(applied, kube)
        k8s.apply(applied, kube)
        if kube.workload == "inferenceservice":
            k8s.wait_inference_service(self.release, kube, self.spec.ready_timeout_s)
        else:
            _wait_deployment(self.release, kube, self.spec.ready_timeout_s)
        http, grpc = endpoints(self.release, kube)
        endpoint = Endpoint(name=f"{kube.workload} {kube.namespace}/{self.release}",
                            http=http, grpc=grpc, version=version)
        api = openai_endpoint(self.release, kube, self.spec.openai)
        if api:
            endpoint["openai"] = api
        return Deployment(
            target=self.name, model_name=model_name, version=version,
            endpoints=[endpoint],
            state={"workload": kube.workload, "namespace": kube.namespace, "name": self.release,
                   "image": image["reference"], "storage_uri": storage, "manifests": written,
                   "applied": applied, "before": before},
            reused=False)

    def rollback(self, deployment: Deployment) -> None:
        state = deployment["state"]
        k8s.restore(state["applied"], state["before"], self.spec.kubernetes)

    def summary(self, deployment: Deployment) -> dict[str, Any]:
        out = super().summary(deployment)
        state = deployment["state"]
        out["kubernetes"] = {k: state[k] for k in ("workload", "namespace", "name", "image",
                                                   "storage_uri", "manifests")}
        return out
