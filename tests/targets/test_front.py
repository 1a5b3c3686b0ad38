"""The docker target's front on a real Docker engine, with two small HTTP servers standing in for
Triton containers (Python's http.server in the test base image; one answers slowly and streams):
a switch moves new requests, a request in flight and a streamed answer finish on the old one,
`drain` waits for them, and a restarted front still routes where it last did."""

from __future__ import annotations

import os
import threading
import time
import urllib.request

import pytest

from hf2triton.targets.front import Front, address, front_image

pytestmark = pytest.mark.e2e
PREFIX = f"hf2triton-fronttest{os.getpid()}"
# A server naming itself on every answer; /slow streams 20 chunks over 10 s.
SERVER = """
import http.server, os, time
NAME = os.environ["NAME"].encode()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_GET(self):
        self.send_response(200)
        if self.path == "/slow":
            self.send_header("Transfer-Encoding", "chunked"); self.end_headers()
            for _ in range(20):
                time.sleep(0.5)
                self.wfile.write(b"%x\\r\\n%s\\r\\n" % (len(NAME), NAME)); self.wfile.flush()
            self.wfile.write(b"0\\r\\n\\r\\n")
        else:
            self.send_header("Content-Length", str(len(NAME))); self.end_headers()
            self.wfile.write(NAME)
http.server.ThreadingHTTPServer(("", 8000), H).serve_forever()
"""


@pytest.fixture(scope="module")
def engine(docker_env, docker_client):
    yield docker_client, docker_env.base_image
    for c in docker_client.containers.list(all=True, filters={"name": PREFIX}):
        c.remove(force=True)
    for n in docker_client.networks.list(names=[f"{PREFIX}-net"]):
        n.remove()


def _server(client, front: Front, base_image: str, name: str):
    alias = f"{PREFIX}-{name}"
    endpoint = client.api.create_endpoint_config(aliases=[alias])
    found = client.containers.run(
        base_image,
        ["python3", "-c", SERVER],
        name=alias,
        detach=True,
        environment={"NAME": name},
        network=front.ensure_network(),
        networking_config={front.network: endpoint},
    )
    return found, alias


def test_a_switch_moves_new_requests_and_lets_the_old_finish(engine):
    from tests.conftest import free_port

    client, base_image = engine
    port = free_port()
    front = Front(client, PREFIX, "127.0.0.1", {"http": port})
    blue, blue_alias = _server(client, front, base_image, "blue")
    green, green_alias = _server(client, front, base_image, "green")
    url = f"http://127.0.0.1:{port}"

    def get(path: str = "/") -> str:
        with urllib.request.urlopen(url + path, timeout=10) as r:
            return r.read().decode()

    front.start(front_image(client, base_image), blue_alias)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # the server container starts Python
        try:
            assert get() == "blue"
            break
        except OSError:
            time.sleep(0.2)
    assert front.serving() == blue_alias
    slow: list[str] = []
    started = threading.Thread(target=lambda: slow.append(get("/slow")))
    started.start()
    deadline = time.monotonic() + 10
    while front.in_flight(blue_alias) != 1:  # the streamed answer is under way on blue
        assert time.monotonic() < deadline, "the streamed answer never reached blue"
        time.sleep(0.05)
    assert front.route(green_alias, address(green, front.network)) == blue_alias
    assert {get() for _ in range(6)} == {"green"}, "new requests go to the new container"
    assert started.is_alive(), "the streamed answer is still under way when drain starts"
    assert front.drain(blue_alias, 30) == 0
    started.join(5)  # drained: the answer is all sent
    assert slow == ["blue" * 20], "the answer in flight finished, whole, on the old container"
    # A front the engine restarts reads the routes it was last given.
    client.containers.get(front.name).restart(timeout=5)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            assert get() == "green"
            break
        except OSError:
            time.sleep(0.2)
    assert get() == "green" and front.serving() == green_alias
    # And back, as a rollback does: the old container takes new requests again.
    assert front.route(blue_alias, address(blue, front.network)) == green_alias
    assert {get() for _ in range(4)} == {"blue"}
