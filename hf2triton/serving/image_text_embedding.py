"""Served image-text embedding (CLIP, SigLIP): IMAGE [batch, 1] (an encoded image file per row) or
TEXT [batch, 1] (a UTF-8 text per row) in, one of the two per request; EMBEDDING [batch, dim] out,
L2-normalised, images and texts in one space (a text's dot product with an image is their cosine).

Two graphs: the image tower (`onnx`, pixel_values -> image_embeds), the graph the release's
candidates vary (quantized, converted), and the text tower (`text_onnx`, token ids ->
text_embeds) beside it, run by the same runtime. Images are decoded and preprocessed as the
image classifier's are (hf2triton.serving.images, the model's own processor's steps); texts are
tokenized with the model's tokenizer.json and cut at its `max_length`."""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from .base import TEXT, Deferred, ServedModel, Tensor, text_column
from .image_classification import IMAGE, ImagePixels, image_column
from .text import OnnxText


def normalized(rows: np.ndarray) -> np.ndarray:
    """Each row divided by its L2 norm (a zero row stays zero)."""
    rows = np.asarray(rows, dtype=np.float32)
    return rows / np.clip(np.linalg.norm(rows, axis=1, keepdims=True), 1e-12, None)


def image_row(pixels: Deferred) -> Deferred:
    """An image's row, ("image", its pixel tensor), made when the batch decodes its images."""
    return Deferred(lambda: ("image", pixels.make()))


class ImageTextEmbedder(ServedModel):
    """Image and text embeddings of one model (serving.json: pixels (the processor's
    PixelPlan), max_length, runtime, and the file names `onnx`, `text_onnx`,
    `tokenizer`)."""

    inputs = (Tensor("IMAGE", "STRING", optional=True), Tensor("TEXT", "STRING", optional=True))
    outputs = (Tensor("EMBEDDING", "FP32", ("embedding_dim",)),)

    def __init__(self, image_graph: str, text_graph: str, tokenizer: str, settings: dict[str, Any]):
        self.images = ImagePixels(image_graph, settings)
        self.text = OnnxText.of(text_graph, tokenizer, settings)

    @classmethod
    def from_directory(cls, directory: str, settings: dict[str, Any]) -> ImageTextEmbedder:
        return cls(
            os.path.join(directory, settings.get("onnx", "model.onnx")),
            os.path.join(directory, settings.get("text_onnx", "text_model.onnx")),
            os.path.join(directory, settings.get("tokenizer", "tokenizer.json")),
            settings,
        )

    def parse(self, arrays: dict[str, np.ndarray]) -> list[Any]:
        """("image", pixels) (deferred: parse_all decodes it) or ("text", text) per row; a
        request carries one of the two."""
        sent = [t.name for t in self.inputs if arrays.get(t.name) is not None]
        if len(sent) != 1:
            raise ValueError(
                "send either IMAGE (image files) or TEXT (texts) in a request, "
                + ("not both" if sent else "neither was sent")
            )
        if sent[0] == IMAGE.name:  # decoded with the batch's other images (parse_all)
            return [image_row(p) for p in self.images.parse(image_column(arrays))]
        return [("text", t) for t in text_column(arrays, TEXT.name)]

    def run(self, rows: list[tuple[str, Any]]) -> dict[str, list[np.ndarray]]:
        out: list[Any] = [None] * len(rows)
        for modality, embed in (("image", self.embed_pixels), ("text", self.embed_texts)):
            mine = [i for i, (m, _) in enumerate(rows) if m == modality]
            if mine:
                for i, row in zip(mine, embed([rows[i][1] for i in mine])):
                    out[i] = row
        return {"EMBEDDING": out}

    def embed_pixels(self, pixels: list[np.ndarray]) -> np.ndarray:
        return normalized(self.images.run(pixels, "image_embeds"))

    def embed_texts(self, texts: list[str]) -> np.ndarray:
        encodings = self.text.encode(texts)
        found = self.text.forward(encodings, ["text_embeds"], lambda out, mask: out["text_embeds"])
        return normalized(np.stack(found))
