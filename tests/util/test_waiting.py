"""Waiting for something to become true: a predicate polled until true or a deadline, errors
while starting counted as "not yet", a process that exited ending the wait at once."""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
import time

import pytest

from hf2triton.errors import DeployError
from hf2triton.util.net import free_port
from hf2triton.util.waiting import http_ok, wait_for, wait_until


def test_wait_until_polls_until_true_counting_errors_as_not_yet():
    calls = []

    def ready() -> bool:
        calls.append(1)
        if len(calls) < 3:
            raise ConnectionRefusedError("still starting")
        return len(calls) >= 4

    assert wait_until(ready, timeout_s=10, interval_s=0.01)
    assert len(calls) == 4


def test_wait_until_gives_up_after_the_timeout():
    started = time.monotonic()
    assert not wait_until(lambda: False, timeout_s=0.2, interval_s=0.02)
    assert 0.2 <= time.monotonic() - started < 5


def test_wait_until_stops_at_once_when_the_process_exited():
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(7)"])
    proc.wait()
    started = time.monotonic()
    assert not wait_until(lambda: False, timeout_s=60, interval_s=0.01, proc=proc)
    assert time.monotonic() - started < 5


def test_wait_for_says_what_did_not_happen():
    with pytest.raises(DeployError, match=r"^Triton did not load the model within 0s$"):
        wait_for(lambda: False, 0.1, "Triton did not load the model", interval_s=0.02)
    proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    proc.wait()
    with pytest.raises(TimeoutError, match=r"tritonserver: its process exited with code 3"):
        wait_for(lambda: False, 60, "tritonserver", proc=proc, error=TimeoutError)
    wait_for(lambda: True, 0.1, "never raised")


class _Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        self.send_response(200 if self.path == "/v2/health/ready" else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


def test_http_ok_is_true_only_for_a_200():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert http_ok(f"{base}/v2/health/ready")
        assert not http_ok(f"{base}/v2/health/live")  # 503
    finally:
        server.shutdown()
        server.server_close()
    assert not http_ok(f"http://127.0.0.1:{free_port()}/", timeout_s=1)  # nothing listens
