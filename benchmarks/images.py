"""An image classifier of google/vit-base-patch16-224's shape (86M parameters, random weights: the
hub is out of reach here) released with `hf2triton release` and measured on real image files of
mixed sizes, as ratios in one run:

- served images/s (one image file a gRPC request, closed loop, 1 and 16 clients) against the
  same version directory's serving core in-process (the same runtime, precision and code:
  decode, preprocess, run), in dynamic batches of 16 requests;
- served against PyTorch batched (transformers' own load_image + processor + model, batches of
  16, the same files);
- p50/p99 latency at 1 and 16 clients, and decoding and preprocessing's share of the in-process
  time.

Traffic: the repository's validation photographs (releases/data/images, 64 to 640 pixels) and
the same photographs re-encoded as JPEG with their longest side 1,024, 2,048 and 4,000 pixels:
thumbnails to phone-camera photos, drawn at random.

    .venv/bin/python benchmarks/images.py [--seconds 20] [--quiet-wait 600]

Writes benchmarks/results/images-<UTC time>.{json,md}. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness as bench  # noqa: E402
from load import TritonGrpc, run_point  # noqa: E402
from runtimes import cpu_flags  # noqa: E402

from hf2triton.util.net import free_ports  # noqa: E402

PHOTOS = ROOT / "releases" / "data" / "images"
BATCH = 16
SIZES = (1024, 2048, 4000)


def build_model(out: Path) -> Path:
    """ViT-base's shape (224 px, patches of 16, 12 layers of 768, 1,000 labels), random."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = {i: f"class {i}" for i in range(1000)}
    config = ViTConfig(id2label=labels, label2id={v: k for k, v in labels.items()})
    torch.manual_seed(0)
    ViTForImageClassification(config).eval().save_pretrained(out)
    ViTImageProcessor().save_pretrained(out)
    return out


def traffic(n: int = 400) -> tuple[list[bytes], dict[str, float]]:
    """`n` image files drawn at random from the photographs at their own sizes and larger."""
    from PIL import Image

    files = [p for p in sorted(PHOTOS.iterdir()) if p.suffix not in (".py", ".md")]
    pool = [p.read_bytes() for p in files]
    for p in files[:6]:
        image = Image.open(p).convert("RGB")
        for longest in SIZES:
            scale = longest / max(image.size)
            size = (round(image.width * scale), round(image.height * scale))
            out = io.BytesIO()
            image.resize(size, Image.Resampling.BICUBIC).save(out, "JPEG", quality=90)
            pool.append(out.getvalue())
    drawn = random.Random(0).choices(pool, k=n)
    sizes = np.array([len(b) for b in drawn])
    return drawn, {
        "files": len(pool),
        "median_bytes": float(np.median(sizes)),
        "max_bytes": int(sizes.max()),
    }


def spec_file(path: Path, model: Path, ports: dict) -> Path:
    spec = yaml.safe_load((ROOT / "releases" / "vit-base-classifier.yaml").read_text())
    spec["source"] = {"path": str(model), "model_id": "random/vit-base-shape"}
    spec["validation"]["images"] = str(PHOTOS)
    spec["deploy"].update(ports)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def image_inputs(data: bytes) -> dict[str, np.ndarray]:
    return {"IMAGE": np.array([[data]], dtype=np.object_)}


def served(grpc: str, images: list[bytes], clients: int, seconds: float, pid: int | None) -> dict:
    r = run_point(
        lambda n: TritonGrpc(
            grpc,
            "vit-base-classifier",
            output="SCORES",
            inputs=image_inputs,  # type: ignore[arg-type] # images, not texts
        ),
        images,  # type: ignore[arg-type] # the call takes what the list holds
        clients,
        seconds,
        min(4.0, seconds / 2),
        10**9,
        pid,
        f"served@{clients}",
    )
    bench.log(f"  served @{clients}: {r.rps:.1f}/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms")
    return {k: getattr(r, k) for k in ("rps", "p50_ms", "p99_ms", "errors", "other_cores")}


def rate(run, images: list[bytes], seconds: float) -> float:
    """Images per second of `run(batch)` over batches of BATCH, for `seconds` after one warm-up."""
    run(images[:BATCH])
    done, started, i = 0, time.perf_counter(), 0
    while time.perf_counter() - started < seconds:
        part = [images[(i + k) % len(images)] for k in range(BATCH)]
        run(part)
        done, i = done + len(part), i + BATCH
    return done / (time.perf_counter() - started)


