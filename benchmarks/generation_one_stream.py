"""One stream, in-process: what OpenVINO GenAI's engine itself gives a person chatting alone, by
weight format, compute precision and engine setting, on one model's IR (issue 46's latency
objective: served ÷ llama.cpp's server at one stream is 0.73 at bf16 on SmolLM2-135M; this
says how much of that is the engine, before any serving path).

Each configuration builds a ContinuousBatchingPipeline with the serving core's scheduler
settings (growing cache, 32 rows, 512 tokens a step, prefix caching), generates `--max-new`
greedy tokens after a 40-token prompt (EOS ignored) once to warm up, then three times; the best
of three is kept. LLMPipeline (the stateful pipeline, no paged KV cache) is measured beside it.
The IR's int8 and int4 (groups of 32) weights are made by hf2triton's own NNCF compression.

    .venv/bin/python benchmarks/generation_one_stream.py --shape smollm2-135m [--max-new 96]
        [--weights f32,int8,int8-sym,int4-g32] [--settings "served settings,LLMPipeline"]
        [--llama-cpp SRC] [--processes 3]

With `--processes N` each configuration runs in N fresh processes, taking turns across the
configurations; its figure is the median (each process's beside it in the record): on this
2-core VM one configuration's best of three differed by up to 20% between processes.

With `--llama-cpp SRC` (a llama.cpp source tree with build/bin/llama-server), llama.cpp's own
server runs the same model converted to GGUF at each weight format (f32, Q8_0 for int8, Q4_0
for int4 in groups of 32), one slot, 2 threads, on the same 40 prompt ids and `--max-new`
greedy tokens (EOS ignored), timed the same way (the whole request, best of three after a
warm-up), and each row gets OpenVINO ÷ llama.cpp: the engines alone, at the model's size.

Writes benchmarks/results/generation-one-stream-<UTC time>.json and prints a table. Runs the
engine in .venv-serving (the serving image's packages), each configuration in a process of
its own.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
SERVING_PY = ROOT / ".venv-serving" / "bin" / "python"

PROBE = r"""
import json, sys, time
import numpy as np, openvino as ov, openvino_genai as ovg
directory, engine = sys.argv[1], sys.argv[2]
props, max_new = json.loads(sys.argv[3]), int(sys.argv[4])
ids = ov.Tensor(np.arange(5, 45, dtype=np.int64)[None])
def config():
    c = ovg.GenerationConfig()
    c.max_new_tokens, c.ignore_eos, c.do_sample = max_new, True, False
    return c
if engine == "continuous-batching":
    s = ovg.SchedulerConfig()
    s.cache_size, s.num_kv_blocks, s.max_num_seqs = 0, 0, 32
    s.max_num_batched_tokens, s.enable_prefix_caching = 512, True
    pipe = ovg.ContinuousBatchingPipeline(directory, s, "CPU", props)
    run = lambda: len(pipe.generate([ids], [config()])[0].m_generation_ids[0])
else:
    pipe = ovg.LLMPipeline(directory, "CPU", **props)
    run = lambda: (pipe.generate(ids, config()), max_new)[1]
run()
best = 0.0
for _ in range(3):
    t = time.perf_counter()
    n = run()
    best = max(best, n / (time.perf_counter() - t))
