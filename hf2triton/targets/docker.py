"""Target `docker`: the release's serving image, run by digest on this machine's Docker engine
with its ports bound to the spec's host (127.0.0.1 by default), replaced blue/green.

`deploy`: the new image first runs as a *candidate* on free ports and must load and pass the
smoke check there while the old container keeps serving on the spec's ports. Only then is the old
container stopped (kept, renamed `-previous`) and the new image started on the spec's ports; if
it does not come up, the old one is put back. Between stopping the old and the new one answering
there is a gap of one model load (a few seconds), reported as `switch_seconds`. The smoke test
then runs on the live container; `rollback` puts `-previous` back. `retire` keeps it, stopped,
as `-rollback` until the next release replaces it: `restore` (the watch, `hf2triton rollback`)
switches back to its image blue/green the same way, candidate first.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from hf2triton.clients import docker as engine_client
from hf2triton.clients.credentials import DockerAuth
from hf2triton.clients.triton import TritonAdmin
from hf2triton.errors import DeployError, Hf2TritonError
from hf2triton.image import ImageSpec, registry_auth
from hf2triton.targets.base import (
    TARGETS,
    Check,
    Deployment,
    DeployTarget,
    PublishedSection,
    WatchPoint,
)
from hf2triton.targets.smoke import Endpoint
from hf2triton.util.runs import step_logger

LABEL_RELEASE = "io.hf2triton.release"
LABEL_ROLE = "io.hf2triton.role"
LABEL_VERSION = "io.hf2triton.mlflow.model-version"
LABEL_IMAGE = "io.hf2triton.image"


def container_names(release: str) -> tuple[str, str, str]:
    """(live, candidate, previous) names; $HF2TRITON_CONTAINER_PREFIX keeps apart releases of the
    same name sharing one engine (e.g. test sessions side by side)."""
    base = f"{os.environ.get('HF2TRITON_CONTAINER_PREFIX') or 'hf2triton'}-{release}"
    return base, f"{base}-candidate", f"{base}-previous"


def labels(release: str, version: str, reference: str, role: str) -> dict[str, str]:
    return {
        LABEL_RELEASE: release,
        LABEL_VERSION: version,
        LABEL_IMAGE: reference,
        LABEL_ROLE: role,
    }


def described(container: Any, name: str) -> dict[str, str]:
    """What a container serves, as a deployment's state records it."""
    return {
        "name": name,
        "id": container.id[:12],
        "image": container.labels.get(LABEL_IMAGE, "?"),
        "version": container.labels.get(LABEL_VERSION, "?"),
    }


def rollback_name(release: str) -> str:
    """The stopped container kept after a promotion, for a rollback."""
    return f"{container_names(release)[0]}-rollback"


def keep(client: Any, release: str, stopped: Any) -> None:
    """`stopped` (the container a switch replaced) becomes the one kept for a rollback; the one
    kept before it goes."""
    if stopped is None:
        return
    engine_client.remove(engine_client.container(client, rollback_name(release)))
    stopped.rename(rollback_name(release))


def recover(client: Any, live_name: str, prev_name: str) -> None:
    """Finish what an interrupted switch left: a `-previous` container without a live one is put
    back; one beside a live container is no longer needed."""
    prev, live = (
        engine_client.container(client, prev_name),
        engine_client.container(client, live_name),
    )
    if prev is None:
        return
    if live is None:
        prev.rename(live_name)
        prev.start()
        step_logger().warning(
            "deploy: put back container %s that an interrupted deploy had stopped", live_name
        )
    else:
        engine_client.remove(prev)


def status(release: str) -> dict[str, Any]:
    """The live container of a release: name, image, version, state and health."""
    c = engine_client.container(engine_client.engine(), container_names(release)[0])
    if c is None:
        return {"running": False}
    return {
        "running": c.status == "running",
        "name": c.name,
        "id": c.id[:12],
        "image": c.labels.get(LABEL_IMAGE),
        "version": c.labels.get(LABEL_VERSION),
        "health": c.attrs.get("State", {}).get("Health", {}).get("Status"),
    }


