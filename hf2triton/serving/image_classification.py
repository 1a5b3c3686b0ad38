"""Served image classification: IMAGE [batch, 1] (an encoded image file per row: JPEG, PNG, WebP,
BMP, a GIF's single frame) in; LABEL [batch, 1] (id2label's name, or for a multi-label model the
labels above 0.5 joined by ','), SCORES [batch, labels] (softmax, or sigmoid) out.

Each image is decoded and made into the model's pixel tensor by hf2triton.serving.images (the
model's own processor's steps, held to transformers' by a parity test); a row that is not an
image the served path takes fails its request with the reason, and the other requests of the
dynamic batch are answered."""

from __future__ import annotations

import os
from functools import partial
from typing import Any

import numpy as np

from . import runtimes
from .base import Deferred, ServedModel, Tensor, column
from .classification import activate, label_names
from .images import MAX_PIXELS, ImageRefused, PixelPlan, decode, pixel_runs

IMAGE = Tensor("IMAGE", "STRING")
# The most images one run of the graph takes: a dynamic batch runs in parts of this many, which
# a runtime with several streams (OpenVINO's THROUGHPUT hint) runs side by side. Vision graphs
# are compute-bound and gain nothing from long runs: ViT-base fp32 on ONNX Runtime, 2-core AVX2
# EPYC, 3.0 / 3.5 / 2.7 images/s in runs of 1 / 4 / 16; OpenVINO THROUGHPUT with one run at a
# time 1.6 (one stream of two).
MAX_ROWS = 4


def image_column(arrays: dict[str, np.ndarray], name: str = "IMAGE") -> list[bytes]:
    """One encoded image per row of a [batch, 1] BYTES input."""
    arr = column(arrays, name)
    if arr.shape[1] != 1:
        raise ValueError(
            f"{name} must have shape [batch, 1] (one image file per row), got {list(arr.shape)}"
        )
    out = []
    for i, raw in enumerate(arr[:, 0]):
        if not isinstance(raw, (bytes, bytearray, np.bytes_)):
            raise ValueError(f"{name}[{i}] is not bytes: send the image file's bytes")
        out.append(bytes(raw))
    return out


class ImagePixels:
    """Encoded images to the graph's `pixel_values`, and the graph run on them in parts of at most
    `rows` images, by a runtime of runtimes/ (serving.json's `runtime`)."""

    def __init__(self, graph_path: str, settings: dict[str, Any]):
        import PIL.Image  # a serving environment without Pillow fails at load

        # Every format plug-in registered now: Pillow loads them on first use, which is not
        # thread-safe, and images are decoded side by side (ServedModel.parse_all).
        PIL.Image.init()

        self.plan = PixelPlan.from_dict(settings["pixels"])
        self.max_pixels = int(settings.get("max_pixels") or MAX_PIXELS)
        self.rows = MAX_ROWS
        height, width = self.plan.out_size()
        shapes = {"pixel_values": ((1, 3, height, width), (self.rows, 3, height, width))}
        self.session = runtimes.open_model(graph_path, runtimes.settings_of(settings), shapes)
        odd = set(self.session.inputs) - {"pixel_values"}
        if odd:
            raise ValueError(f"{graph_path} takes inputs {sorted(odd)} besides pixel_values")

    def parse(self, images: list[bytes], name: str = "IMAGE") -> list[Deferred]:
        """Each image's pixel tensor, left for the batch to decode side by side (ServedModel.
        parse_all); a refused image's ValueError names the row and why."""
        return [
            Deferred(partial(self.pixels, data, name if len(images) == 1 else f"{name}[{i}]"))
            for i, data in enumerate(images)
        ]

    def pixels(self, data: bytes, where: str) -> np.ndarray:
        """The pixel tensor of one encoded image; ValueError naming `where` and why not."""
        try:
            return self.plan.pixels(decode(data, self.max_pixels))
        except ImageRefused as exc:
            raise ValueError(f"{where}: {exc}") from None

    def run(self, pixels: list[np.ndarray], output: str) -> np.ndarray:
        """`output` for every image, in order (images of one shape run together)."""
        order = pixel_runs(pixels, self.rows, self.session.jobs)
        feeds = [{"pixel_values": np.stack([pixels[i] for i in part])} for part in order]
        result: list[Any] = [None] * len(pixels)
        for part, (out,) in zip(order, self.session.run_many([output], feeds)):
            for row, i in enumerate(part):
                result[i] = out[row]
        return np.stack(result)


class ImageClassifier(ServedModel):
    """A served image classifier over one graph (serving.json: labels, activation, pixels (the
    processor's PixelPlan), runtime, and the file name `onnx`)."""

    inputs = (IMAGE,)
    outputs = (Tensor("LABEL", "STRING"), Tensor("SCORES", "FP32", ("num_labels",)))

    def __init__(self, graph_path: str, settings: dict[str, Any]):
        self.labels = [str(x) for x in settings["labels"]]
        self.activation = settings["activation"]
        activate(np.zeros((1, 1)), self.activation)  # an unknown activation fails at load
        self.images = ImagePixels(graph_path, settings)

    @classmethod
    def from_directory(cls, directory: str, settings: dict[str, Any]) -> ImageClassifier:
        return cls(os.path.join(directory, settings.get("onnx", "model.onnx")), settings)

    def parse(self, arrays: dict[str, np.ndarray]) -> list[Deferred]:
        return self.images.parse(image_column(arrays))

    def run(self, rows: list[np.ndarray]) -> dict[str, list[np.ndarray]]:
        scores = activate(self.images.run(rows, "logits"), self.activation)
        names = label_names(scores, self.labels, self.activation)
        return {
            "LABEL": [np.array([n.encode("utf-8")], dtype=np.object_) for n in names],
            "SCORES": list(scores),
        }
