"""Encoded image files to a model's pixel tensor, as its Hugging Face image processor makes it:
the one implementation the gate and Triton share for image kinds.

`decode` opens what a client sends (JPEG, PNG, WebP, BMP, a GIF's single frame) with Pillow,
refusing what is not one image of a sane size (ImageRefused, naming why), applies its EXIF
orientation and converts it to RGB. `PixelPlan` is a processor's steps written out as data (the
pipeline side reads them off transformers' processor, hf2triton.kinds.image_plan), and
`PixelPlan.pixels` runs them as transformers' slow processors do: Pillow's resize with the
processor's filter on the uint8 image, a center crop (zero-padded where the image is smaller),
rescale in float64 then float32, normalise in float32, channels first. tests/serving/
test_images.py holds the result to `AutoImageProcessor`'s `pixel_values` on real photographs.
"""

from __future__ import annotations

import io
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

# Pillow's own guard is a warning up to twice this; a served path refuses before decoding.
MAX_PIXELS = 40_000_000  # about a 50 MP phone photo at most (7,700 x 5,200)
MIN_SIDE = 2  # a 1-pixel side has no center to crop or resample around


class ImageRefused(ValueError):
    """An input that is not one image the served path takes; the message says why and what to
    send instead."""


def decode(data: bytes, max_pixels: int = MAX_PIXELS) -> Any:
    """The RGB Pillow image in `data` (an encoded file), upright as its EXIF orientation says;
    ImageRefused when it is not an image, is truncated, animated, too small or too large."""
    from PIL import Image, ImageOps, UnidentifiedImageError

    if not data:
        raise ImageRefused("the image is empty (0 bytes): send an encoded image file")
    try:
        image = Image.open(io.BytesIO(data))  # reads the header only
    except UnidentifiedImageError:
        raise ImageRefused(
            "not an image file Pillow can read: send JPEG, PNG, WebP, BMP or GIF bytes"
        ) from None
    except Image.DecompressionBombError:
        raise ImageRefused(
            f"the image is over {2 * (Image.MAX_IMAGE_PIXELS or 0):,} pixels (a decompression "
            f"bomb to Pillow): send a smaller image ({max_pixels:,} pixels at most)"
        ) from None
    width, height = image.size
    if width * height > max_pixels:
        raise ImageRefused(
            f"the image is {width} x {height} pixels, over the {max_pixels:,} this model "
            "takes: send a smaller image"
        )
    if min(width, height) < MIN_SIDE:
        raise ImageRefused(f"the image is {width} x {height} pixels: send at least 2 x 2")
    frames = int(getattr(image, "n_frames", 1))
    if frames > 1:
        raise ImageRefused(
            f"the image is animated ({frames} frames): send one frame as its own file"
        )
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as exc:
        raise ImageRefused(
            f"the image file is damaged or truncated ({exc}): send it whole"
        ) from None
    return ImageOps.exif_transpose(image).convert("RGB")


@dataclass(frozen=True)
class PixelPlan:
    """An image processor's steps. `resize`: "exact" (to `height` x `width`), "shortest_edge"
    (the shorter side to `shortest_edge`, the other in proportion, truncated) or "" (none);
    `resample`: Pillow's filter number; `crop`: (height, width) of the center crop, or None;
    `rescale`: the factor, or None; `mean`/`std`: the normalisation, or None."""

    resize: str
    height: int = 0
    width: int = 0
    shortest_edge: int = 0
    resample: int = 2  # Pillow's BILINEAR
    crop: tuple[int, int] | None = None
    rescale: float | None = None
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> PixelPlan:
        crop, mean, std = data.get("crop"), data.get("mean"), data.get("std")
        return cls(
            **{
                **data,
                "crop": tuple(crop) if crop else None,
                "mean": tuple(mean) if mean else None,
                "std": tuple(std) if std else None,
            }
        )

    def out_size(self) -> tuple[int, int]:
        """The (height, width) of every pixel tensor; for a plan whose size follows the image
        (shortest_edge, no crop) the smallest it can be."""
        if self.crop is not None:
            return self.crop
        if self.resize == "exact":
            return self.height, self.width
        return self.shortest_edge, self.shortest_edge

    def size_for(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) the image is resized to."""
        if self.resize == "exact":
            return self.width, self.height
        short, long = sorted((width, height))
        new_long = int(self.shortest_edge * long / short)
        return (self.shortest_edge, new_long) if width <= height else (new_long, self.shortest_edge)

    def pixels(self, image: Any) -> np.ndarray:
        """The (3, H, W) float32 pixel tensor of an RGB Pillow image."""
        if self.resize:
            image = image.resize(self.size_for(*image.size), resample=self.resample)
        array = np.asarray(image, dtype=np.uint8)  # (H, W, 3)
        if self.crop is not None:
            array = center_crop(array, *self.crop)
        values: np.ndarray = array
        if self.rescale is not None:
            values = (array.astype(np.float64) * self.rescale).astype(np.float32)
        if self.mean is not None and self.std is not None:
            values = values.astype(np.float32, copy=False)
            values = (values - np.array(self.mean, np.float32)) / np.array(self.std, np.float32)
        return np.ascontiguousarray(values.transpose(2, 0, 1), dtype=np.float32)


def pixel_runs(pixels: list[np.ndarray], rows: int, jobs: int = 1) -> list[list[int]]:
    """Which images run together through the graph: those of one shape, at most `rows` a run
    and, for a runtime that overlaps `jobs` runs (OpenVINO's streams), in at least `jobs` runs
    where there are that many images (indices into `pixels`). A dynamic batch of 3 on two
    streams runs as 2 + 1, not as one run that leaves a stream idle: ViT-base on OpenVINO bf16,
    2-core EPYC, ran 5.4 images/s one run at a time against 10.8 two at a time."""
    by_shape: dict[tuple[int, ...], list[int]] = {}
    for i, p in enumerate(pixels):
        by_shape.setdefault(p.shape, []).append(i)
    out = []
    for same in by_shape.values():
        step = max(1, min(rows, -(-len(same) // max(1, jobs))))
        out += [same[i : i + step] for i in range(0, len(same), step)]
    return out


def center_crop(array: np.ndarray, height: int, width: int) -> np.ndarray:
    """The center `height` x `width` of an (H, W, C) array, the top-left corner floored; where
    the image is smaller it is first centered on zeros (transformers' `center_crop`)."""
    h, w = array.shape[:2]
    top, left = (h - height) // 2, (w - width) // 2
    if top >= 0 and left >= 0:
        return array[top : top + height, left : left + width]
    new_h, new_w = max(height, h), max(width, w)
    padded = np.zeros((new_h, new_w, array.shape[2]), dtype=array.dtype)
    pad_top, pad_left = math.ceil((new_h - h) / 2), math.ceil((new_w - w) / 2)
    padded[pad_top : pad_top + h, pad_left : pad_left + w] = array
    top, left = top + pad_top, left + pad_left
    return padded[max(0, top) : min(new_h, top + height), max(0, left) : min(new_w, left + width)]
