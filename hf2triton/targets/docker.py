"""Target `docker`: the release's serving image, run by digest on this machine's Docker engine,
behind a stable front (hf2triton/targets/front.py: HAProxy in a container of the deployment, on
the spec's ports, 127.0.0.1 by default), replaced blue/green with no gap.

`deploy`: the new image first runs as a *candidate* beside the serving container, on the front's
network and on free ports of its own, and must load and pass the smoke check there. Only then
does the front move new requests to it (HAProxy's runtime API: clients keep their connections);
the old container keeps serving what it has in flight and stays up, as `-previous`, while the
smoke test runs on the live endpoint. `retire` waits until nothing is in flight on the old one
(`deploy.front.drain_timeout_s`), stops it and keeps it, stopped, as `-rollback` until the next
release replaces it; `rollback` moves the front back to `-previous`. `restore` (the watch,
`hf2triton rollback`) runs the kept container's image as a candidate and switches back the same
way. `deploy.front.enabled: false` gives the plain blue/green of before: the live container on
the spec's ports, with a gap of one model load at each switch (`switch_seconds`).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from pydantic import Field

from hf2triton.clients import docker as engine_client
from hf2triton.clients.credentials import DockerAuth
from hf2triton.clients.triton import TritonAdmin
from hf2triton.errors import DeployError, Hf2TritonError
from hf2triton.image import ImageSpec, registry_auth
from hf2triton.image.variants import variant_for
from hf2triton.targets.base import (
    TARGETS,
    Check,
    Deployment,
    DeployTarget,
    PublishedSection,
    WatchPoint,
)
from hf2triton.targets.front import Front, address, front_image, new_alias
from hf2triton.targets.smoke import Endpoint
from hf2triton.util.runs import step_logger
from hf2triton.util.specbase import Strict

LABEL_RELEASE = "io.hf2triton.release"
LABEL_ROLE = "io.hf2triton.role"
LABEL_VERSION = "io.hf2triton.mlflow.model-version"
LABEL_IMAGE = "io.hf2triton.image"
LABEL_ALIAS = "io.hf2triton.front-alias"  # the container's name on the front's network


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


def base_image(image: ImageSpec | None) -> str:
    """The serving image's base, which the front's image is built on."""
    spec = image or ImageSpec()
    return (
        os.environ.get("HF2TRITON_BASE_IMAGE") or spec.base_image or variant_for("cpu").base_image
    )


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


def recover(client: Any, live_name: str, prev_name: str, front: Front | None = None) -> None:
    """Finish what an interrupted switch left: a `-previous` container without a live one is put
    back (and the front routed to it); one beside a live container is no longer needed (the
    front routes to the live one)."""
    prev, live = (
        engine_client.container(client, prev_name),
        engine_client.container(client, live_name),
    )
    if prev is None:
        return
    kept = live if live is not None else prev
    if live is None:
        prev.rename(live_name)
        prev.start()
        step_logger().warning(
            "deploy: put back container %s that an interrupted deploy had stopped", live_name
        )
    alias = kept.labels.get(LABEL_ALIAS)
    if front is not None and alias and front.running():
        front.route(alias, address(kept, front.network))
    if live is not None:
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


class FrontSpec(Strict):
    """The stable front the docker target's clients connect to (HAProxy)."""

    enabled: bool = Field(
        True,
        description="put HAProxy in a container on the spec's ports and switch versions behind "
        "it with no gap; false: the live container takes the ports itself and each switch "
        "refuses connections for one container start",
    )
    image: str | None = Field(
        None,
        description="an image with haproxy and socat for the front; default: built once on "
        "this engine from the serving image's base, with Debian's packages",
    )
    drain_timeout_s: float = Field(
        120.0,
        gt=0,
        le=3600,
        description="after a switch, how long the old container may finish what it has in "
        "flight (streams included) before it stops",
    )


