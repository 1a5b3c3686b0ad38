"""Target `kserve`: the release's image (by digest) on a Kubernetes cluster, as a KServe
InferenceService or a plain Deployment + Service + HorizontalPodAutoscaler (hf2triton.targets.k8s).

The manifests are always rendered from `infra/k8s/`, checked against the Kubernetes client's
models and written to the release's work directory; they are applied only when a cluster is
configured (a kubeconfig, or a pod's service account). Without one the step fails and says so.
The InferenceService's model repository is `deploy.kubernetes.storage_uri`, else the bucket of a
`deploy.model_store` of kind s3 (the version is written there first, like the local target
does), else the MLflow version's `triton_repository` artifact when it lives in an object store.
A rollback re-applies the objects that served before (or deletes the new ones).

After promotion, `restore` (`hf2triton rollback`, the watch) renders an earlier version again,
pinned to that version's own image digest and model repository (as its deploy's manifests in
`k8s/<version>/` say, else its MLflow version's `image.reference` tag and source), writes them to
`k8s/<version>-restore/` and applies them as a deploy does; they must pass the version's smoke
test, else what served before is applied again. The watch reads Triton's metrics through the
rendered Service at the port the ServiceMonitor scrapes.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar, Literal

import yaml
from pydantic import Field

from hf2triton.clients.mlflow import Registry
from hf2triton.errors import DeployError
from hf2triton.stores import ModelStoreSpec, default_store
from hf2triton.targets import k8s
from hf2triton.targets.base import (
    TARGETS,
    Check,
    Deployment,
    DeploySection,
    DeployTarget,
    WatchPoint,
)
from hf2triton.targets.k8s import KubernetesSpec
from hf2triton.targets.local import expected_files
from hf2triton.targets.smoke import Endpoint
from hf2triton.util.runs import step_logger

REMOTE_STORES = (
    "s3://",
    "gs://",
    "azureblob://",
    "https://",
    "hdfs://",
    "webhdfs://",
    "pvc://",
    "oci://",
)
# The MLflow version tag naming the pushed image by digest (hf2triton.image.release.image_tags).
IMAGE_TAG = "image.reference"


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
        if (
            (st.observed_generation or 0) >= dep.metadata.generation
            and (st.updated_replicas or 0) == want
            and (st.available_replicas or 0) >= want
        ):
            return
        time.sleep(5)
    raise DeployError(
        f"Deployment {kube.namespace}/{name} did not roll out within "
        f"{timeout_s:.0f}s: `kubectl -n {kube.namespace} describe deploy {name}`"
    )


class KServeDeploy(DeploySection):
    """`target: kserve`: the image on a Kubernetes cluster (see `kubernetes`); with a model store
    of kind s3 the version is written to the bucket and the InferenceService reads it there."""

    target: Literal["kserve"]
    runs_image: ClassVar[bool] = True
    kubernetes: KubernetesSpec = KubernetesSpec()
    model_store: ModelStoreSpec = Field(
        default_factory=default_store,
        description="kind s3: the InferenceService's storageUri is this bucket",
    )


@TARGETS.register
class KServe(DeployTarget):
    Spec = KServeDeploy
    spec: KServeDeploy

    def _storage(
        self, repository: str, model_name: str, version: str, files: dict[str, str]
    ) -> str | None:
        kube, store = self.spec.kubernetes, self.spec.model_store
        if kube.storage_uri:
            return kube.storage_uri
        if store.storage_uri():
            store.prepare()
            store.put_version(repository, model_name, version, expected_files(files, model_name))
            return store.storage_uri()
        return storage_uri_for(kube, Registry().version(self.registry_model, version).source)

    def _manifests(
        self, model_name: str, version: str, image_reference: str, storage: str | None, folder: str
    ) -> tuple[dict[str, dict[str, Any]], list[str]]:
        """`version`'s manifests rendered, checked and written to `k8s/<folder>/` under the work
        directory; raises (naming them) when the InferenceService has no model repository or
        no cluster is configured to apply them to."""
        kube = self.spec.kubernetes
        served = k8s.Served(self.release, model_name, version, image_reference, storage)
        objs = k8s.render(served, kube, self.spec.openai)
        k8s.check_manifests(objs)
        written = k8s.write(objs, Path(self.work) / "k8s" / folder)
        if kube.workload == "inferenceservice" and storage is None:
            raise DeployError(
                "an InferenceService needs a model repository the cluster can read: set "
                "deploy.kubernetes.storage_uri (s3://..., gs://..., pvc://...), a "
                "deploy.model_store of kind s3, or run MLflow with an object-store artifact "
                f"root; the manifests are rendered in {Path(written[0]).parent}"
            )
        if k8s.configured_cluster(kube) is None:
            raise k8s.no_cluster_error(kube, written)
        return objs, written

    def _endpoint(self, version: str) -> Endpoint:
        """Where the pipeline reaches the served model (the smoke test's endpoint)."""
        kube = self.spec.kubernetes
        http, grpc = endpoints(self.release, kube)
        endpoint = Endpoint(
            name=f"{kube.workload} {kube.namespace}/{self.release}",
            http=http,
            grpc=grpc,
            version=version,
        )
        api = openai_endpoint(self.release, kube, self.spec.openai)
        if api:
            endpoint["openai"] = api
        return endpoint

    def _roll_out(
        self, objs: dict[str, dict[str, Any]], version: str, check: Check | None = None
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any] | None], Endpoint]:
        """Apply the workload's objects, wait until they serve and run `check` on them; on any
        failure re-apply what the cluster held before (deleting what it did not) and raise.
        Returns (applied, before, endpoint)."""
        kube = self.spec.kubernetes
        kinds = (
            ["InferenceService"]
            if kube.workload == "inferenceservice"
            else ["Deployment", "Service", "HorizontalPodAutoscaler"]
        )
        applied = [objs[k] for k in kinds]
        before = k8s.current(applied, kube)
        endpoint = self._endpoint(version)
        try:
            k8s.apply(applied, kube)
            if kube.workload == "inferenceservice":
                k8s.wait_inference_service(self.release, kube, self.spec.ready_timeout_s)
            else:
                _wait_deployment(self.release, kube, self.spec.ready_timeout_s)
            if check is not None:
                check(endpoint)
        except Exception:
            k8s.restore(applied, before, kube)
            raise
        return applied, before, endpoint

    def deploy(
        self,
        repository: str,
        model_name: str,
        version: str,
        files: dict[str, str],
        image: dict[str, Any],
        check: Check,
    ) -> Deployment:
        kube = self.spec.kubernetes
        if not image.get("reference"):
            raise DeployError(
                "deploy.target 'kserve' runs the release's image, but no image was built: "
                f"{image.get('skipped', 'unknown reason')}"
            )
        storage = self._storage(repository, model_name, version, files)
        objs, written = self._manifests(model_name, version, image["reference"], storage, version)
        applied, before, endpoint = self._roll_out(objs, version)
        return Deployment(
            target=self.name,
            model_name=model_name,
            version=version,
            endpoints=[endpoint],
            state={
                "workload": kube.workload,
                "namespace": kube.namespace,
                "name": self.release,
                "image": image["reference"],
                "storage_uri": storage,
                "manifests": written,
                "applied": applied,
                "before": before,
            },
            reused=False,
        )

    def _recorded(self, version: str) -> tuple[str, str | None]:
        """(image reference, model repository) `version` was deployed with: as the manifests
        its deploy (or an earlier restore) wrote say, else as its MLflow version records."""
        for folder in (version, f"{version}-restore"):
            written = Path(self.work) / "k8s" / folder / "inferenceservice.yaml"
            if written.is_file():
                isvc = yaml.safe_load(written.read_text())
                model = isvc["spec"]["predictor"]["model"]
                if k8s.served_version(isvc) == version and "@sha256:" in model.get("image", ""):
                    storage = model.get("storageUri")
                    return model["image"], None if storage == k8s.NO_STORAGE else storage
        from mlflow.exceptions import MlflowException

        try:
            mv = Registry().version(self.registry_model, version)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise
            raise DeployError(
                f"{self.registry_model} has no version {version} in MLflow, and "
                f"{Path(self.work) / 'k8s' / version} holds no manifests of it: "
                "give a version that was released (--to VERSION)"
            ) from None
        reference = (mv.tags or {}).get(IMAGE_TAG)
        if not reference:
            raise DeployError(
                f"{self.registry_model} version {version} has no recorded image to run: its "
                f"MLflow version has no {IMAGE_TAG!r} tag and {Path(self.work) / 'k8s' / version}"
                " holds no manifests of it (it was released to a target that runs no image, or "
                "its image was never pushed). Release it again with deploy.target kserve, or "
                "roll back to a version that has one (--to VERSION)"
            )
        kube, store = self.spec.kubernetes, self.spec.model_store
        return reference, kube.storage_uri or store.storage_uri() or storage_uri_for(
            kube, mv.source
        )

    def restore(self, model_name: str, version: str, check: Check) -> list[str]:
        """`version` applied again, pinned to its own image digest and model repository, and
        checked on the endpoint a deploy's smoke test uses; a failure re-applies what served
        before. The workload rolls over as a deploy's does (a Deployment's new pods are ready
        before old ones go; KServe moves traffic once the new revision is Ready), so `check`
        runs once `version` alone serves. Returns the version that served before, as its
        objects said."""
        reference, storage = self._recorded(version)
        try:
            objs, _ = self._manifests(model_name, version, reference, storage, f"{version}-restore")
        except DeployError as exc:  # nothing applied: say so in the rollback's terms
            raise DeployError(
                f"{self.registry_model} version {version} is not served again "
                f"and the champion alias stays where it is: {exc} (the rollback "
                "moves the alias only once it has applied them and version "
                f"{version} passed its smoke test)"
            ) from None
        _, before, endpoint = self._roll_out(objs, version, check)
        stopped = sorted(
            {v for v in map(k8s.served_version, before) if v and v != version},
            key=lambda v: (len(v), v),
        )
        step_logger().info(
            "rollback: %s serves version %s again (%s)%s",
            endpoint["name"],
            version,
            reference,
            f"; version {', '.join(stopped)} stopped" if stopped else "",
        )
        return stopped

    def watch_points(self) -> list[WatchPoint]:
        """The served model's endpoints (as the smoke test reaches them), and Triton's metrics
        where the ServiceMonitor has Prometheus scrape them: the rendered Service's port of that
        name. A deploy applies that Service with workload deployment; with an InferenceService
        it is only rendered (KServe's predictor Service carries port 80 alone). No version is at
        hand: the manifests are rendered with a placeholder image, which neither the Service nor
        the ServiceMonitor carries."""
        kube = self.spec.kubernetes
        placeholder = f"{self.release}@sha256:{'0' * 64}"
        objs = k8s.render(k8s.Served(self.release, self.release, "0", placeholder), kube)
        endpoint = self._endpoint("")
        point = WatchPoint(
            name=endpoint["name"],
            http=endpoint["http"],
            grpc=endpoint["grpc"],
            metrics=k8s.metrics_url(objs),
        )
        if endpoint.get("openai"):
            point["openai"] = endpoint["openai"]
        return [point]

    def rollback(self, deployment: Deployment) -> None:
        state = deployment["state"]
        k8s.restore(state["applied"], state["before"], self.spec.kubernetes)

    def summary(self, deployment: Deployment) -> dict[str, Any]:
        out = super().summary(deployment)
        state = deployment["state"]
        out["kubernetes"] = {
            k: state[k]
            for k in ("workload", "namespace", "name", "image", "storage_uri", "manifests")
        }
        return out
