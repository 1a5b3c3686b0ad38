"""Where one decode step's time goes: OpenVINO's own profile of a generator's stateful IR (the
graph OpenVINO GenAI serves), compiled with the served numerics settings, against llama.cpp's
decode step on the same weights (issue 46: at SmolLM2-135M's shape one stream is 0.7-0.8 of
llama.cpp's server; this says whether the gap is the engine's kernels or the pipeline around
them).

OpenVINO: the IR's weights compressed by hf2triton's own NNCF compression; a 40-token prompt,
then `--steps` single-token steps with PERF_COUNT on; the wall time of each step and the sum of
its executed nodes by type, the fully connected layers split by role (the LM head, each
projection of the decoder layers); weights read per step over the fully connected layers' time
as GB/s. llama.cpp (`--llama-cpp SRC`, a source tree with build/bin/llama-bench and
llama-quantize): `llama-bench` generating the same number of tokens after 40 of context, 2
threads, on the GGUF at the same weight precision (Q8_0 for int8, Q4_0 for int4-g32).

    .venv/bin/python benchmarks/generation_step.py --shape smollm2-135m [--weights int8]
        [--compute bf16] [--dynamic-quantization 0] [--steps 64] [--llama-cpp SRC]

Writes benchmarks/results/generation-step-<UTC time>.json and prints it.
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))
SERVING_PY = ROOT / ".venv-serving" / "bin" / "python"

PROBE = r"""
import collections, json, sys, time
import numpy as np, openvino as ov
directory, props, steps = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
compiled = ov.Core().compile_model(directory + "/openvino_model.xml", "CPU",
                                   {**props, "PERF_COUNT": "YES"})
request = compiled.create_infer_request()
def feed(ids, start):
    n = start + ids.shape[1]
    return {"input_ids": ids, "attention_mask": np.ones((1, n), np.int64),
            "position_ids": np.arange(start, n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32)}
request.infer(feed(np.arange(5, 45, dtype=np.int64)[None], 0))
by_type, by_fc, walls = collections.Counter(), collections.Counter(), []
for i in range(steps):
    t = time.perf_counter()
    request.infer(feed(np.array([[7]], np.int64), 40 + i))
    walls.append(time.perf_counter() - t)
    if i < 8:
        continue  # warm-up steps: not counted
    for node in request.profiling_info:
        if node.status != node.Status.EXECUTED:
            continue
        seconds = node.real_time.total_seconds()
        by_type[node.node_type] += seconds
        if node.node_type.startswith("FullyConnected"):
            name = node.node_name
            role = "lm_head" if "lm_head" in name else name.split("layers.")[-1].split("/")[0]
            by_fc[role.split(".", 1)[-1]] += seconds
counted = steps - 8
ms = lambda s: round(s / counted * 1000, 3)
print(json.dumps({"step_ms": round(float(np.median(walls[8:])) * 1000, 3),
                  "nodes_ms": ms(sum(by_type.values())),
                  "by_type_ms": {k: ms(v) for k, v in by_type.most_common(8)},
                  "fully_connected_ms": {k: ms(v) for k, v in by_fc.most_common()}}))
"""


def llama_step(source: Path, gguf: Path, steps: int) -> float:
    """llama.cpp's decode step in ms: llama-bench generating `steps` tokens after 40 of
    context, 2 threads, the mean of its repetitions."""
    bench = source / "build" / "bin" / "llama-bench"
    done = subprocess.run(
        [str(bench), "-m", str(gguf), "-p", "0", "-n", str(steps), "-d", "40", "-t", "2",
         "-r", "5", "-o", "json"],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    (row,) = json.loads(done.stdout)
    return round(1000 / float(row["avg_ts"]), 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="smollm2-135m")
    parser.add_argument(
        "--weights", default="int8", choices=("f32", "int8", "int8-sym", "int4-g32")
    )
    parser.add_argument("--compute", default="bf16", choices=("f32", "bf16"))
    parser.add_argument("--dynamic-quantization", type=int, default=0)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--llama-cpp", type=Path, help="a llama.cpp tree with build/bin")
    args = parser.parse_args()
    if args.steps <= 8:
        parser.error("--steps must be more than 8: the first 8 steps warm up, uncounted")
    from generation_one_stream import gguf_file, irs
    from generation_release import build_shape

    from hf2triton.util.cpu import cpu_features

    work = Path(tempfile.mkdtemp(prefix="generation-step-"))
    try:
        model_dir = build_shape(args.shape)
        directory = irs(model_dir, work, [args.weights])[args.weights]
        props = {
            "INFERENCE_PRECISION_HINT": args.compute,
            "KV_CACHE_PRECISION": "u8" if args.compute == "bf16" else args.compute,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(args.dynamic_quantization),
        }
        done = subprocess.run(
            [str(SERVING_PY), "-c", PROBE, str(directory), json.dumps(props), str(args.steps)],
            check=True, capture_output=True, text=True,
        )  # fmt: skip
        openvino = json.loads(done.stdout.strip().splitlines()[-1])
        weight_bytes = (directory / "openvino_model.bin").stat().st_size
        fc_ms = sum(openvino["fully_connected_ms"].values())
        openvino["weights_gb_per_s"] = round(weight_bytes / fc_ms / 1e6, 1)
        record = {
            "shape": args.shape, "weights": args.weights, "compute": args.compute,
            "dynamic_quantization": args.dynamic_quantization, "steps": args.steps,
            "weight_bytes": weight_bytes, "cpu": cpu_features(), "openvino": openvino,
        }  # fmt: skip
        if args.llama_cpp:
            gguf = gguf_file(args.llama_cpp, model_dir, work, args.weights)
            step = llama_step(args.llama_cpp, gguf, args.steps)
            record["llama_cpp"] = {
                "step_ms": step,
                "gguf_bytes": gguf.stat().st_size,
                "weights_gb_per_s_at_most": round(gguf.stat().st_size / step / 1e6, 1),
            }
            record["openvino_over_llama_cpp_step"] = round(step / openvino["step_ms"], 2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    out = ROOT / "benchmarks" / "results"
    out.mkdir(parents=True, exist_ok=True)
    (out / f"generation-step-{stamp}.json").write_text(json.dumps(record, indent=1))
    print(json.dumps(record, indent=1))


if __name__ == "__main__":
    main()