class DockerDeploy(PublishedSection):
    """`target: docker`: the release's image, run by digest behind a stable front, replaced
    blue/green. The image carries its model, so it reads no model store."""

    target: Literal["docker"]
    front: FrontSpec = Field(default_factory=FrontSpec)
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

    def _front(self, client: Any) -> Front | None:
        """The release's front (None when `deploy.front.enabled` is false)."""
        if not self.spec.front.enabled:
            return None
        ports = {k: int(v or 0) for k, v in self._ports(fixed=True).items()}
        return Front(client, container_names(self.release)[0], self.spec.host, ports)

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
        front = self._front(client)
        recover(client, live_name, prev_name, front)
        engine_client.remove(engine_client.container(client, cand_name))  # a leftover
        old = engine_client.container(client, live_name)
        if old is not None and old.status != "running":
            logger.info("deploy: container %s is %s; replacing it", live_name, old.status)
            engine_client.remove(old)
            old = None
        if old is not None and old.labels.get(LABEL_IMAGE) == rollout.reference:
            alias = old.labels.get(LABEL_ALIAS, "")
            if front is None or (alias and front.running()):
                if front is not None and front.serving() != alias:
                    front.route(alias, address(old, front.network))
                urls = self._urls(old, front)
                _wait_ready(rollout, old, engine_client.published(old, self.spec.host), 10)
                logger.info("deploy: %s already serves %s", live_name, rollout.reference)
                return self._deployment(rollout, old, urls, None, 0.0, reused=True)
        previous = None if old is None else described(old, live_name)
        if front is None:
            if previous is not None:  # an old container serves: check the new one beside it
                engine_client.remove(self._candidate(rollout, cand_name, previous, check))
            new, urls, switch = self._switch(rollout, old, previous)
        else:
            new = self._candidate(rollout, cand_name, previous, check)
            switch = self._cut_over(rollout, front, new, old)
            urls = self._urls(new, front)
        return self._deployment(rollout, new, urls, previous, switch, reused=False)

    def _urls(self, live: Any, front: Front | None) -> dict[str, str]:
        """Where clients reach the live version: the front's ports, or the container's own."""
        if front is None:
            return engine_client.published(live, self.spec.host)
        return {k: f"{self.spec.host}:{port}" for k, port in front.ports.items()}

    def _container(
        self, rollout: _Rollout, name: str, role: str, front: Front | None
    ) -> engine_client.Container:
        """The run of `rollout`'s image as the live container (restarted by the engine) or as
        the candidate; behind a front, on its network under an alias of its own."""
        alias = new_alias(container_names(self.release)[0], rollout.version) if front else ""
        return engine_client.Container(
            reference=rollout.reference,
            name=name,
            labels={
                **labels(self.release, rollout.version, rollout.reference, role),
                **({LABEL_ALIAS: alias} if alias else {}),
            },
            restart=role == "live",
            environment=self.spec.openai.container_environment(),
            network=front.ensure_network() if front else "",
            alias=alias,
        )

    def _switch(
        self, rollout: _Rollout, old: Any, previous: dict[str, str] | None
    ) -> tuple[Any, dict[str, str], float]:
        """Without a front: blue to green on the spec's ports, the old container stopped and
        kept as `-previous`, the rollout's image started live; if it does not come up, the old
        one is put back. Returns the new container, its URLs and the gap clients saw (s)."""
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
                self._container(rollout, live_name, "live", None),
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

    def _candidate(
        self, rollout: _Rollout, name: str, previous: dict[str, str] | None, check: Check
    ) -> Any:
        """Green: the new image on free ports (and on the front's network), ready, and
        smoke-checked while the old one keeps serving (when one does). Removed if it fails."""
        logger = step_logger()
        front = self._front(rollout.client)
        role = "candidate" if front is None else "live"
        cand = engine_client.run(
            rollout.client,
            self._container(rollout, name, role, front),
            self.spec.host,
            self._ports(fixed=False),
        )
        try:
            urls = engine_client.published(cand, self.spec.host)
            _wait_ready(rollout, cand, urls, self.spec.ready_timeout_s)
            if previous is None:
                return cand
            logger.info(
                "deploy: candidate %s on %s; %s (version %s) keeps serving",
                name,
                urls["http"],
                previous["name"],
                previous["version"],
            )
            figures = check(self._endpoint(urls, rollout.version, f"candidate container {name}"))
            logger.info(
                "deploy: smoke on the candidate passed (%s)",
                ", ".join(f"{k} {v:.4g}" for k, v in figures.items() if not k.endswith("_ms")),
            )
        except Hf2TritonError as exc:
            engine_client.remove(cand)
            if previous is None:
                raise
            raise type(exc)(
                f"{exc} -- the new image was removed; container {previous['name']} "
                f"(version {previous['version']}) keeps serving"
            ) from None
        except BaseException:
            engine_client.remove(cand)
            raise
        logger.info("deploy: candidate passed; switching to version %s", rollout.version)
        return cand

    def _cut_over(self, rollout: _Rollout, front: Front, new: Any, old: Any) -> float:
        """The front moves new requests to `new` (started when none runs); `old` keeps what it
        has in flight, renamed `-previous`, and `new` takes the live name. Returns the gap
        clients saw: none behind a running front; one front start when `old` held the spec's
        ports itself (a deployment of before the front)."""
        import docker.errors

        live_name, _, prev_name = container_names(self.release)
        alias = new.labels[LABEL_ALIAS]
        started = time.monotonic()
        legacy = old is not None and not old.labels.get(LABEL_ALIAS)
        try:
            if legacy:
                old.stop(timeout=20)  # it holds the spec's ports: one gap, this once
            if front.running():
                front.route(alias, address(new, front.network))
            else:
                image = self.spec.front.image or front_image(rollout.client, base_image(self.image))
                front.start(image, alias)
        except (Hf2TritonError, docker.errors.APIError) as exc:
            engine_client.remove(new)
            put_back = ""
            if legacy:
                engine_client.remove(front.container())
                old.start()
                put_back = f"; container {live_name} was put back"
            raise DeployError(
                f"the front {front.name} could not switch to version {rollout.version}: "
                f"{engine_client.short(exc)}{put_back}"
            ) from None
        gap = round(time.monotonic() - started, 2) if legacy else 0.0
        if old is not None:
            old.rename(prev_name)
        new.rename(live_name)
        new.reload()  # its name, as the deployment's state records it
        step_logger().info(
            "deploy: the front %s sends new requests to version %s%s",
            front.name,
            rollout.version,
            f" (moved from a container on the ports: {gap:.1f} s gap)" if legacy else "",
        )
        return gap

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
                "front": self.spec.front.enabled,
            },
            reused=reused,
        )

    def rollback(self, deployment: Deployment) -> None:
        """The live version failed its smoke test: the front back to `-previous`, which never
        stopped (without a front, or from a container of before it: `-previous` started
        again on the spec's ports)."""
        client = engine_client.engine()
        live_name, _, prev_name = container_names(self.release)
        live = engine_client.container(client, live_name)
        prev = engine_client.container(client, prev_name)
        front = self._front(client)
        if prev is None:
            engine_client.remove(live)
            return
        alias = prev.labels.get(LABEL_ALIAS)
        if front is not None and alias and front.running() and prev.status == "running":
            front.route(alias, address(prev, front.network))
            if live is not None:
                front.drain(live.labels.get(LABEL_ALIAS, ""), 10)
            engine_client.remove(live)
        else:
            engine_client.remove(live)
            if front is not None:
                engine_client.remove(front.container())
            prev.start()
        prev.rename(live_name)

    def _retire_previous(self, client: Any) -> None:
        """`-previous` finishes what it has in flight (behind the front), stops, and is kept
        as `-rollback`; the one kept before it is removed."""
        _, _, prev_name = container_names(self.release)
        prev = engine_client.container(client, prev_name)
        if prev is None:
            return
        front, alias = self._front(client), prev.labels.get(LABEL_ALIAS)
        if front is not None and alias and front.running() and prev.status == "running":
            waited = time.monotonic()
            left = front.drain(alias, self.spec.front.drain_timeout_s)
            step_logger().info(
                "deploy: %s drained in %.1f s%s",
                prev_name,
                time.monotonic() - waited,
                f"; {left} request(s) still open at deploy.front.drain_timeout_s" if left else "",
            )
        prev.stop(timeout=20)
        keep(client, self.release, prev)

    def retire(self, deployment: Deployment) -> list[str]:
        """The replaced container drains, stops and stays as `-rollback` (what `restore`
        starts again after promotion, by the watch or `hf2triton rollback`) until the next
        release replaces it; the one kept before it is removed."""
        previous = deployment["state"]["previous"]
        self._retire_previous(engine_client.engine())
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
        """Blue/green back to the kept container's image: it runs as a candidate and passes
        `check` while the live one serves on; then the switch, as a deploy's (no gap behind
        the front). The replaced container is kept in turn, so the rollback can be undone."""
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
        front = self._front(client)
        try:
            recover(client, live_name, prev_name, front)
            old = engine_client.container(client, live_name)
            if old is None or old.status != "running":
                raise DeployError(
                    f"container {live_name} does not run: nothing to roll back "
                    f"from; `docker start {live_name}` or release again"
                )
            previous = described(old, live_name)
            rollout = _Rollout(client, reference, model_name, version)
            new = self._candidate(rollout, cand_name, previous, check)
            if front is None:
                engine_client.remove(new)
                new, _, switch = self._switch(rollout, old, previous)
            else:
                switch = self._cut_over(rollout, front, new, old)
            engine_client.remove(kept)
            self._retire_previous(client)
        except docker.errors.APIError as exc:
            raise engine_client.engine_error(
                exc, "roll the release's container back", DeployError
            ) from None
        step_logger().info(
            "rollback: %s serves version %s again (%s; gap %.1f s); version %s is stopped and kept",
            live_name,
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
