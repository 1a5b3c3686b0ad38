"""Serves and measures a GPU release packed by benchmarks/gpu/pack.py, on the GPU machine itself
(no network; its python3 with PyTorch's CUDA libraries): verifies and joins the parts, sets up
a serving environment, starts tritonserver on the rendered repository at 1 instance and at the
rendered count, and prints one JSON object of what it measured (also $OUT/gpu-check.json).

    python3 benchmarks/gpu/check.py receive PART [PART...]   # verify, move to /tmp/gpu-kit
    python3 benchmarks/gpu/check.py run [--parts /tmp/gpu-kit] [--simulate-cpu]

`run --simulate-cpu` runs the same path on a CPU host (CPU provider, KIND_CPU, fewer clients and
seconds), so that everything but the GPU is tested in CI. Standard library only (what runs in
the serving environment imports numpy, onnxruntime and tokenizers there): this file runs under
the machine's own Python, whatever that holds.
"""

from __future__ import annotations

import argparse
import hashlib
import http.client
import json
import lzma
import math
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
import tarfile
import threading
import time
import traceback
import zipfile
from array import array
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import IO, Any

DEFAULT_PARTS = Path("/tmp/gpu-kit")
GOALS = {
    # issue 37: what a GPU release should reach on one H100
    "served_share_of_ort_limit": 0.5,  # served texts/s at 128 clients / ORT's batch-64 limit
    "gpu_busy": 0.8,  # NVML utilisation during that load
    "fp16_vs_fp32": 2.0,  # the shipped fp16 graph's compute against the plain fp32 graph's
    "min_cosine": 0.9999,  # served embeddings against PyTorch's, the worst text
}


class Refused(Exception):
    """The pack cannot be used as it is (a part damaged or missing): carry it again."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def log(msg: str) -> None:
    print(f"check: {msg}", file=sys.stderr, flush=True)


# ---- parts: receive, verify, join -----------------------------------------------------------


def read_manifest(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise Refused(f"no manifest at {path}: carry benchmarks/gpu/pack/manifest.json with a part")
    manifest: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return manifest


def verify_part(path: Path, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest's entry of the part at `path`, once its size and sha256 match it."""
    entry = next((p for p in manifest["parts"] if p["name"] == path.name), None)
    if entry is None:
        raise Refused(
            f"{path.name} is not a part of this pack (its parts: {', '.join(manifest['join'])}): "
            "is the manifest from another pack?"
        )
    if not path.is_file():
        raise Refused(f"{path.name} is missing from {path.parent}: carry it again")
    size, digest = path.stat().st_size, sha256_file(path)
    if size != entry["bytes"] or digest != entry["sha256"]:
        raise Refused(
            f"{path.name}: sha256 {digest[:16]}... ({size} bytes) does not match the manifest's "
            f"{entry['sha256'][:16]}... ({entry['bytes']} bytes): the part was damaged or is "
            "from another pack; carry it again"
        )
    return entry


def probe() -> dict[str, Any]:
    """What the machine offers that the check depends on, read in a second."""
    ldconfig = shutil.which("ldconfig") or "/sbin/ldconfig"
    try:
        found = subprocess.run([ldconfig, "-p"], capture_output=True, text=True).stdout
    except OSError:
        found = ""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    smi = shutil.which("nvidia-smi")
    gpus = subprocess.run([smi, "-L"], capture_output=True, text=True).stdout if smi else ""
    return {
        "python": platform.python_version(),
        "python_executable": sys.executable,
        f"libpython{version}_in_ldconfig": f"libpython{version}.so.1.0" in found,
        "gpus": [g for g in gpus.splitlines() if g.strip()],
        "cpus": os.cpu_count(),
        "nvidia_lib_dirs": len(nvidia_lib_dirs()),
    }


