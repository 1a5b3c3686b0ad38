"""An image model released with `hf2triton release` and measured on real image files of mixed
sizes, as ratios in one run: an image classifier of google/vit-base-patch16-224's shape (86M
parameters), or with `--model clip` an image-text embedder of openai/clip-vit-base-patch32's
(151M; its image embeddings), random weights (the hub is out of reach here):

- served images/s (one image file a gRPC request, closed loop, 1 and 16 clients) against the
  same version directory's serving core in-process (the same runtime, precision and code:
  decode, preprocess, run), in dynamic batches of 16 requests;
- served against PyTorch batched (transformers' own load_image + processor + model, batches of
  16, the same files);
- p50/p99 latency at 1 and 16 clients, and decoding and preprocessing's share of the in-process
  time;
- CLIP only: the peer infinity-emb (torch engine, its own environment) serving the same model
  directory, images as base64 data URIs with `modality: image` on its /embeddings, against the
  release's OpenAI-compatible /v1/embeddings taking the same bodies, 16 clients, and the cosine
  of the two sides' embeddings of the validation photographs.

Traffic: the repository's validation photographs (releases/data/images, 64 to 640 pixels) and
the same photographs re-encoded as JPEG with their longest side 1,024, 2,048 and 4,000 pixels:
thumbnails to phone-camera photos, drawn at random.

    .venv/bin/python benchmarks/images.py [--model vit|clip] [--seconds 20] [--quiet-wait 600]

Writes benchmarks/results/images-<UTC time>.{json,md} (clip-images-... for CLIP). Everything
runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import io
import random
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness as bench  # noqa: E402
from load import JsonHttp, TritonGrpc, run_point  # noqa: E402
from runtimes import cpu_flags  # noqa: E402

from hf2triton.util.net import free_ports  # noqa: E402

PHOTOS = ROOT / "releases" / "data" / "images"
BATCH = 16
SIZES = (1024, 2048, 4000)


def build_vit(out: Path) -> Path:
    """ViT-base's shape (224 px, patches of 16, 12 layers of 768, 1,000 labels), random."""
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    labels = {i: f"class {i}" for i in range(1000)}
    config = ViTConfig(id2label=labels, label2id={v: k for k, v in labels.items()})
    torch.manual_seed(0)
    ViTForImageClassification(config).eval().save_pretrained(out)
    ViTImageProcessor().save_pretrained(out)
    return out


def build_clip(out: Path) -> Path:
    """CLIP ViT-B/32's shape (an image tower of 12 layers of 768 on 224 px in patches of 32, a
    text tower of 12 layers of 512, embeddings of 512), random, with CLIP's image processor and
    a small byte-level tokenizer (the text tower is not what is measured)."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel

    from tests.tiny_models import clip_tokenizer

    tokenizer = clip_tokenizer(out / "tokenizer-source")
    ids = {k: getattr(tokenizer, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")}
    config = CLIPConfig(text_config=ids, vision_config={"patch_size": 32})
    torch.manual_seed(0)
    CLIPModel(config).eval().save_pretrained(out)
    CLIPImageProcessor().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def vit_torch(model_dir: Path) -> Callable[[list[Any]], Any]:
    """transformers' ViT classifier on its processor's tensors."""
    import torch
    from transformers import AutoImageProcessor, ViTForImageClassification

    processor = AutoImageProcessor.from_pretrained(model_dir, use_fast=False)
    model = ViTForImageClassification.from_pretrained(model_dir).eval()

    def run(opened: list[Any]) -> Any:
        with torch.inference_mode():
            return model(**processor(images=opened, return_tensors="pt")).logits

    return run


def clip_torch(model_dir: Path) -> Callable[[list[Any]], Any]:
    """transformers' CLIP image features on its processor's tensors."""
    import torch
    from transformers import AutoImageProcessor, CLIPModel

    processor = AutoImageProcessor.from_pretrained(model_dir, use_fast=False)
    model = CLIPModel.from_pretrained(model_dir).eval()

    def run(opened: list[Any]) -> Any:
        with torch.inference_mode():
            pixels = processor(images=opened, return_tensors="pt")["pixel_values"]
            return model.get_image_features(pixel_values=pixels)

    return run


@dataclass(frozen=True)
class Subject:
    """A model measured: its release spec, what builds it, its served output and PyTorch's."""

    spec: str  # under releases/
    model_name: str
    output: str
    build: Callable[[Path], Path]
    torch: Callable[[Path], Callable[[list[Any]], Any]]
    record: str  # the record's name


