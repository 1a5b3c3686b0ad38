"""Where a load point's time goes on the serving side: each process's CPU during the measured
window (tritonserver, each Python-backend stub), and, when the kit carries py-spy, a sampled
profile of one stub (its Python frames, idle ones too: waiting shows as well as working).
Standard library only, as all of the check is."""

from __future__ import annotations

import os
import subprocess
import time
from collections import Counter
from pathlib import Path
from typing import Any

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def is_stub(name: str) -> bool:
    """A Python-backend stub (its name in /proc is cut at 15 characters)."""
    return name.startswith("triton_python")


def session_pids(sid: int) -> dict[int, str]:
    """Processes of one process session (tritonserver and the stubs it started): pid -> name."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2 :].split()
        if int(fields[3]) == sid:  # field 6 of stat: the session id
            name = text[text.index("(") + 1 : text.rindex(")")]
            found[int(stat.parent.name)] = name
    return found


def cpu_seconds(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / TICKS  # utime + stime


class ServerCpu:
    """The CPU each process of a server's session used between `start` and `stop`, in cores."""

    def __init__(self, sid: int):
        self.sid = sid
        self.before: dict[int, float] = {}
        self.names: dict[int, str] = {}
        self.t0 = 0.0

    def start(self) -> None:
        self.names = session_pids(self.sid)
        self.before = {p: c for p in self.names if (c := cpu_seconds(p)) is not None}
        self.t0 = time.monotonic()

    def stop(self) -> dict[str, Any]:
        wall = max(1e-6, time.monotonic() - self.t0)
        cores = {}
        for pid, c0 in self.before.items():
            c1 = cpu_seconds(pid)
            if c1 is not None:
                cores[pid] = round((c1 - c0) / wall, 3)
        stubs = sorted((v for p, v in cores.items() if is_stub(self.names[p])), reverse=True)
        server = sum(v for p, v in cores.items() if not is_stub(self.names[p]))
        return {"tritonserver_cores": round(server, 3), "stub_cores": stubs}


def stub_pids(sid: int) -> list[int]:
    return sorted(p for p, name in session_pids(sid).items() if is_stub(name))


def profile(py_spy: Path, pid: int, seconds: float, out: Path) -> dict[str, Any]:
    """py-spy's samples of one stub for `seconds` (idle frames kept): the share of samples in
    each function (anywhere on the stack, and at its top), the 25 largest of each."""
    cmd = [str(py_spy), "record", "-p", str(pid), "-d", str(max(1, int(seconds // 2)))]
    cmd += ["--idle", "-f", "raw", "-o", str(out)]
    # With the native frames first (where in ONNX Runtime the time goes; py-spy pauses the
    # process for each sample then, so the profiled point is the lighter one), else Python's.
    done = subprocess.run([*cmd, "--native", "-r", "100"], capture_output=True, text=True)
    native = done.returncode == 0 and out.is_file()
    if not native:
        done = subprocess.run([*cmd, "--nonblocking", "-r", "200"], capture_output=True, text=True)
    if done.returncode != 0 or not out.is_file():
        return {"error": (done.stderr or done.stdout)[-800:]}
    anywhere: Counter[str] = Counter()
    top: Counter[str] = Counter()
    libs: Counter[str] = Counter()  # the top frame's library (native) or file (Python)
    total = 0
    for line in out.read_text(errors="replace").splitlines():
        stack, _, n = line.rpartition(" ")
        if not n.isdigit():
            continue
        frames = stack.split(";")
        total += int(n)
        top[frames[-1]] += int(n)
        libs[frames[-1].rpartition("(")[2].rstrip(")").split(":")[0]] += int(n)
        for frame in set(frames):
            anywhere[frame] += int(n)

    def shares(c: Counter[str]) -> list[tuple[str, float]]:
        return [(f[:160], round(n / total, 3)) for f, n in c.most_common(25)]

    return {
        "samples": total,
        "native": native,
        "anywhere": shares(anywhere),
        "top": shares(top),
        "top_by_library": shares(libs),
    }
