"""Kind `image_classification` (`task: image-classification`): an image classifier (ViT, DeiT,
BEiT, ConvNeXt, ...; `AutoModelForImageClassification`) served with the encoded image file in and
id2label's label and every label's score out.

The served path decodes each image and runs the model's own processor's steps
(hf2triton.serving.images, the PixelPlan read off the processor here). The gate compares the
served scores with PyTorch's on the model's own processor's tensors of the same files: top-1
agreement, top-5 overlap, the cosine of the (centered) logits and the largest probability
difference.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from hf2triton.kinds.base import KINDS, Data, Limits
from hf2triton.kinds.classification import LabelGate, label_answer, read_labels
from hf2triton.kinds.embedding import cosine_rows
from hf2triton.kinds.image_plan import image_plan
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import VisionKind
from hf2triton.kinds.torch_reference import abs_difference, batched
from hf2triton.serving.classification import activate
from hf2triton.serving.image_classification import ImageClassifier
from hf2triton.util.specbase import Probability, Strict

TOP_K = 5


class ImageClassificationThresholds(Strict):
    min_label_agreement: Probability = Field(
        0.99, description="share of validation images whose top label equals PyTorch's"
    )
    min_top5_overlap: Probability = Field(
        0.9,
        description="mean share of PyTorch's five most likely labels among the served five "
        "(fewer labels: all of them)",
    )
    min_logit_cosine: float = Field(
        0.99,
        ge=-1,
        le=1,
        description="lowest cosine, over the images, between the served and PyTorch's logits "
        "(centered: what the scores determine)",
    )
    max_prob_diff: float = Field(
        0.05, ge=0, le=1, description="largest allowed |probability - PyTorch's| of any label"
    )


class ImageClassificationSpec(Strict):
    """`task: image-classification`: labels from the model's id2label; validation images from
    validation.images."""

    thresholds: ImageClassificationThresholds = ImageClassificationThresholds()


@dataclass(frozen=True)
class ImageClassificationConfig:
    """What serving needs: the labels, how logits become scores, and the processor's steps."""

    labels: list[str]  # index i is id2label[i]
    activation: str  # "softmax" or "sigmoid"
    pixels: dict[str, Any]  # hf2triton.serving.images.PixelPlan.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_processor(model_dir: str | Path) -> Any:
    """The model's own image processor, the slow one (the fast ones resize with torchvision:
    other pixels than the served path's Pillow)."""
    from transformers import AutoImageProcessor

    return AutoImageProcessor.from_pretrained(str(model_dir), use_fast=False)


class TorchImages:
    """The original PyTorch model of `auto_class` on its processor's tensors of image files,
    opened as transformers opens them (`load_image`: EXIF orientation, RGB)."""

    def __init__(self, model_dir: str | Path, auto_class: str):
        import torch
        import transformers

        self._torch = torch
        self.processor = load_processor(model_dir)
        self.model = getattr(transformers, auto_class).from_pretrained(str(model_dir)).eval()

    def pixel_values(self, paths: list[str]) -> np.ndarray:
        from transformers.image_utils import load_image

        images = [load_image(p) for p in paths]
        return self.processor(images=images, return_tensors="np")["pixel_values"]

    def output(self, pixels: np.ndarray, name: str) -> np.ndarray:
        torch = self._torch
        with torch.inference_mode():
            out = self.model(pixel_values=torch.from_numpy(pixels))
        return getattr(out, name).float().numpy()

    def outputs(self, paths: list[str], name: str, size: int = 16) -> np.ndarray:
        """`name` for every image, in order, with its pixel tensors (batches of `size`)."""
        return np.concatenate(
            [self.output(self.pixel_values(part), name) for part in batched(paths, size)]
        )


def data_uri(data: bytes) -> str:
    """An image file's bytes as a base64 data URI (its type read off its first bytes)."""
    import base64

    kinds = {b"\xff\xd8": "jpeg", b"\x89PNG": "png", b"GIF8": "gif", b"BM": "bmp"}
    found = next((v for k, v in kinds.items() if data.startswith(k)), None)
    if found is None and data[8:12] == b"WEBP":
        found = "webp"
    return f"data:image/{found or 'octet-stream'};base64,{base64.b64encode(data).decode()}"


