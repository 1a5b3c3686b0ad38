"""Target `triton-replicas`: one rollout across N Triton servers, all forward or all back.

Each replica gets the new version beside the one it serves (the local target's steps); every
replica must then list the version READY in its repository index and pass the smoke test on its
own endpoints. If any replica fails, every replica is put back to what it served before, so a
load balancer in front never mixes versions for long (the failure mode of rollouts that reach
only some replicas). Replicas may share one repository (a mount, or one S3 bucket): each distinct
repository is written once, with a version policy that keeps what any of its replicas serves.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from hf2triton.clients.triton import TritonAdmin
from hf2triton.errors import DeployError, ServiceUnavailableError
from hf2triton.stores import ModelStoreSpec, default_store
from hf2triton.targets.balancer import ReplicasFront, ReplicasFrontSpec
from hf2triton.targets.base import (
    TARGETS,
    Check,
    Deployment,
    DeploySection,
    DeployTarget,
    WatchPoint,
)
from hf2triton.targets.local import (
    expected_files,
    load_on,
    on_each,
    repository_key,
    restore_on,
    restore_on_servers,
    retire_on,
    set_version_policy,
)
from hf2triton.targets.smoke import Endpoint
from hf2triton.util.specbase import SpecPath, Strict


def _serving(replica: Any, model_name: str) -> list[str]:
    """The versions a replica serves now; a silent replica stops the rollout before anything
    changed."""
    with TritonAdmin(replica.http) as admin:
        try:
            if not admin.live():
                raise ConnectionError("not live")
            return admin.serving_versions(model_name)
        except Exception as exc:  # noqa: BLE001 - tritonclient raises several types here
            raise ServiceUnavailableError(
                f"replica {replica.http} did not answer ({str(exc)[:200]}): nothing was changed "
                "on any replica; start it or remove it from deploy.replicas"
            ) from None


ENDPOINT_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$")


class ReplicaSpec(Strict):
    """One Triton server of a replica set (`deploy.target: triton-replicas`): its endpoints, and
    its model repository as this machine sees it (a local path, or a shared mount). Replicas may
    share one repository; the release writes each distinct repository once."""

    http: str = Field(description="host:port of the replica's HTTP endpoint")
    grpc: str = Field(description="host:port of the replica's gRPC endpoint")
    model_repository: SpecPath | None = Field(
        None,
        description="the replica's --model-repository, as a path on this machine; leave "
        "out when the replicas read deploy.model_store (kind s3)",
    )
    metrics: str | None = Field(
        None,
        description="host:port of the replica's Prometheus metrics (Triton's "
        "--metrics-port): the watch reads its failures and latency there; default: the HTTP "
        "endpoint's host on 8002",
    )
    openai: str | None = Field(
        None,
        description="host:port of the OpenAI-compatible API beside the replica (the "
        "serving image starts one on 9000; `python -m hf2triton_openai` elsewhere): the smoke "
        "test and the watch go through it too",
    )

    def endpoint(self, version: str) -> Endpoint:
        found = Endpoint(
            name=f"replica {self.http}", http=self.http, grpc=self.grpc, version=version
        )
        if self.openai:
            found["openai"] = f"http://{self.openai}/v1"
        return found

    def watch_point(self) -> WatchPoint:
        """Where the watch reads this replica's metrics and probes it."""
        metrics = self.metrics or f"{self.http.rsplit(':', 1)[0]}:8002"
        point = WatchPoint(
            name=f"replica {self.http}",
            http=self.http,
            grpc=self.grpc,
            metrics=f"http://{metrics}/metrics",
        )
        if self.openai:
            point["openai"] = f"http://{self.openai}/v1"
        return point

    @field_validator("http", "grpc", "metrics", "openai")
    @classmethod
    def _check_endpoint(cls, v: str | None) -> str | None:
        if v is not None and not ENDPOINT_PATTERN.match(v):
            raise ValueError(f"{v!r} is not an endpoint such as '10.0.0.5:8000' (host:port)")
        return v