SUBJECTS = {
    "vit": Subject(
        "vit-base-classifier.yaml", "vit-base-classifier", "SCORES", build_vit, vit_torch, "images"
    ),
    "clip": Subject(
        "clip-vit-base-patch32.yaml",
        "clip-vit-b32",
        "EMBEDDING",
        build_clip,
        clip_torch,
        "clip-images",
    ),
}


def photo_files() -> list[Path]:
    return [p for p in sorted(PHOTOS.iterdir()) if p.suffix not in (".py", ".md")]


def traffic(n: int = 400) -> tuple[list[bytes], dict[str, float]]:
    """`n` image files drawn at random from the photographs at their own sizes and larger."""
    from PIL import Image

    files = photo_files()
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


def spec_file(path: Path, model: Path, ports: dict, subject: Subject) -> Path:
    spec = yaml.safe_load((ROOT / "releases" / subject.spec).read_text())
    spec["source"] = {"path": str(model), "model_id": f"random/{model.name}"}
    spec["validation"]["images"] = str(PHOTOS)
    if spec["validation"].get("sentences"):
        spec["validation"]["sentences"] = str(ROOT / "releases" / spec["validation"]["sentences"])
    spec["deploy"].update(ports)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def image_inputs(data: bytes) -> dict[str, np.ndarray]:
    return {"IMAGE": np.array([[data]], dtype=np.object_)}


