"""One tritonserver of the GPU check on the unpacked repository: started in its own process
group, waited for, asked for its log's errors, stopped."""

from __future__ import annotations

import http.client
import os
import re
import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Triton:
    """One tritonserver on the repository, HTTP only, in its own process group."""

    def __init__(self, triton: Path, repo: Path, model: str, env: dict[str, str], log_file: Path):
        self.port = free_port()
        self.model, self.log_file = model, log_file
        server = triton / "pytriton" / "tritonserver"
        cmd = [
            str(server / "bin" / "tritonserver"),
            f"--model-repository={repo}",
            f"--backend-directory={server / 'backends'}",
            "--http-address=127.0.0.1",
            f"--http-port={self.port}",
            "--allow-grpc=false",
            "--allow-metrics=false",
            "--strict-readiness=true",
        ]
        with open(log_file, "ab") as out:
            self.proc = subprocess.Popen(
                cmd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )

    def ready(self) -> bool:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=2)
            conn.request("GET", f"/v2/models/{self.model}/ready")
            ok = conn.getresponse().status == 200
            conn.close()
            return ok
        except OSError:
            return False

    def wait_ready(self, timeout_s: float) -> float:
        started = time.monotonic()
        while not self.ready():
            if self.proc.poll() is not None or time.monotonic() - started > timeout_s:
                why = (
                    f"exited with {self.proc.returncode}"
                    if self.proc.poll() is not None
                    else f"not ready in {timeout_s:.0f} s"
                )
                raise RuntimeError(f"tritonserver {why}:\n{self.errors()}")
            time.sleep(0.25)
        return time.monotonic() - started

    def errors(self, tail: int = 5) -> str:
        """The log's error lines and model states (what failed to load, and why), then its end."""
        text = self.log_file.read_text(errors="replace") if self.log_file.exists() else ""
        lines = text.splitlines()
        wanted = [ln for ln in lines if re.match(r"E\d{4} ", ln) or "UNAVAILABLE" in ln]
        return "\n".join([*wanted[:12], "...", *lines[-tail:]])

    def stop(self) -> None:
        for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
            try:
                os.killpg(self.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.proc.wait(wait_s)
                return
            except subprocess.TimeoutExpired:
                continue