class ReplicasDeploy(DeploySection):
    """`target: triton-replicas`: the Triton servers listed, all rolled forward or all back."""

    target: Literal["triton-replicas"]
    replicas: list[ReplicaSpec] = Field(
        min_length=1, description="the servers to roll out to: {http, grpc, model_repository}"
    )
    model_store: ModelStoreSpec = Field(
        default_factory=default_store,
        description="a store every replica reads (kind s3), "
        "or each replica's own model_repository (kind local)",
    )
    front: ReplicasFrontSpec | None = Field(
        None,
        description="a front on this machine (Debian's HAProxy) that clients connect to: it "
        "spreads requests over the ready replicas, and a request that a lost replica refused "
        "or dropped is sent to another; leave out when a load balancer of your own fronts them",
    )

    @model_validator(mode="after")
    def _repositories(self) -> ReplicasDeploy:
        shared = self.model_store.shared
        odd = [r.http for r in self.replicas if (r.model_repository is None) != shared]
        if odd:
            raise ValueError(
                f"deploy.replicas {odd}: "
                + (
                    "with deploy.model_store kind s3 every replica reads the bucket: leave out "
                    "model_repository"
                    if shared
                    else "each replica needs model_repository (a path on this machine), or set "
                    "deploy.model_store kind s3 for replicas that read one bucket"
                )
            )
        endpoints = [r.http for r in self.replicas]
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"deploy.replicas lists an endpoint twice: {endpoints}")
        if self.front and self.front.openai_port:
            missing = [r.http for r in self.replicas if not r.openai]
            if missing:
                raise ValueError(
                    f"deploy.front.openai_port: replicas {missing} name no `openai` endpoint "
                    "for the front to send the OpenAI-compatible API's requests to"
                )
        return self

    def front_endpoint(self, version: str) -> Endpoint | None:
        """The front as a smoke test's endpoint (None without a front)."""
        if self.front is None:
            return None
        host, ports = self.front.host, self.front.ports()
        found = Endpoint(
            name=f"front {host}:{ports['http']}",
            http=f"{host}:{ports['http']}",
            grpc=f"{host}:{ports['grpc']}",
            version=version,
        )
        if "openai" in ports:
            found["openai"] = f"http://{host}:{ports['openai']}/v1"
        return found

    def endpoints(self, version: str) -> list[Endpoint]:
        """Where the smoke test asks: the front first (what the summary names), then every
        replica."""
        front = self.front_endpoint(version)
        return ([front] if front else []) + [r.endpoint(version) for r in self.replicas]


