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


def irs(model_dir: Path, work: Path) -> dict[str, Path]:
    """The model's stateful IR (f32) and its NNCF int8 and int4-g32 compressions."""
    from hf2triton.runtimes.openvino_genai import compress, convert_stateful, tokenizer_ir

    f32 = work / "f32"
    f32.mkdir()
    convert_stateful(str(model_dir), f32)
    tokenizer_ir(model_dir, f32)
    out = {"f32": f32}
    for name, mode, group in (("int8", "INT8_ASYM", 0), ("int4-g32", "INT4_ASYM", 32)):
        out[name] = work / name
        out[name].mkdir()
        compress(f32 / "openvino_model.xml", out[name], mode, group)
        for p in f32.iterdir():
            if p.is_file() and not p.name.startswith("openvino_model."):
                shutil.copyfile(p, out[name] / p.name)
    return out


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
    args = parser.parse_args()
    from generation_release import build_shape

    from hf2triton.util.cpu import cpu_features

    work = Path(tempfile.mkdtemp(prefix="one-stream-"))
    rows: list[dict[str, Any]] = []
    for weights, directory in irs(build_shape(args.shape), work).items():
        for precision in ("f32", "bf16"):
            pinned = {
                "INFERENCE_PRECISION_HINT": precision,
                "KV_CACHE_PRECISION": "u8" if precision == "bf16" else precision,
                "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
            }
            for name, engine, extra in SETTINGS:
                speed = probe(directory, engine, {**pinned, **extra}, args.max_new)
                rows.append(
                    {
                        "weights": weights,
                        "compute": precision,
                        "setting": name,
                        "tokens_per_s": speed,
                    }
                )
                print(json.dumps(rows[-1]), flush=True)
    shutil.rmtree(work, ignore_errors=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    record = {"when": stamp, "shape": args.shape, "cpu": cpu_features(), "rows": rows}
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-one-stream-{stamp}.json").write_text(json.dumps(record, indent=1))
    print(table(rows))


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