def logits_of(probs: np.ndarray, activation: str) -> np.ndarray:
    """The logits scores came from, centered per row for softmax (which loses their mean)."""
    p = np.clip(probs.astype(np.float64), 1e-300, 1.0)
    if activation == "sigmoid":
        q = np.clip(1.0 - probs.astype(np.float64), 1e-300, 1.0)
        return np.log(p) - np.log(q)
    logp = np.log(p)
    return logp - logp.mean(axis=1, keepdims=True)


def top_overlap(probs: np.ndarray, reference: np.ndarray, k: int = TOP_K) -> np.ndarray:
    """Per row: the share of the reference's k most likely labels among the served k."""
    k = min(k, probs.shape[1])
    served = np.argsort(-probs, axis=1)[:, :k]
    ref = np.argsort(-reference, axis=1)[:, :k]
    return np.array([len(set(s) & set(r)) / k for s, r in zip(served, ref)])


@KINDS.register
class ImageClassificationKind(
    LabelGate[ImageClassificationConfig], VisionKind[ImageClassificationConfig]
):
    name = "image_classification"
    task = "image-classification"
    Options = ImageClassificationSpec
    serving_class = ImageClassifier
    tunable = False

    def resolve(self, model_dir: str) -> ImageClassificationConfig:
        labels, activation = read_labels(model_dir, self.task)
        plan = image_plan(load_processor(model_dir))
        return ImageClassificationConfig(labels, activation, plan.to_dict())

    def config_from_dict(self, data: dict[str, Any]) -> ImageClassificationConfig:
        return ImageClassificationConfig(**data)

    def check_export(
        self, model_dir: str, out: Path, cfg: ImageClassificationConfig, inputs: list[Any]
    ) -> dict[str, float]:
        """Largest |ONNX - PyTorch| of the logits, on the processor's tensors of `inputs`."""
        import onnxruntime as ort

        torch_model = TorchImages(model_dir, "AutoModelForImageClassification")
        session = ort.InferenceSession(
            str(out / self.main_file), providers=["CPUExecutionProvider"]
        )
        worst = 0.0
        for part in batched(list(inputs), 8):
            pixels = torch_model.pixel_values(part).astype(np.float32)
            (onnx,) = session.run(["logits"], {"pixel_values": pixels})
            worst = max(worst, abs_difference(torch_model.output(pixels, "logits"), onnx))
        return {"max_abs_diff": worst}

    openai_route = "/predict"

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        """The images as base64 data URIs, as a browser or an HTTP client sends them."""
        return {"inputs": [data_uri(bytes(b)) for b in request["IMAGE"][:, 0]]}

    def openai_answer(
        self, body: Any, request: dict[str, np.ndarray], cfg: ImageClassificationConfig
    ) -> dict[str, np.ndarray]:
        return label_answer(body, cfg)

    def reference(self, model_dir: str, cfg: ImageClassificationConfig, data: Data) -> np.ndarray:
        logits = TorchImages(model_dir, "AutoModelForImageClassification").outputs(
            data.items, "logits"
        )
        return activate(logits, cfg.activation)

    def score(
        self, reference: Any, outputs: dict[str, Any], data: Data, cfg: ImageClassificationConfig
    ) -> tuple[dict[str, float], dict]:
        metrics, details = super().score(reference, outputs, data, cfg)
        reference = np.asarray(reference, dtype=np.float32)
        overlap = top_overlap(outputs["probs"], reference)
        cos = cosine_rows(
            logits_of(outputs["probs"], cfg.activation), logits_of(reference, cfg.activation)
        )
        metrics["top5_overlap"] = float(overlap.mean())
        metrics["logit_cosine"] = float(cos.min())
        metrics["mean_logit_cosine"] = float(cos.mean())
        return metrics, details

    def samples(
        self, reference: Any, outputs: dict[str, Any], data: Data, cfg: ImageClassificationConfig
    ) -> dict[str, Sample]:
        found = super().samples(reference, outputs, data, cfg)
        reference = np.asarray(reference, dtype=np.float32)
        found["top5_overlap"] = Sample.mean(top_overlap(outputs["probs"], reference))
        return found

    def limits(self) -> Limits:
        t = self.options.thresholds
        return {
            "label_agreement": (">=", t.min_label_agreement),
            "top5_overlap": (">=", t.min_top5_overlap),
            "logit_cosine": (">=", t.min_logit_cosine),
            "max_prob_diff": ("<=", t.max_prob_diff),
        }