class DockerDeploy(PublishedSection):
    """`target: docker`: the release's image, run by digest, replaced blue/green. The image
    carries its model, so it reads no model store."""

    target: Literal["docker"]
    runs_image: ClassVar[bool] = True


@TARGETS.register
class DockerContainers(DeployTarget):
    Spec = DockerDeploy
    spec: DockerDeploy

    def watch_points(self) -> list[WatchPoint]:
        return [self.spec.watch_point("docker container")]

    def _endpoint(self, urls: dict[str, str], version: str, what: str) -> Endpoint:
        endpoint = Endpoint(name=what, http=urls["http"], grpc=urls["grpc"], version=version)
        if urls.get("openai"):
            endpoint["openai"] = f"http://{urls['openai']}/v1"
        return endpoint

    def _ports(self, fixed: bool) -> dict[str, int | None]:
        """The container's published ports: the spec's, or free ones (a candidate's)."""
        spec = self.spec
        ports: dict[str, int | None] = {
            "http": spec.http_port,
            "grpc": spec.grpc_port,
            "metrics": spec.metrics_port,
        }
        if spec.openai.enabled:
            ports["openai"] = spec.openai.port
        return ports if fixed else {k: None for k in ports}

    def deploy(
        self,
        repository: str,
        model_name: str,
        version: str,
        files: dict[str, str],
        image: dict[str, Any],
        check: Check,
    ) -> Deployment:
        import docker.errors

        if not image.get("reference"):
            raise DeployError(
                "deploy.target 'docker' runs the release's image, but no image "
                f"was built: {image.get('skipped', 'unknown reason')}"
            )
        reference = image["reference"]
        client = engine_client.engine()
        engine_client.pull(client, reference, _registry_auth(self.image, reference.split("/")[0]))
        step_logger().info("deploy: pulled %s from the registry", reference)
        rollout = _Rollout(client, reference, model_name, version)
        try:
            return self._roll_out(rollout, check)
        except docker.errors.APIError as exc:
            raise engine_client.engine_error(
                exc, "run the release's containers", DeployError
            ) from None

    def _roll_out(self, rollout: _Rollout, check: Check) -> Deployment:
        """The live container replaced by `rollout`'s image (candidate first when one serves),
        or kept when it runs that image already."""
        logger = step_logger()
        client = rollout.client
        live_name, cand_name, prev_name = container_names(self.release)
        recover(client, live_name, prev_name)
        engine_client.remove(engine_client.container(client, cand_name))  # a leftover
        old = engine_client.container(client, live_name)
        if old is not None and old.status != "running":
            logger.info("deploy: container %s is %s; replacing it", live_name, old.status)
            engine_client.remove(old)
            old = None
        if old is not None and old.labels.get(LABEL_IMAGE) == rollout.reference:
            urls = engine_client.published(old, self.spec.host)
            _wait_ready(rollout, old, urls, 10)
            logger.info("deploy: %s already serves %s", live_name, rollout.reference)
            return self._deployment(rollout, old, urls, None, 0.0, reused=True)
        previous = None if old is None else described(old, live_name)
        if previous is not None:  # an old container serves
            self._check_candidate(rollout, cand_name, previous, check)
        new, urls, switch = self._switch(rollout, old, previous)
        return self._deployment(rollout, new, urls, previous, switch, reused=False)

    def _container(self, rollout: _Rollout, name: str, role: str) -> engine_client.Container:
        """The run of `rollout`'s image as the live container (restarted by the engine) or as
        the candidate."""
        return engine_client.Container(
            reference=rollout.reference,
            name=name,
            labels=labels(self.release, rollout.version, rollout.reference, role),
            restart=role == "live",
            environment=self.spec.openai.container_environment(),
        )

    def _switch(
        self, rollout: _Rollout, old: Any, previous: dict[str, str] | None
    ) -> tuple[Any, dict[str, str], float]:
        """Blue to green on the spec's ports: the old container stopped and kept as `-previous`,
        the rollout's image started live; if it does not come up, the old one is put back.
        Returns the new container, its URLs and the gap clients saw (seconds)."""
        import docker.errors

        spec = self.spec
        live_name, _, prev_name = container_names(self.release)
        switched = time.monotonic()  # the gap clients see: the old stops, the new loads
        if old is not None:
            old.stop(timeout=20)
            old.rename(prev_name)
        new = None
        try:
            new = engine_client.run(
                rollout.client,
                self._container(rollout, live_name, "live"),
                spec.host,
                self._ports(fixed=True),
            )
            urls = engine_client.published(new, spec.host)
            _wait_ready(rollout, new, urls, spec.ready_timeout_s)
        except (Hf2TritonError, docker.errors.APIError) as exc:
            engine_client.remove(
                new if new is not None else engine_client.container(rollout.client, live_name)
            )
            put_back = ""
            if old is not None:
                assert previous is not None  # described whenever an old container serves
                old.rename(live_name)
                old.start()
                put_back = f"; container {live_name} (version {previous['version']}) was put back"
            if isinstance(exc, docker.errors.APIError):  # e.g. a spec port already taken
                raise DeployError(
                    f"could not run {rollout.reference} on {spec.host} ports {spec.http_port}/"
                    f"{spec.grpc_port}/{spec.metrics_port}: {engine_client.short(exc)}"
                    f"{put_back}"
                ) from None
            raise type(exc)(f"{exc}{put_back}") from None
        return new, urls, round(time.monotonic() - switched, 2)

    def _check_candidate(
        self, rollout: _Rollout, cand_name: str, previous: dict[str, str], check: Check
    ) -> None:
        """Green: the new image on free ports, smoke-checked while the old one keeps serving."""
        logger = step_logger()
        cand = engine_client.run(
            rollout.client,
            self._container(rollout, cand_name, "candidate"),
            self.spec.host,
            self._ports(fixed=False),
        )
        try:
            urls = engine_client.published(cand, self.spec.host)
            logger.info(
                "deploy: candidate %s on %s; %s (version %s) keeps serving",
                cand_name,
                urls["http"],
                previous["name"],
                previous["version"],
            )
            _wait_ready(rollout, cand, urls, self.spec.ready_timeout_s)
            figures = check(
                self._endpoint(urls, rollout.version, f"candidate container {cand_name}")
            )
            logger.info(
                "deploy: smoke on the candidate passed (%s)",
                ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if not k.endswith("_ms")),
            )
        except Hf2TritonError as exc:
            raise type(exc)(
                f"{exc} -- the new image was removed; container {previous['name']} "
                f"(version {previous['version']}) keeps serving"
            ) from None
        finally:
            engine_client.remove(cand)
        logger.info(
            "deploy: candidate passed; switching %s to version %s",
            previous["name"],
            rollout.version,
        )

    def _deployment(
        self,
        rollout: _Rollout,
        live: Any,
        urls: dict[str, str],
        previous: dict[str, str] | None,
        switch: float,
        reused: bool,
    ) -> Deployment:
        return Deployment(
            target=self.name,
            model_name=rollout.model_name,
            version=rollout.version,
            endpoints=[self._endpoint(urls, rollout.version, f"container {live.name}")],
            state={
                "container_name": live.name,
                "container_id": live.id,
                "image": rollout.reference,
                "http_url": urls["http"],
                "grpc_url": urls["grpc"],
                "metrics_url": urls["metrics"],
                "previous": previous,
                "switch_seconds": switch,
            },
            reused=reused,
        )

    def rollback(self, deployment: Deployment) -> None:
        """The live container failed its smoke test: put `-previous` back (or stop serving)."""
        client = engine_client.engine()
        live_name, _, prev_name = container_names(self.release)
        engine_client.remove(engine_client.container(client, live_name))
        prev = engine_client.container(client, prev_name)
        if prev is not None:
            prev.rename(live_name)
            prev.start()

    def retire(self, deployment: Deployment) -> list[str]:
        """The replaced container stays, stopped, as `-rollback` (what `restore` starts again
        after promotion, by the watch or `hf2triton rollback`) until the next release replaces
        it; the one kept before it is removed."""
        previous = deployment["state"]["previous"]
        client = engine_client.engine()
        _, _, prev_name = container_names(self.release)
        keep(client, self.release, engine_client.container(client, prev_name))
        if previous:
            step_logger().info(
                "deploy: %s serves version %s; version %s (%s) is stopped and kept for a rollback",
                deployment["state"]["container_name"],
                deployment["version"],
                previous["version"],
                previous["image"],
            )
        return [previous["version"]] if previous else []

    def restore(self, model_name: str, version: str, check: Check) -> list[str]:
        """Blue/green back to the kept container's image: it runs as a candidate on free ports
        and passes `check` while the live one serves on; then the switch (one model load, as a
        deploy's). The replaced container is kept in turn, so the rollback can be undone."""
        import docker.errors

        client = engine_client.engine()
        live_name, cand_name, prev_name = container_names(self.release)
        kept = engine_client.container(client, rollback_name(self.release))
        held = kept.labels.get(LABEL_VERSION) if kept is not None else None
        if held != str(version):
            raise DeployError(
                f"no container of {self.release} version {version} is kept on this Docker "
                f"engine ({'it keeps version ' + held if held else 'none is kept'}): release "
                f"version {version} again instead"
            )
        assert kept is not None  # it holds the version asked for
        reference = kept.labels[LABEL_IMAGE]
        try:
            recover(client, live_name, prev_name)
            old = engine_client.container(client, live_name)
            if old is None or old.status != "running":
                raise DeployError(
                    f"container {live_name} does not run: nothing to roll back "
                    f"from; `docker start {live_name}` or release again"
                )
            previous = described(old, live_name)
            rollout = _Rollout(client, reference, model_name, version)
            self._check_candidate(rollout, cand_name, previous, check)
            new, _, switch = self._switch(rollout, old, previous)
            engine_client.remove(kept)
            keep(client, self.release, engine_client.container(client, prev_name))
        except docker.errors.APIError as exc:
            raise engine_client.engine_error(
                exc, "roll the release's container back", DeployError
            ) from None
        step_logger().info(
            "rollback: %s serves version %s again (%s; switch %.1f s); version "
            "%s is stopped and kept",
            new.name,
            version,
            reference,
            switch,
            previous["version"],
        )
        return [previous["version"]]

    def summary(self, deployment: Deployment) -> dict[str, Any]:
        out = super().summary(deployment)
        state = deployment["state"]
        out["container"] = {
            k: state[k]
            for k in ("container_name", "container_id", "image", "switch_seconds", "previous")
        }
        return out


@dataclass(frozen=True)
class _Rollout:
    """What a deploy or a restore puts live: the image `reference` (by digest), which serves
    `model_name` `version`, on the Docker engine `client`."""

    client: Any
    reference: str
    model_name: str
    version: str


def _wait_ready(rollout: _Rollout, container: Any, urls: dict[str, str], timeout_s: float) -> None:
    """Until the container's Triton serves the rollout's version (it fails early if the
    container exits)."""

    def ready() -> bool:
        with TritonAdmin(urls["http"], timeout_s=5.0) as admin:
            return admin.model_ready(rollout.model_name, rollout.version)

    engine_client.wait_ready(
        container, ready, rollout.model_name, rollout.version, time.monotonic() + timeout_s
    )


def _registry_auth(image: Any, registry: str) -> DockerAuth | None:
    return registry_auth(image or ImageSpec(), registry)
