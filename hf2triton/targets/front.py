"""The `docker` target's stable front: HAProxy (Debian's package) in a container of the
deployment, on the spec's ports, in front of the release's Triton containers on a network of
their own. Clients keep their connections to the front; a switch moves new requests to the new
container through HAProxy's runtime API (no reload, no connection closed) while requests in
flight, gRPC streams and server-sent events included, finish on the old one, which then stops.

Two server slots per protocol, `a` and `b`: one serves, the other takes the next container. A
container is named to the front by its network alias (stable across the renames the target
does); HAProxy resolves it through Docker's DNS, so a container the engine restarts with a new
address is found again. The routes are also written into the front's configuration, which a
restarted front reads.
"""

from __future__ import annotations

import hashlib
import io
import json
import secrets
import shlex
import tarfile
import time
from dataclasses import dataclass
from typing import Any

from hf2triton.clients import docker as engine_client
from hf2triton.errors import DeployError
from hf2triton.targets.balancer import stat_rows
from hf2triton.util.runs import step_logger

SLOTS = ("a", "b")
# What HAProxy's runtime API says when a `set server` did what it was told (else it says why not).
SET_OK = ("changed its FQDN", "IP changed from", "no need to change")
CONFIG_DIR = "/usr/local/etc/hf2triton-front"
SOCKET = f"{CONFIG_DIR}/admin.sock"
# The Triton containers' ports by protocol; the front listens on the same ones inside.
PORTS = {**engine_client.CONTAINER_PORTS, "openai": engine_client.API_PORT}
DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
RUN apt-get update -qq \\
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends haproxy socat \\
 && rm -rf /var/lib/apt/lists/*
LABEL io.hf2triton.role="front"
"""


@dataclass
class Routes:
    """Which container alias each slot names, and the slot that takes new requests."""

    a: str = ""
    b: str = ""
    active: str = "a"

    def alias(self, slot: str) -> str:
        return str(getattr(self, slot))

    def slot_of(self, alias: str) -> str | None:
        return next((s for s in SLOTS if self.alias(s) == alias), None)

    def idle(self) -> str:
        return SLOTS[1 - SLOTS.index(self.active)]


def config(routes: Routes, protocols: list[str]) -> str:
    """haproxy.cfg: a frontend and a backend per protocol (gRPC over HTTP/2), the slots
    resolved by Docker's DNS, the inactive one disabled."""
    lines = [
        "global",
        f"  stats socket {SOCKET} mode 600 level admin",
        "  hard-stop-after 10m",
        "defaults",
        "  mode http",
        "  option dontlognull",
        "  timeout connect 5s",
        # Generation streams and long transcriptions run for minutes; idle clients are closed.
        "  timeout client 10m",
        "  timeout server 10m",
        "  timeout http-keep-alive 2m",
        "  option redispatch 1",
        "  retry-on conn-failure empty-response",
        "  retries 3",
        "resolvers docker",
        "  nameserver dns 127.0.0.11:53",
        "  hold valid 1s",
        "  hold nx 1s",
        "  timeout resolve 1s",
    ]
    for proto in protocols:
        h2 = " proto h2" if proto == "grpc" else ""
        lines += [f"frontend {proto}", f"  bind :{PORTS[proto]}{h2}", f"  default_backend {proto}"]
        lines += [f"backend {proto}"]
        for slot in SLOTS:
            alias = routes.alias(slot) or "127.0.0.1"  # an IPv4 placeholder, disabled
            off = "" if slot == routes.active and routes.alias(slot) else " disabled"
            lines.append(
                f"  server {slot} {alias}:{PORTS[proto]}{h2} resolvers docker "
                f"init-addr last,libc,none{off}"
            )
    return "\n".join(lines) + "\n"


def _done(line: str) -> bool:
    """Whether a line of HAProxy's answer to `set server` says it did so."""
    return any(ok in line for ok in SET_OK)


def new_alias(base: str, version: str) -> str:
    """A container's name on the front's network: unique, and kept through renames."""
    return f"{base}-v{version}-{secrets.token_hex(3)}"


class Front:
    """The front of one release on one Docker engine: its container, network and routes."""

    def __init__(self, client: Any, base: str, host: str, ports: dict[str, int]):
        """`ports`: the spec's port of each protocol the front serves (http, grpc, metrics and
        openai when the API runs)."""
        self.client, self.host, self.ports = client, host, ports
        self.protocols = list(ports)
        self.name, self.network = f"{base}-front", f"{base}-net"

    # ---- the pieces -------------------------------------------------------------------------

    def ensure_network(self) -> str:
        import docker.errors

        try:
            self.client.networks.get(self.network)
        except docker.errors.NotFound:
            self.client.networks.create(self.network, driver="bridge", labels={"io.hf2triton": "1"})
        return self.network

    def container(self) -> Any | None:
        return engine_client.container(self.client, self.name)

    def running(self) -> bool:
        found = self.container()
        return found is not None and found.status == "running"

    def routes(self) -> Routes:
        found = self.container()
        if found is None:
            return Routes()
        done = found.exec_run(["cat", f"{CONFIG_DIR}/routes.json"])
        return Routes(**json.loads(done.output)) if done.exit_code == 0 else Routes()

    def serving(self) -> str:
        """The alias new requests go to ("" when no front runs)."""
        routes = self.routes()
        return routes.alias(routes.active) if self.running() else ""

    def admin(self, *commands: str) -> str:
        """HAProxy's runtime API, through the front's admin socket (one exec)."""
        found = self.container()
        if found is None:
            raise DeployError(f"the front container {self.name} is gone; release again")
        script = "; ".join(commands)
        done = found.exec_run(["sh", "-c", f"echo {shlex.quote(script)} | socat stdio {SOCKET}"])
        out = done.output.decode("utf-8", "replace")
        said = [ln for ln in out.splitlines() if ln.strip()]
        bad = [] if script.startswith("show") else [ln for ln in said if not _done(ln)]
        if done.exit_code != 0 or bad:
            raise DeployError(
                f"the front {self.name} refused `{script}`: {' '.join(bad or said)[:500]}"
            )
        return out

    # ---- start and switch -------------------------------------------------------------------

    def start(self, image: str, alias: str) -> None:
        """The front, routing to `alias`, on the spec's ports (the engine restarts it)."""
        routes = Routes(a=alias, active="a")
        engine_client.remove(self.container())
        found = self.client.containers.create(
            image,
            ["haproxy", "-W", "-db", "-f", f"{CONFIG_DIR}/haproxy.cfg"],
            name=self.name,
            labels={"io.hf2triton.role": "front"},
            network=self.ensure_network(),
            ports={f"{PORTS[p]}/tcp": (self.host, port) for p, port in self.ports.items()},
            restart_policy={"Name": "unless-stopped"},
        )
        self._write(found, routes)
        found.start()
        deadline = time.monotonic() + 30
        while "BACKEND" not in self._stat_or_empty():
            found.reload()
            if found.status != "running" or time.monotonic() > deadline:
                raise DeployError(
                    f"the front {self.name} did not start: {engine_client.logs_tail(found)}"
                )
            time.sleep(0.1)

    def route(self, alias: str, address: str) -> str:
        """New requests go to `alias` (at `address` on the front's network) from now on; the
        container that took them drains. Returns its alias ("" when there was none)."""
        routes = self.routes()
        before = routes.alias(routes.active)
        if before == alias:
            return ""
        slot = routes.idle()
        for proto in self.protocols:
            self.admin(f"set server {proto}/{slot} fqdn {alias}")
        self._resolved(slot, address)
        # One exec, each backend flipped by two commands back to back: no moment in which
        # both containers take new requests, or neither does.
        self.admin(
            *(
                cmd
                for proto in self.protocols
                for cmd in (
                    f"set server {proto}/{slot} state ready",
                    f"set server {proto}/{routes.active} state drain",
                )
            )
        )
        setattr(routes, slot, alias)
        routes.active = slot
        found = self.container()
        assert found is not None  # admin() found it
        self._write(found, routes)
        return before

    def _resolved(self, slot: str, address: str, timeout_s: float = 15.0) -> None:
        """Wait until HAProxy resolved `slot`'s name to `address` on every backend (Docker's
        DNS, asked each second); the old container serves meanwhile."""
        deadline = time.monotonic() + timeout_s
        while True:
            # "be_id be_name srv_id srv_name srv_addr ...", one line a server of every backend
            seen = {
                f[1]: f[4]
                for ln in self.admin("show servers state").splitlines()
                if len(f := ln.split()) > 4 and f[3] == slot
            }
            if all(seen.get(proto) == address for proto in self.protocols):
                return
            if time.monotonic() > deadline:
                raise DeployError(
                    f"the front {self.name} did not resolve the new container to {address} "
                    f"within {timeout_s:g} s (it has {seen}); the old container keeps serving"
                )
            time.sleep(0.1)

    def in_flight(self, alias: str) -> int:
        """Requests and streams open on `alias`'s slot, over every protocol."""
        slot = self.routes().slot_of(alias)
        return 0 if slot is None else self._open(slot)

    def _open(self, slot: str) -> int:
        rows = stat_rows(self._stat_or_empty())
        return sum(int(r.get("scur") or 0) for r in rows if r.get("svname") == slot)

    def drain(self, alias: str, timeout_s: float) -> int:
        """Wait until nothing is in flight on `alias`, at most `timeout_s`; its slot is then put
        in maintenance. Returns what was still open at the deadline (0: drained)."""
        routes = self.routes()
        slot = routes.slot_of(alias)
        if slot is None:
            return 0
        deadline = time.monotonic() + timeout_s
        left = self._open(slot)
        while left and time.monotonic() < deadline:
            time.sleep(0.1)
            left = self._open(slot)
        if routes.active != slot:
            self.admin(*(f"set server {proto}/{slot} state maint" for proto in self.protocols))
        return left

    def _stat_or_empty(self) -> str:
        import docker.errors

        try:
            return self.admin("show stat")
        except (DeployError, docker.errors.APIError):  # not up yet, or restarting
            return ""

    def _write(self, found: Any, routes: Routes) -> None:
        """The configuration and routes into the front's container (read at its next start)."""
        files = {
            "haproxy.cfg": config(routes, self.protocols),
            "routes.json": json.dumps(routes.__dict__),
        }
        buf = io.BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for name, text in files.items():
                data = text.encode()
                info = tarfile.TarInfo(f"hf2triton-front/{name}")
                info.size, info.mode = len(data), 0o644
                tar.addfile(info, io.BytesIO(data))
        if not found.put_archive("/usr/local/etc", buf.getvalue()):
            raise DeployError(f"could not write the front's configuration into {self.name}")


def front_image(client: Any, base_image: str) -> str:
    """The front's image, built once per engine on the serving image's base (Debian's haproxy
    and socat from its archive)."""
    import docker.errors

    key = hashlib.sha256(f"{base_image}\n{DOCKERFILE}".encode()).hexdigest()[:12]
    tag = f"hf2triton/front:haproxy-{key}"
    try:
        client.images.get(tag)
        return tag
    except docker.errors.ImageNotFound:
        pass
    step_logger().info("deploy: building the front's image %s on %s", tag, base_image)
    try:
        client.images.build(
            fileobj=io.BytesIO(DOCKERFILE.encode()),
            tag=tag,
            buildargs={"BASE_IMAGE": base_image},
            rm=True,
            forcerm=True,
            pull=False,
        )
    except docker.errors.BuildError as exc:
        log = "\n".join(str(c.get("stream", "")).rstrip() for c in exc.build_log)[-1500:]
        raise DeployError(
            f"could not build the front's image on {base_image} (it installs Debian's haproxy "
            f"and socat with apt): {exc.msg}\n{log}\nSet deploy.front.image to an image with "
            "haproxy and socat, or deploy.front.enabled: false"
        ) from None
    return tag


def address(found: Any, network: str) -> str:
    """`found`'s IP address on `network`."""
    found.reload()
    net = found.attrs["NetworkSettings"]["Networks"].get(network) or {}
    if not net.get("IPAddress"):
        raise DeployError(f"container {found.name} has no address on network {network}")
    return str(net["IPAddress"])