def receive(parts: list[Path], into: Path, manifest_path: Path | None) -> dict[str, Any]:
    """Check each part against the manifest and move it into `into` (files outside the working
    tree stay while the machine is warm), with the manifest; say which parts are still to come."""
    manifest_path = manifest_path or parts[0].parent / "manifest.json"
    manifest = read_manifest(manifest_path)
    into.mkdir(parents=True, exist_ok=True)
    held = into / "manifest.json"
    if held.is_file() and read_manifest(held)["bundle"]["sha256"] != manifest["bundle"]["sha256"]:
        for stale in into.glob("part-*"):  # an earlier pack's parts
            stale.unlink()
    if manifest_path.resolve() != held.resolve():
        shutil.copyfile(manifest_path, held)
    for part in parts:
        verify_part(part, manifest)
        if part.resolve() != (into / part.name).resolve():
            shutil.move(str(part), into / part.name)
    here = sorted(p.name for p in into.glob("part-*"))
    missing = [n for n in manifest["join"] if n not in here]
    return {"received": [p.name for p in parts], "here": here, "missing": missing, **probe()}


class Joined:
    """The parts read as one stream, in the manifest's order, hashed as they go by."""

    def __init__(self, folder: Path, names: list[str]):
        self.files = [folder / n for n in names]
        self.current: IO[bytes] | None = None
        self.hash = hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        out = b""
        while n < 0 or len(out) < n:
            if self.current is None:
                if not self.files:
                    break
                self.current = open(self.files.pop(0), "rb")
            block = self.current.read(-1 if n < 0 else n - len(out))
            if not block:
                self.current.close()
                self.current = None
                continue
            out += block
        self.hash.update(out)
        return out


def join_and_unpack(folder: Path, work: Path) -> dict[str, Any]:
    """Verify every part, then join them and unpack the bundle's members into `work`; the
    joined stream's sha256 is checked against the manifest's too."""
    manifest = read_manifest(folder / "manifest.json")
    missing = [n for n in manifest["join"] if not (folder / n).is_file()]
    if missing:
        raise Refused(f"parts missing from {folder}: {', '.join(missing)}: carry them")
    for name in manifest["join"]:
        verify_part(folder / name, manifest)
    shutil.rmtree(work, ignore_errors=True)
    (work / "bundle").mkdir(parents=True)
    stream = Joined(folder, manifest["join"])
    with tarfile.open(fileobj=stream, mode="r|") as tar:  # type: ignore[call-overload]
        for member in tar:
            if not member.isfile() or member.name.startswith("/") or ".." in member.name:
                raise Refused(f"the bundle holds an unexpected entry {member.name!r}")
            target = work / "bundle" / member.name
            target.parent.mkdir(parents=True, exist_ok=True)
            src = tar.extractfile(member)
            assert src is not None
            with open(target, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 20)
    stream.read()  # the tar's end padding, hashed too
    if stream.hash.hexdigest() != manifest["bundle"]["sha256"]:
        raise Refused("the joined parts do not give the manifest's bundle: carry the pack again")
    for name, want in manifest["members"].items():
        if sha256_file(work / "bundle" / name) != want["sha256"]:
            raise Refused(f"bundle member {name} does not match the manifest")
    return manifest


def untar(archive: Path, into: Path) -> None:
    into.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="tar")  # the pack's own archives: modes kept, no links out


# ---- the serving environment ----------------------------------------------------------------


def machine_site_packages() -> list[str]:
    return [
        p for p in sys.path if p.endswith(("site-packages", "dist-packages")) and Path(p).is_dir()
    ]


def nvidia_lib_dirs() -> list[str]:
    """PyTorch's CUDA libraries (site-packages nvidia/*/lib): ORT's CUDA provider runs on them."""
    found = []
    for site in machine_site_packages():
        found += sorted(str(p) for p in Path(site).glob("nvidia/*/lib") if any(p.glob("*.so*")))
    return found