@TARGETS.register
class TritonReplicas(DeployTarget):
    Spec = ReplicasDeploy
    spec: ReplicasDeploy

    def _restore_all(self, deployment: Deployment) -> list[str]:
        """Every replica back to what it served; returns the replicas that did not answer."""
        failed = []
        for server in deployment["state"]["servers"]:
            try:
                restore_on(server, deployment["model_name"], deployment["version"])
            except Exception:  # noqa: BLE001 - keep restoring the others; report this one
                failed.append(server["http"])
        return failed

    def deploy(
        self,
        repository: str,
        model_name: str,
        version: str,
        files: dict[str, str],
        image: dict[str, Any],
        check: Check,
    ) -> Deployment:
        spec, store = self.spec, self.spec.model_store
        opened = [(r, _serving(r, model_name)) for r in spec.replicas]
        if spec.front is not None:  # before any change: a front that cannot start stops here
            ReplicasFront(model_name).ensure(spec.front, spec.replicas)
        servers = [
            {
                "http": r.http,
                "grpc": r.grpc,
                "model_repository": store.triton_uri() or str(r.model_repository),
                "previous_versions": [v for v in serving if v != version],
                "model_store": store.describe(),
            }
            for r, serving in opened
        ]
        deployment = Deployment(
            target=self.name,
            model_name=model_name,
            version=version,
            endpoints=spec.endpoints(version),
            state={"servers": servers},
            reused=False,
        )
        if all(version in serving for _, serving in opened):
            deployment["reused"] = True  # a re-run: every replica serves this version already
            return deployment
        try:
            store.prepare()
            self._write(Path(repository) / model_name, deployment, files)
            failures = [
                f
                for f in on_each(
                    servers, lambda s: load_on(s, model_name, version, spec.ready_timeout_s)
                )
                if f
            ]
        except BaseException:
            self._restore_all(deployment)
            raise
        if failures:
            raise self._not_loaded(deployment, failures)
        return deployment

    def _write(self, source: Path, deployment: Deployment, files: dict[str, str]) -> None:
        """The version from `source` into each distinct repository the replicas read, with a
        version policy that keeps what any of its replicas serves."""
        model_name, version = deployment["model_name"], deployment["version"]
        expected = expected_files(files, model_name)
        want = {k: v for k, v in expected.items() if k.startswith("1/")}
        shared: dict[str, list[dict[str, Any]]] = {}
        for server in deployment["state"]["servers"]:
            root = server["model_repository"]
            shared.setdefault(repository_key(root), []).append(server)
        for root, group in shared.items():
            if not root.startswith("s3://") and not Path(root).is_dir():
                raise DeployError(
                    f"the model repository {root} of replica {group[0]['http']} does not "
                    "exist on this machine: mount it, or fix "
                    "deploy.replicas[].model_repository"
                )
            folder = self.spec.model_store.model_dir(model_name, root)
            if folder.version_files(version) != want:
                folder.put_version(source, version, expected)
            keep = sorted({v for s in group for v in s["previous_versions"]} | {version}, key=int)
            set_version_policy(folder, keep)

    def _not_loaded(self, deployment: Deployment, failures: list[str]) -> DeployError:
        """Every replica rolled back after `failures` (one per replica that failed), and the
        error that says so."""
        unrestored = self._restore_all(deployment)
        servers = deployment["state"]["servers"]
        before = sorted({v for s in servers for v in s["previous_versions"]}, key=int)
        return DeployError(
            f"{deployment['model_name']} version {deployment['version']} failed to load on "
            f"{len(failures)} of {len(servers)} replicas ({'; '.join(failures)}). Rolled back "
            "on every replica"
            + (f": version {', '.join(before)} keeps serving" if before else "")
            + (f"; could not reach {unrestored} to roll back" if unrestored else "")
            + ". Fix the failing replica (its log says why) and run the release again."
        )

    def retire(self, deployment: Deployment) -> list[str]:
        retired: set[str] = set()
        for server in deployment["state"]["servers"]:
            retired.update(retire_on(server, deployment["model_name"], deployment["version"]))
        return sorted(retired, key=int)

    def rollback(self, deployment: Deployment) -> None:
        self._restore_all(deployment)

    def watch_points(self) -> list[WatchPoint]:
        return [r.watch_point() for r in self.spec.replicas]

    def restore(self, model_name: str, version: str, check: Check) -> list[str]:
        """Every replica back to `version`, all or none, as a rollout goes forward (through
        the front too, started again if it was stopped)."""
        store = self.spec.model_store
        if self.spec.front is not None:
            ReplicasFront(model_name).ensure(self.spec.front, self.spec.replicas)
        servers = [
            {
                "http": r.http,
                "grpc": r.grpc,
                "model_repository": store.triton_uri() or str(r.model_repository),
                "model_store": store.describe(),
            }
            for r in self.spec.replicas
        ]
        return restore_on_servers(
            servers,
            model_name,
            version,
            check,
            self.spec.ready_timeout_s,
            self.spec.endpoints(version),
        )

    def summary(self, deployment: Deployment) -> dict[str, Any]:
        out = super().summary(deployment)
        out["endpoint"]["replicas"] = [
            {
                "http": e["http"],
                "grpc": e["grpc"],
                **({"openai": e["openai"]} if e.get("openai") else {}),
            }
            for e in deployment["endpoints"]
            if not e["name"].startswith("front ")
        ]
        return out