def served(
    grpc: str, images: list[bytes], clients: int, seconds: float, pid: int | None, subject: Subject
) -> dict:
    r = run_point(
        lambda n: TritonGrpc(
            grpc,
            subject.model_name,
            output=subject.output,
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
    """The served version's serving core, whole and its decode + preprocess part alone (its
    `parse_all`: a dynamic batch's images decoded side by side, as served)."""
    from hf2triton import serving

    model = serving.load(str(version_dir))
    whole = rate(lambda part: model.answer([image_inputs(b) for b in part]), images, seconds)
    prep = rate(lambda part: model.parse_all([image_inputs(b) for b in part]), images, seconds / 2)
    return {
        "images_per_s": whole,
        "preprocess_images_per_s": prep,
        "preprocess_share": whole / prep,
    }


def pytorch(model_dir: Path, images: list[bytes], seconds: float, subject: Subject) -> float:
    """transformers' own path: load_image, the slow processor, the model, batches of BATCH."""
    from PIL import Image
    from transformers.image_utils import load_image

    run = subject.torch(model_dir)
    return rate(
        lambda part: run([load_image(Image.open(io.BytesIO(b))) for b in part]), images, seconds
    )


def data_uris(images: list[bytes]) -> list[str]:
    from hf2triton.kinds.image_classification import data_uri

    return [data_uri(b) for b in images]


def embeddings_over_http(url: str, name: str, uris: list[str]) -> np.ndarray:
    """The embeddings of `uris`, one request each, from an OpenAI-style /embeddings."""
    import httpx

    rows = []
    for uri in uris:
        body = {"model": name, "input": [uri], "modality": "image"}
        answer = httpx.post(url, json=body, timeout=120)
        answer.raise_for_status()
        rows.append(answer.json()["data"][0]["embedding"])
    out = np.array(rows, np.float32)
    return out / np.linalg.norm(out, axis=1, keepdims=True)


def http_point(
    url: str, name: str, uris: list[str], seconds: float, pid: int | None, what: str
) -> dict:
    """16 clients posting one image a request as a data URI with `modality: image`."""
    r = run_point(
        lambda n: JsonHttp(url, openai_model=name, extra={"modality": "image"}),
        uris,
        16,
        seconds,
        min(4.0, seconds / 2),
        10**9,
        pid,
        what,
    )
    bench.log(f"  {what} @16: {r.rps:.1f}/s, p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms")
    return {k: getattr(r, k) for k in ("rps", "p50_ms", "p99_ms", "errors", "other_cores")}


def peer(model: Path, images: list[bytes], ours: str, seconds: float) -> dict:
    """infinity-emb on the same model directory against the release's /v1/embeddings (`ours`),
    the same bodies; and the cosine of the two sides' embeddings of the photographs."""
    from serving_peers import INFINITY, infinity_server

    uris = data_uris(images)
    photos = data_uris([p.read_bytes() for p in photo_files()])
    (port,) = free_ports(1)
    served_ours = http_point(ours, "clip-vit-b32", uris, seconds, None, "hf2triton /v1/embeddings")
    mine = embeddings_over_http(ours, "clip-vit-b32", photos)
    with infinity_server(port, model, batch_size=16) as pid:
        url = f"http://127.0.0.1:{port}/embeddings"
        theirs = embeddings_over_http(url, str(model), photos)
        point = http_point(url, str(model), uris, seconds, pid, "infinity-emb /embeddings")
    cos = (mine * theirs).sum(axis=1)
    return {
        "package": INFINITY,
        "engine": "torch",
        "batch_size": 16,
        "ours_http": served_ours,
        "infinity": point,
        "cosine_min": float(cos.min()),
        "cosine_mean": float(cos.mean()),
    }


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
    ap.add_argument("--model", choices=sorted(SUBJECTS), default="vit")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--quiet-wait", type=float, default=600)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    subject = SUBJECTS[args.model]
    quiet = bench.wait_for_quiet(max_wait_s=args.quiet_wait) if args.quiet_wait else {}
    images, described = traffic()
    cli = [str(ROOT / ".venv" / "bin" / "hf2triton")]
    with tempfile.TemporaryDirectory(prefix="hf2triton-images-") as tmp_name:
        tmp, home = Path(tmp_name), Path(tmp_name) / "home"
        model = subject.build(tmp / f"{args.model}-shape")
        http, grpc, metrics, openai = free_ports(4)
        ports: dict[str, Any] = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
        ports["openai"] = {"port": openai}
        spec = spec_file(tmp / "spec.yaml", model, ports, subject)
        summary, release_s = bench.release(cli, spec, home, ROOT)
        bench.log(f"released {summary['variant']} in {release_s:.0f} s")
        try:
            pid = bench.server_pid(home)
            at = f"127.0.0.1:{grpc}"
            points = {n: served(at, images, n, args.seconds, pid, subject) for n in (1, 16)}
            versions = home / "triton" / "models" / subject.model_name
            version = versions / str(summary["mlflow"]["version"])
            candidates = gate_figures(home)
            ours = f"http://127.0.0.1:{openai}/v1/embeddings"
            peers = peer(model, images, ours, args.seconds) if args.model == "clip" else None
        finally:
            bench.stop_server(cli, home, ROOT)
        limit = in_process(version, images, args.seconds)
        torch_rate = pytorch(model, images, args.seconds, subject)
    measured: dict[str, Any] = {"points": points, "limit": limit, "torch_rate": torch_rate}
    measured["peer"] = peers
    described_all = {**described, "quiet": quiet}
    path = write_record(subject, summary, release_s, candidates, measured, described_all)
    bench.log(f"wrote {path}")


def peer_lines(peer: dict | None, ratios: dict) -> tuple[list[str], list[str]]:
    """The peer's table rows and ratio line (CLIP against infinity-emb); adds its ratio."""
    if not peer:
        return [], []
    ratios["openai_http_16_over_infinity"] = peer["ours_http"]["rps"] / peer["infinity"]["rps"]
    rows = [
        f"| {what}, 16 clients | {p['rps']:.1f} | {p['p50_ms']:.0f} | {p['p99_ms']:.0f} |"
        for what, p in (
            ("hf2triton /v1/embeddings", peer["ours_http"]),
            ("infinity-emb /embeddings", peer["infinity"]),
        )
    ]
    return rows, [
        f"/v1/embeddings@16 / infinity-emb@16: {ratios['openai_http_16_over_infinity']:.2f}; "
        f"cosine of the two sides' embeddings, lowest {peer['cosine_min']:.5f}"
    ]


def write_record(
    subject: Subject,
    summary: dict,
    release_s: float,
    candidates: dict,
    measured: dict,
    described: dict,
) -> Path:
    """The record (JSON) and its summary (Markdown, printed) under benchmarks/results."""
    points, limit, torch_rate = measured["points"], measured["limit"], measured["torch_rate"]
    record: dict[str, Any] = {
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
        "peer": measured["peer"],
        "ratios": {
            "served_16_over_in_process": points[16]["rps"] / limit["images_per_s"],
            "served_16_over_pytorch": points[16]["rps"] / torch_rate,
        },
    }
    rows, ratio_line = peer_lines(measured["peer"], record["ratios"])
    lines = [
        f"# Images: {subject.model_name} shape, {summary['variant']} shipped",
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
        *rows,
        "",
        f"served@16 / in-process: {record['ratios']['served_16_over_in_process']:.2f}; "
        f"served@16 / PyTorch: {record['ratios']['served_16_over_pytorch']:.2f}; "
        f"decode + preprocess share of in-process time: {limit['preprocess_share']:.2f}",
    ]
    lines += ratio_line
    print("\n".join(lines))
    return bench.save_record(subject.record, record, lines)


if __name__ == "__main__":
    main()