def serving_env(work: Path, manifest: dict[str, Any]) -> Path:
    """A venv of this machine's Python (the Python-backend stub takes the first python3 on PATH,
    and ignores PYTHONPATH) holding the carried numpy<2 and onnxruntime, with a .pth to this
    machine's site-packages for the rest (tokenizers). Wheels are unzipped: it has no pip."""
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if version != manifest["python"]:
        raise Refused(
            f"the pack is for Python {manifest['python']} (its stub and wheels); this python3 "
            f"is {version}: pack with --python {version}"
        )
    venv = work / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = venv / "lib" / f"python{version}" / "site-packages"
    for wheel in sorted((work / "bundle" / "wheels").glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    lib = manifest["split_library"]
    target = site / lib["path"]
    target.parent.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256()
    with lzma.open(work / "bundle" / "ort-lib.xz") as src, open(target, "wb") as out:
        for block in iter(lambda: src.read(1 << 20), b""):
            h.update(block)
            out.write(block)
    if h.hexdigest() != lib["sha256"]:
        raise Refused(f"{lib['path']} unpacked does not match the manifest's sha256")
    (site / "machine-site-packages.pth").write_text("\n".join(machine_site_packages()) + "\n")
    return venv


def run_env(venv: Path, triton: Path) -> dict[str, str]:
    keep = ("HOME", "LANG", "TMPDIR", "USER", "CUDA_VISIBLE_DEVICES")
    env = {k: v for k, v in os.environ.items() if k in keep or k.startswith("LC_")}
    env["PATH"] = f"{venv / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    # The driver's libcuda, where the GPU machines mount it, if ldconfig does not know it.
    driver = [d for d in ("/usr/local/nvidia/lib64", "/usr/local/nvidia/lib") if Path(d).is_dir()]
    libs = [str(triton / "nvidia_pytriton.libs"), *nvidia_lib_dirs(), *driver]
    if os.environ.get("LD_LIBRARY_PATH"):
        libs.append(os.environ["LD_LIBRARY_PATH"])
    env["LD_LIBRARY_PATH"] = ":".join(libs)
    env["TOKENIZERS_PARALLELISM"] = "false"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def simulate_on_cpu(model_dir: Path) -> None:
    """The GPU repository made to load on a CPU host: KIND_CPU instances, ONNX Runtime's CPU
    provider (the serving core refuses a CUDA runtime that falls back to the CPU)."""
    config = model_dir / "config.pbtxt"
    config.write_text(config.read_text().replace("KIND_GPU", "KIND_CPU"))
    serving = model_dir / "1" / "serving.json"
    settings = json.loads(serving.read_text())
    runtime = settings.get("runtime") or {}
    settings["runtime"] = {
        "name": "onnxruntime",
        "device": "cpu",
        "precision": runtime.get("precision", "fp32"),
    }
    serving.write_text(json.dumps(settings, indent=1))


def set_instances(model_dir: Path, count: int) -> None:
    config = model_dir / "config.pbtxt"
    text, n = re.subn(
        r"(instance_group\s*\[\s*\{\s*count:\s*)\d+", rf"\g<1>{count}", config.read_text()
    )
    if n != 1:
        raise RuntimeError(f"{config} has no instance_group count to set")
    config.write_text(text)


# ---- tritonserver ---------------------------------------------------------------------------


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


# ---- HTTP clients ---------------------------------------------------------------------------


def infer_body(model: str, text: str) -> tuple[str, bytes]:
    body = {
        "inputs": [{"name": "TEXT", "shape": [1, 1], "datatype": "BYTES", "data": [text]}],
        "outputs": [{"name": "EMBEDDING", "parameters": {"binary_data": True}}],
    }
    return f"/v2/models/{model}/infer", json.dumps(body, ensure_ascii=False).encode()


def embedding_of(response: http.client.HTTPResponse, data: bytes) -> bytes:
    """The binary EMBEDDING of an answer (after its JSON header)."""
    header = int(response.getheader("Inference-Header-Content-Length") or len(data))
    return data[header:]


def clients_main(args: argparse.Namespace) -> int:
    """One client process: `threads` closed-loop clients until `start_at + seconds`, counting
    what completes inside [start_at, start_at + seconds]; prints one JSON line."""
    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    bodies = [infer_body(args.model, t) for t in texts]
    end = args.start_at + args.seconds
    lock = threading.Lock()
    done: dict[str, Any] = {"ok": 0, "errors": 0, "first_error": None, "latencies_ms": []}

    def client(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
        i = (k * 7919) % len(bodies)  # each client its own place in the texts
        mine: list[float] = []
        ok = errors = 0
        first = None
        while time.time() < end:
            path, body = bodies[i]
            i = (i + 1) % len(bodies)
            t0 = time.time()
            try:
                conn.request("POST", path, body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                good = response.status == 200
                if not good and first is None:
                    first = f"HTTP {response.status}"
            except (OSError, http.client.HTTPException) as exc:
                good, first = False, first or repr(exc)
                conn.close()
                conn = http.client.HTTPConnection("127.0.0.1", args.port, timeout=60)
            t1 = time.time()
            if args.start_at <= t1 <= end:
                if good:
                    ok += 1
                    mine.append((t1 - t0) * 1000)
                else:
                    errors += 1
        conn.close()
        with lock:
            done["ok"] += ok
            done["errors"] += errors
            done["first_error"] = done["first_error"] or first
            done["latencies_ms"] += mine

    threads = [threading.Thread(target=client, args=(k,)) for k in range(args.threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    print(json.dumps(done))
    return 0


class GpuMeter:
    """GPU utilisation sampled in a thread: NVML (pynvml), else nvidia-smi, else PyTorch."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.memory_mib: list[float] = []
        self.source, self.read = self._reader()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _reader() -> tuple[str | None, Any]:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)

            def nvml() -> tuple[float, float]:
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), used

            return "nvml", nvml
        except Exception:
            pass
        smi = shutil.which("nvidia-smi")
        if smi:
            query = [
                smi,
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
            ]

            def nvidia_smi() -> tuple[float, float]:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
                busy, used = out.splitlines()[0].split(",")
                return float(busy), float(used)

            return "nvidia-smi", nvidia_smi
        try:
            import torch

            if torch.cuda.is_available():
                return "torch", lambda: (float(torch.cuda.utilization(0)), float("nan"))
        except Exception:
            pass
        return None, None

    def start(self, at: float, until: float) -> None:
        self.samples, self.memory_mib = [], []
        self._stop.clear()

        def loop() -> None:
            while time.time() < at and not self._stop.is_set():
                time.sleep(0.01)
            while time.time() < until and not self._stop.is_set():
                busy, used = self.read()
                self.samples.append(busy)
                self.memory_mib.append(used)
                time.sleep(self.interval_s)

        if self.read is not None:
            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return {
            "mean": round(sum(ordered) / len(ordered) / 100, 3),
            "p50": round(ordered[len(ordered) // 2] / 100, 3),
            "max": round(ordered[-1] / 100, 3),
            "samples": len(ordered),
            "memory_mib_max": round(max(self.memory_mib), 1) if self.memory_mib else None,
            "source": self.source,
        }


def closed_loop(
    port: int,
    model: str,
    texts_file: Path,
    clients: int,
    seconds: float,
    warm_s: float,
    meter: GpuMeter | None,
) -> dict[str, Any]:
    """`clients` HTTP clients in a closed loop, one text per request, texts of every length, in
    several processes (one Python process's threads cannot keep a GPU server busy)."""
    procs_n = max(1, min(clients, 8, (os.cpu_count() or 2) // 2))
    start_at = time.time() + warm_s
    procs = []
    for k in range(procs_n):
        threads = clients // procs_n + (1 if k < clients % procs_n else 0)
        cmd = [
            sys.executable,
            __file__,
            "_clients",
            f"--port={port}",
            f"--model={model}",
            f"--texts={texts_file}",
            f"--threads={threads}",
            f"--start-at={start_at}",
            f"--seconds={seconds}",
        ]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True))
    if meter is not None:
        meter.start(start_at, start_at + seconds)
    results = [json.loads(p.communicate(timeout=seconds + warm_s + 120)[0]) for p in procs]
    gpu = meter.stop() if meter is not None else None
    ok = sum(r["ok"] for r in results)
    latencies = sorted(x for r in results for x in r["latencies_ms"])

    def pct(q: float) -> float | None:
        return (
            round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)
            if latencies
            else None
        )

    return {
        "clients": clients,
        "processes": procs_n,
        "seconds": seconds,
        "texts_per_s": round(ok / seconds, 1),
        "errors": sum(r["errors"] for r in results),
        "first_error": next((r["first_error"] for r in results if r["first_error"]), None),
        "p50_ms": pct(0.5),
        "p99_ms": pct(0.99),
        "gpu_busy": gpu,
    }


def served_embeddings(port: int, model: str, texts: list[str], threads: int = 8) -> list[bytes]:
    out: list[bytes] = [b""] * len(texts)

    def worker(k: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        for i in range(k, len(texts), threads):
            path, body = infer_body(model, texts[i])
            conn.request("POST", path, body, {"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            if response.status != 200:
                raise RuntimeError(f"text {i}: HTTP {response.status}: {data[:300]!r}")
            out[i] = embedding_of(response, data)
        conn.close()

    pool = [threading.Thread(target=worker, args=(k,)) for k in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    missing = [i for i, e in enumerate(out) if not e]
    if missing:
        raise RuntimeError(f"no embedding served for {len(missing)} texts (first: {missing[0]})")
    return out


def cosines(served: list[bytes], reference_file: Path, texts: list[str]) -> dict[str, Any]:
    """Cosine of each served embedding with PyTorch's (reference.f32: float32 rows, as pack.py
    wrote them); in plain Python, so that this process needs no numpy."""
    ref = array("f")
    ref.frombytes(reference_file.read_bytes())
    dim = len(ref) // len(texts)
    cos = []
    for i, blob in enumerate(served):
        got = array("f")
        got.frombytes(blob)
        if len(got) != dim:
            raise RuntimeError(f"text {i}: a served embedding of {len(got)} values, not {dim}")
        want = ref[i * dim : (i + 1) * dim]
        dot = sum(a * b for a, b in zip(got, want))
        norms = math.sqrt(sum(a * a for a in got)) * math.sqrt(sum(b * b for b in want))
        cos.append(dot / max(norms, 1e-12))
    worst = min(range(len(cos)), key=cos.__getitem__)
    return {
        "min": round(min(cos), 6),
        "mean": round(sum(cos) / len(cos), 6),
        "texts": len(texts),
        "worst_text": texts[worst][:80],
        "worst_text_chars": len(texts[worst]),
    }


# ---- ONNX Runtime in-process (run in the serving venv) --------------------------------------


def rate(calls: Sequence[Callable[[], Any]], sizes: list[int], seconds: float) -> float:
    """Texts/s of running every batch in turn for `seconds`, after a first pass per shape
    (allocations, kernel choices) that is not counted."""
    for call in calls:
        call()
    n, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        for call, size in zip(calls, sizes):
            call()
            n += size
    return round(n / (time.perf_counter() - started), 1)


def ort_main(args: argparse.Namespace) -> int:
    """ONNX Runtime's own rate on the graphs, in the serving environment: the texts tokenized
    ahead, sorted by length into batches of `batch`, each padded to its longest; texts/s with
    session.run (numpy in and out, as the serving core runs it) and with IO binding (inputs
    placed on the device ahead, outputs left there): the compute limit. Prints one JSON line."""
    import numpy as np
    import onnxruntime as ort
    from tokenizers import Tokenizer

    texts = json.loads(Path(args.texts).read_text(encoding="utf-8"))
    tok = Tokenizer.from_file(args.tokenizer)
    tok.no_padding()
    tok.enable_truncation(args.max_length)
    enc = sorted(tok.encode_batch(texts), key=lambda e: len(e.ids))
    batches = []
    for s in range(0, len(enc), args.batch):
        chunk = enc[s : s + args.batch]
        width = max(len(e.ids) for e in chunk)

        def pad(rows: list[list[int]], width: int = width) -> Any:
            return np.array([r + [0] * (width - len(r)) for r in rows], dtype=np.int64)

        batches.append(
            {
                "input_ids": pad([e.ids for e in chunk]),
                "attention_mask": pad([e.attention_mask for e in chunk]),
                "token_type_ids": pad([e.type_ids for e in chunk]),
            }
        )
    cuda = args.provider == "cuda"
    providers: list[Any] = (
        [("CUDAExecutionProvider", {"device_id": 0}), "CPUExecutionProvider"]
        if cuda
        else ["CPUExecutionProvider"]
    )
    device = "cuda" if cuda else "cpu"
    result: dict[str, Any] = {
        "available_providers": ort.get_available_providers(),
        "onnxruntime": ort.__version__,
        "batch": args.batch,
        "texts": len(texts),
        "tokens": {
            "max": max(len(e.ids) for e in enc),
            "mean": round(sum(len(e.ids) for e in enc) / len(enc), 1),
        },
        "graphs": {},
    }
    for label, graph in (g.split("=", 1) for g in args.graph):
        half = Path(graph).with_name("weights16.bin")
        if half.is_file():  # pack.py's plain fp32 graph: its weights came as fp16
            np.fromfile(half, dtype=np.float16).astype(np.float32).tofile(
                half.with_name("weights.bin")
            )
        opened = time.monotonic()
        session = ort.InferenceSession(graph, providers=providers)
        row: dict[str, Any] = {
            "provider": session.get_providers()[0],
            "open_s": round(time.monotonic() - opened, 2),
        }
        names = [i.name for i in session.get_inputs()]
        feeds = [{k: b[k] for k in names} for b in batches]
        sizes = [len(b["input_ids"]) for b in batches]
        row["texts_per_s"] = rate(
            [partial(session.run, None, f) for f in feeds], sizes, args.seconds
        )
        bound = []
        for f in feeds:
            binding = session.io_binding()
            for k, v in f.items():
                binding.bind_ortvalue_input(k, ort.OrtValue.ortvalue_from_numpy(v, device, 0))
            for o in session.get_outputs():
                binding.bind_output(o.name, device)
            bound.append(partial(session.run_with_iobinding, binding))
        row["io_binding_texts_per_s"] = rate(bound, sizes, args.seconds)
        result["graphs"][label] = row
    print(json.dumps(result))
    return 0


# ---- the check ------------------------------------------------------------------------------


class Report:
    """The JSON object the check prints, filled stage by stage: a stage that fails records its
    error and the check goes on with what does not depend on it."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"ok": True, "errors": [], "stage_seconds": {}}

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        started = time.monotonic()
        log(f"{name} ...")
        try:
            yield
        except Refused:
            raise
        except Exception as exc:
            self.data["ok"] = False
            detail = "".join(traceback.format_exception_only(type(exc), exc)).strip()
            self.data["errors"].append({"stage": name, "error": detail[-3000:]})
            log(f"{name} failed: {detail[-600:]}")
        finally:
            self.data["stage_seconds"][name] = round(time.monotonic() - started, 1)


def goals(data: dict[str, Any], simulate: bool) -> dict[str, Any]:
    """Issue 37's goals against what was measured; on a CPU (simulate) none is judged."""
    served = [s for s in data.get("served", []) if s["instances"] == data.get("instance_count")]
    top = max(served, key=lambda s: s["clients"], default=None)
    graphs = (data.get("ort") or {}).get("graphs", {})
    shipped, plain = graphs.get("shipped"), graphs.get("plain_fp32")
    values = {
        "served_share_of_ort_limit": top["texts_per_s"] / shipped["texts_per_s"]
        if top and shipped
        else None,
        "gpu_busy": (top.get("gpu_busy") or {}).get("mean") if top else None,
        "fp16_vs_fp32": shipped["texts_per_s"] / plain["texts_per_s"]
        if shipped and plain
        else None,
        "min_cosine": (data.get("cosine") or {}).get("min"),
    }
    out = {}
    for name, target in GOALS.items():
        value = values[name]
        out[name] = {
            "value": None if value is None else round(value, 4),
            "target": target,
            "met": None if simulate or value is None else value >= target,
        }
    if top and shipped:
        out["served_share_of_ort_limit"]["of_io_binding_limit"] = round(
            top["texts_per_s"] / shipped["io_binding_texts_per_s"], 4
        )
        out["served_share_of_ort_limit"]["at_clients"] = top["clients"]
    if shipped and plain:
        out["fp16_vs_fp32"]["io_binding"] = round(
            shipped["io_binding_texts_per_s"] / plain["io_binding_texts_per_s"], 3
        )
    return out


def run_check(args: argparse.Namespace, report: Report) -> None:
    simulate = args.simulate_cpu
    work = Path(args.work)
    data = report.data
    data.update(simulate_cpu=simulate, machine=probe())
    manifest = join_and_unpack(Path(args.parts), work)
    bundle = work / "bundle"
    model = manifest["model_name"]
    n = manifest["instance_count"]
    data.update(
        model=model,
        candidate=manifest["render"]["candidate"],
        instance_count=n,
        texts=manifest["texts"],
        pack_created=manifest["created"],
    )
    with report.stage("unpack"):
        untar(bundle / "triton.tar.xz", work)
        untar(bundle / "repository.tar.gz", work / "render")
        if (bundle / "plain-fp32.tar.gz").is_file():
            untar(bundle / "plain-fp32.tar.gz", work / "fp32")
    triton = work / "triton"
    model_dir = work / "render" / "model_repository" / model
    if simulate:
        simulate_on_cpu(model_dir)
    venv = serving_env(work, manifest)
    env = run_env(venv, triton)
    settings = json.loads((model_dir / "1" / "serving.json").read_text())
    data["runtime"] = settings.get("runtime")
    texts_file = bundle / "texts.json"
    texts = json.loads(texts_file.read_text(encoding="utf-8"))

    with report.stage("ort"):
        graphs = [f"shipped={model_dir / '1' / settings['onnx']}"]
        if (work / "fp32" / "model.onnx").is_file():
            graphs.append(f"plain_fp32={work / 'fp32' / 'model.onnx'}")
        cmd = [
            str(venv / "bin" / "python"),
            __file__,
            "_ort",
            f"--texts={texts_file}",
            f"--tokenizer={model_dir / '1' / settings['tokenizer']}",
            f"--max-length={settings['max_length']}",
            "--batch=64",
            f"--seconds={args.ort_seconds}",
            f"--provider={'cpu' if simulate else 'cuda'}",
            *[f"--graph={g}" for g in graphs],
        ]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"ONNX Runtime in-process failed:\n{done.stderr[-3000:]}")
        data["ort"] = json.loads(done.stdout.strip().splitlines()[-1])
        data["provider"] = data["ort"]["graphs"]["shipped"]["provider"]
        want = "CPUExecutionProvider" if simulate else "CUDAExecutionProvider"
        data["provider_ok"] = data["provider"] == want
        if not data["provider_ok"]:  # ONNX Runtime says why only in its warnings
            raise RuntimeError(
                f"the shipped graph runs on {data['provider']}, not {want}; ONNX Runtime "
                f"said:\n{done.stderr[-2500:]}"
            )

    meter = None if simulate else GpuMeter()
    data["gpu_meter"] = None if meter is None else meter.source
    data["served"] = []
    for count in dict.fromkeys([1, n]):
        with report.stage(f"served at {count} instance(s)"):
            set_instances(model_dir, count)
            log_file = work / f"triton-{count}.log"
            server = Triton(triton, work / "render" / "model_repository", model, env, log_file)
            try:
                ready_s = server.wait_ready(args.ready_timeout)
                for clients in args.clients:
                    point = closed_loop(
                        server.port, model, texts_file, clients, args.seconds, args.warm, meter
                    )
                    data["served"].append(
                        {"instances": count, "ready_s": round(ready_s, 1), **point}
                    )
                    log(f"{count} instance(s), {clients} clients: {point['texts_per_s']} texts/s")
                if count == n:
                    data["cosine"] = cosines(
                        served_embeddings(server.port, model, texts),
                        bundle / "reference.f32",
                        texts,
                    )
            finally:
                server.stop()
                save_out(log_file)
    data["goals"] = goals(data, simulate)


def save_out(path: Path) -> None:
    """A copy under $OUT (what the device tool brings back), the last MB of a log."""
    out = os.environ.get("OUT")
    if out and path.is_file():
        with open(path, "rb") as f:
            f.seek(max(0, path.stat().st_size - 1_000_000))
            Path(out, path.name).write_bytes(f.read())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    r = sub.add_parser("receive", help="verify parts against the manifest, move them to --into")
    r.add_argument("parts", nargs="+", type=Path)
    r.add_argument("--into", type=Path, default=DEFAULT_PARTS)
    r.add_argument("--manifest", type=Path)
    c = sub.add_parser("run", help="join, unpack, serve and measure; one JSON object")
    c.add_argument("--parts", default=str(DEFAULT_PARTS), help="the folder of the parts")
    c.add_argument("--work", default="/tmp/gpu-kit-work", help="where it unpacks (replaced)")
    c.add_argument("--simulate-cpu", action="store_true", help="the same path on a CPU host")
    c.add_argument("--clients", help="closed-loop client counts (default 64,128; 4,8 simulated)")
    c.add_argument("--seconds", type=float, help="each load point (default 10; 1 simulated)")
    c.add_argument("--warm", type=float, help="traffic before each point counts (default 2; 0.3)")
    c.add_argument("--ort-seconds", type=float, help="each in-process rate (default 5; 0.5)")
    c.add_argument("--ready-timeout", type=float, default=120, help="a server's load, seconds")
    w = sub.add_parser("_clients")  # one process of closed_loop's clients
    for flag in ("--port", "--threads"):
        w.add_argument(flag, type=int, required=True)
    for flag in ("--start-at", "--seconds"):
        w.add_argument(flag, type=float, required=True)
    w.add_argument("--model", required=True)
    w.add_argument("--texts", required=True)
    o = sub.add_parser("_ort")  # ort_main, in the serving environment
    o.add_argument("--graph", action="append", required=True, help="label=path")
    for flag in ("--texts", "--tokenizer", "--provider"):
        o.add_argument(flag, required=True)
    for flag in ("--max-length", "--batch"):
        o.add_argument(flag, type=int, required=True)
    o.add_argument("--seconds", type=float, required=True)
    args = p.parse_args(argv)

    if args.command == "_clients":
        return clients_main(args)
    if args.command == "_ort":
        return ort_main(args)
    try:
        if args.command == "receive":
            print(json.dumps(receive(args.parts, args.into, args.manifest)))
            return 0
        sim = args.simulate_cpu
        args.clients = [int(x) for x in (args.clients or ("4,8" if sim else "64,128")).split(",")]
        args.seconds = args.seconds or (1.0 if sim else 10.0)
        args.warm = args.warm if args.warm is not None else (0.3 if sim else 2.0)
        args.ort_seconds = args.ort_seconds or (0.5 if sim else 5.0)
    except Refused as exc:
        print(f"check: refused: {exc}", file=sys.stderr)
        return 2
    report = Report()
    try:
        run_check(args, report)
    except Refused as exc:
        print(f"check: refused: {exc}", file=sys.stderr)
        return 2
    except Exception as exc:  # what was measured before it still comes back
        report.data["ok"] = False
        report.data["errors"].append({"stage": "setup", "error": traceback.format_exc()[-3000:]})
        log(f"failed: {exc!r}")
    data = report.data
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "gpu-check.json").write_text(
            json.dumps(data, indent=1, ensure_ascii=False)
        )
    print(json.dumps(data, ensure_ascii=False))
    return 0 if data["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