def in_process(version_dir: Path, images: list[bytes], seconds: float) -> dict:
    """The served version's serving core, whole and its decode + preprocess part alone."""
    from hf2triton import serving
    from hf2triton.serving.images import decode

    model = serving.load(str(version_dir))
    plan, ceiling = model.images.plan, model.images.max_pixels
    whole = rate(lambda part: model.answer([image_inputs(b) for b in part]), images, seconds)
    prep = rate(lambda part: [plan.pixels(decode(b, ceiling)) for b in part], images, seconds / 2)
    return {
        "images_per_s": whole,
        "preprocess_images_per_s": prep,
        "preprocess_share": whole / prep,
    }


def pytorch(model_dir: Path, images: list[bytes], seconds: float) -> float:
    """transformers' own path: load_image, the slow processor, the model, batches of BATCH."""
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, ViTForImageClassification
    from transformers.image_utils import load_image

    processor = AutoImageProcessor.from_pretrained(model_dir, use_fast=False)
    model = ViTForImageClassification.from_pretrained(model_dir).eval()

    def run(part: list[bytes]) -> None:
        opened = [load_image(Image.open(io.BytesIO(b))) for b in part]
        with torch.inference_mode():
            model(**processor(images=opened, return_tensors="pt"))

    return rate(run, images, seconds)


def gate_figures(home: Path) -> dict:
    """Each candidate's in-process speed and whether it passed, from the release's report."""
    import json

    found = sorted((home / "work").rglob("validation_report.json"))
    report = json.loads(found[-1].read_text()) if found else {"candidates": []}
    return {
        c["name"]: {"throughput": c.get("throughput"), "misses": sorted(c.get("misses") or {})}
        for c in report["candidates"]
    }


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--quiet-wait", type=float, default=600)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    quiet = bench.wait_for_quiet(max_wait_s=args.quiet_wait) if args.quiet_wait else {}
    images, described = traffic()
    cli = [str(ROOT / ".venv" / "bin" / "hf2triton")]
    with tempfile.TemporaryDirectory(prefix="hf2triton-images-") as tmp_name:
        tmp, home = Path(tmp_name), Path(tmp_name) / "home"
        model = build_model(tmp / "vit-base-shape")
        http, grpc, metrics, openai = free_ports(4)
        ports: dict[str, Any] = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
        ports["openai"] = {"port": openai}
        summary, release_s = bench.release(
            cli, spec_file(tmp / "vit.yaml", model, ports), home, ROOT
        )
        bench.log(f"released {summary['variant']} in {release_s:.0f} s")
        try:
            pid = bench.server_pid(home)
            points = {n: served(f"127.0.0.1:{grpc}", images, n, args.seconds, pid) for n in (1, 16)}
            version = (
                home
                / "triton"
                / "models"
                / "vit-base-classifier"
                / str(summary["mlflow"]["version"])
            )
            candidates = gate_figures(home)
        finally:
            bench.stop_server(cli, home, ROOT)
        limit = in_process(version, images, args.seconds)
        torch_rate = pytorch(model, images, args.seconds)
    measured = {"points": points, "limit": limit, "torch_rate": torch_rate}
    path = write_record(summary, release_s, candidates, measured, {**described, "quiet": quiet})
    bench.log(f"wrote {path}")


def write_record(
    summary: dict, release_s: float, candidates: dict, measured: dict, described: dict
) -> Path:
    """The record (JSON) and its summary (Markdown, printed) under benchmarks/results."""
    points, limit, torch_rate = measured["points"], measured["limit"], measured["torch_rate"]
    record = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu_flags(),
        "command": "benchmarks/images.py " + " ".join(sys.argv[1:]),
        "traffic": described,
        "shipped": summary["variant"],
        "candidates": candidates,
        "release_s": round(release_s, 1),
        "served": points,
        "in_process": limit,
        "pytorch_batched_images_per_s": torch_rate,
        "ratios": {
            "served_16_over_in_process": points[16]["rps"] / limit["images_per_s"],
            "served_16_over_pytorch": points[16]["rps"] / torch_rate,
        },
    }
    lines = [
        f"# Images: ViT-base shape, {summary['variant']} shipped",
        "",
        "| | images/s | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *(
            f"| served, {n} clients | {p['rps']:.1f} | {p['p50_ms']:.0f} | {p['p99_ms']:.0f} |"
            for n, p in points.items()
        ),
        f"| in-process, batches of {BATCH} | {limit['images_per_s']:.1f} | | |",
        f"| decode + preprocess alone | {limit['preprocess_images_per_s']:.1f} | | |",
        f"| PyTorch batched ({BATCH}) | {torch_rate:.1f} | | |",
        "",
        f"served@16 / in-process: {record['ratios']['served_16_over_in_process']:.2f}; "
        f"served@16 / PyTorch: {record['ratios']['served_16_over_pytorch']:.2f}; "
        f"decode + preprocess share of in-process time: {limit['preprocess_share']:.2f}",
    ]
    print("\n".join(lines))
    return bench.save_record("images", record, lines)