print(json.dumps({"tokens_per_s": round(best, 1)}))
"""

# (name, engine, properties beyond the pinned precisions)
SETTINGS: list[tuple[str, str, dict[str, str]]] = [
    ("served settings", "continuous-batching", {}),
    ("latency hint", "continuous-batching", {"PERFORMANCE_HINT": "LATENCY"}),
    ("one thread", "continuous-batching", {"INFERENCE_NUM_THREADS": "1"}),
    ("dynamic quantization (32)", "continuous-batching", {"DYNAMIC_QUANTIZATION_GROUP_SIZE": "32"}),
    ("LLMPipeline", "stateful", {}),
]


def irs(model_dir: Path, work: Path, wanted: list[str]) -> dict[str, Path]:
    """The model's stateful IR (f32) and its NNCF int8 (asymmetric and symmetric, per channel)
    and int4-g32 compressions, those wanted."""
    from hf2triton.runtimes.openvino_genai import compress, convert_stateful, tokenizer_ir

    f32 = work / "f32"
    f32.mkdir()
    convert_stateful(str(model_dir), f32)
    tokenizer_ir(model_dir, f32)
    out = {"f32": f32}
    for name, mode, group in (
        ("int8", "INT8_ASYM", 0),
        ("int8-sym", "INT8_SYM", 0),
        ("int4-g32", "INT4_ASYM", 32),
    ):
        if name not in wanted:
            continue
        out[name] = work / name
        out[name].mkdir()
        compress(f32 / "openvino_model.xml", out[name], mode, group)
        for p in f32.iterdir():
            if p.is_file() and not p.name.startswith("openvino_model."):
                shutil.copyfile(p, out[name] / p.name)
    return {k: v for k, v in out.items() if k in wanted}


def gguf_file(source: Path, model_dir: Path, work: Path, weights: str) -> Path:
    """The model as a GGUF at `weights` (f32, Q8_0 for int8 either way, Q4_0 for int4-g32),
    made once in `work` by llama.cpp's converter (f32 and Q8_0) and llama-quantize (Q4_0, from
    the f32 file)."""
    from generation_ways import CONVERT

    outtype = {"f32": "f32", "int8": "q8_0", "int8-sym": "q8_0", "int4-g32": "q4_0"}[weights]
    gguf = work / f"model-{outtype}.gguf"
    if not gguf.exists():
        first = gguf if outtype != "q4_0" else work / "model-f32.gguf"
        if not first.exists():
            subprocess.run(
                [sys.executable, "-c", CONVERT, str(source), str(model_dir), "--outtype",
                 first.stem.split("-")[-1], "--outfile", str(first)],
                check=True, capture_output=True,
            )  # fmt: skip
        if first != gguf:
            quantize = source / "build" / "bin" / "llama-quantize"
            subprocess.run(
                [str(quantize), str(first), str(gguf), "Q4_0", "2"], check=True, capture_output=True
            )
    return gguf


def llama_probe(source: Path, model_dir: Path, work: Path, weights: str, max_new: int) -> float:
    """llama.cpp's server on the model as a GGUF at `weights`, one request at a time: tokens/s
    of the whole request (prompt and generation), best of three after a warm-up."""
    import time

    import requests

    from hf2triton.util.net import free_port
    from hf2triton.util.waiting import http_ok, wait_for

    gguf = gguf_file(source, model_dir, work, weights)
    port = free_port()
    proc = subprocess.Popen(
        [str(source / "build" / "bin" / "llama-server"), "-m", str(gguf), "--port", str(port),
         "-t", "2", "--parallel", "1", "-c", "512", "--no-webui", "-ngl", "0"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        wait_for(lambda: http_ok(f"http://127.0.0.1:{port}/health"), 300, "no llama-server", proc)
        body = {"prompt": list(range(5, 45)), "n_predict": max_new, "ignore_eos": True,
                "temperature": 0.0, "cache_prompt": False}  # fmt: skip
        best = 0.0
        for attempt in range(4):
            t = time.perf_counter()
            got = requests.post(f"http://127.0.0.1:{port}/completion", json=body, timeout=900)
            took = time.perf_counter() - t
            got.raise_for_status()
            assert got.json()["tokens_predicted"] == max_new, got.json()
            best = max(best, max_new / took) if attempt else best
        return round(best, 1)
    finally:
        proc.terminate()
        proc.wait(30)


def probe(directory: Path, engine: str, props: dict[str, str], max_new: int) -> float | str:
    done = subprocess.run(
        [str(SERVING_PY), "-c", PROBE, str(directory), engine, json.dumps(props), str(max_new)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    if done.returncode:
        return f"failed: {done.stderr.strip().splitlines()[-1][:200]}"
    return float(json.loads(done.stdout.strip().splitlines()[-1])["tokens_per_s"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument("--max-new", type=int, default=96)
    parser.add_argument("--weights", default="f32,int8,int4-g32", help="comma-separated")
    parser.add_argument("--settings", default=",".join(s[0] for s in SETTINGS))
    parser.add_argument("--compute", default="f32,bf16", help="comma-separated")
    parser.add_argument("--llama-cpp", type=Path, help="a llama.cpp tree with build/bin")
    parser.add_argument(
        "--processes",
        type=int,
        default=1,
        help="each configuration in this many fresh processes, in turn (the median is its "
        "figure; one process's best of three moved by up to 20%% between processes on a shared "
        "2-core machine)",
    )
    args = parser.parse_args()
    from generation_release import build_shape

    from hf2triton.util.cpu import cpu_features

    work = Path(tempfile.mkdtemp(prefix="one-stream-"))
    model_dir = build_shape(args.shape)
    rows = measure(args, model_dir, irs(model_dir, work, args.weights.split(",")), work)
    shutil.rmtree(work, ignore_errors=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    record = {"when": stamp, "shape": args.shape, "cpu": cpu_features(), "rows": rows,
              "max_new": args.max_new, "llama_cpp": str(args.llama_cpp or ""),
              "processes": args.processes}  # fmt: skip
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-one-stream-{stamp}.json").write_text(json.dumps(record, indent=1))
    print(table(rows))


def measure(
    args: argparse.Namespace, model_dir: Path, built: dict[str, Path], work: Path
) -> list[dict[str, Any]]:
    """Every configuration's row: its tokens/s (the median over `args.processes` processes,
    each the best of three runs; every process's figure beside it), and llama.cpp's on the same
    weights where asked. The processes take turns across configurations, so that a slower
    stretch of a shared machine falls on all of them."""
    chosen = args.settings.split(",")
    runs: list[tuple[dict[str, Any], Path, str, dict[str, str]]] = []
    for weights, directory in built.items():
        llama = (
            llama_probe(args.llama_cpp, model_dir, work, weights, args.max_new)
            if args.llama_cpp
            else None
        )
        for precision in args.compute.split(","):
            pinned = {
                "INFERENCE_PRECISION_HINT": precision,
                "KV_CACHE_PRECISION": "u8" if precision == "bf16" else precision,
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
            }
            for name, engine, extra in SETTINGS:
                if name in chosen:
                    row = {"weights": weights, "compute": precision, "setting": name}
                    row |= {"llama_cpp_tokens_per_s": llama} if llama else {}
                    runs.append((row, directory, engine, {**pinned, **extra}))
    for _ in range(max(1, args.processes)):
        for row, directory, engine, props in runs:
            row.setdefault("processes", []).append(probe(directory, engine, props, args.max_new))
    rows = [row for row, *_ in runs]
    for row in rows:
        speeds = [s for s in row["processes"] if isinstance(s, float)]
        row["tokens_per_s"] = float(np.median(speeds)) if speeds else row["processes"][0]
        if row.get("llama_cpp_tokens_per_s") and speeds:
            row["over_llama_cpp"] = round(row["tokens_per_s"] / row["llama_cpp_tokens_per_s"], 2)
        print(json.dumps(row), flush=True)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    settings = [s[0] for s in SETTINGS]
    head = (
        "| weights | compute | " + " | ".join(settings) + " |\n|---|---|" + "---|" * len(settings)
    )
    lines = []
    for weights in dict.fromkeys(r["weights"] for r in rows):
        for compute in ("f32", "bf16"):
            got = {
                r["setting"]: r["tokens_per_s"]
                for r in rows
                if r["weights"] == weights and r["compute"] == compute
            }
            lines.append(
                f"| {weights} | {compute} | "
                + " | ".join(str(got.get(s, "")) for s in settings)
                + " |"
            )
    return "\n".join([head, *lines])


if __name__ == "__main__":
    main()
