"""A Hugging Face image processor's steps as a PixelPlan (hf2triton.serving.images), which the
served path runs without transformers. One entry a processor class: how its `size` and crop are
read. A class not in the table is refused, naming the classes that are (its steps are not known
to be these)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hf2triton.errors import UnsupportedModelError
from hf2triton.serving.images import PixelPlan


def _common(p: Any) -> dict[str, Any]:
    """Rescale and normalise, as every processor in the table reads them."""
    normalize = bool(getattr(p, "do_normalize", False))
    return {
        "resample": int(getattr(p, "resample", 2)),
        "rescale": float(p.rescale_factor) if getattr(p, "do_rescale", False) else None,
        "mean": tuple(float(v) for v in p.image_mean) if normalize else None,
        "std": tuple(float(v) for v in p.image_std) if normalize else None,
    }


def _resize(p: Any) -> dict[str, Any]:
    """`size` as {"height", "width"} (exact) or {"shortest_edge"} (in proportion)."""
    if not getattr(p, "do_resize", False):
        return {"resize": ""}
    size = dict(p.size)
    if "height" in size and "width" in size:
        return {"resize": "exact", "height": int(size["height"]), "width": int(size["width"])}
    if set(size) == {"shortest_edge"}:
        return {"resize": "shortest_edge", "shortest_edge": int(size["shortest_edge"])}
    raise UnsupportedModelError(
        f"{type(p).__name__} size {size} is neither height and width nor shortest_edge alone"
    )


def _crop(p: Any) -> dict[str, Any]:
    if not getattr(p, "do_center_crop", False):
        return {"crop": None}
    return {"crop": (int(p.crop_size["height"]), int(p.crop_size["width"]))}


def resize_then_crop(p: Any) -> PixelPlan:
    """ViT, DeiT, BEiT, CLIP, SigLIP: resize, then a center crop where it has one."""
    return PixelPlan(**_resize(p), **_crop(p), **_common(p))


def convnext(p: Any) -> PixelPlan:
    """ConvNeXt: below 384 the shorter side to shortest_edge / crop_pct, then the center
    shortest_edge square; from 384 an exact square."""
    if not getattr(p, "do_resize", False):
        return PixelPlan(resize="", **_common(p))
    edge = int(p.size["shortest_edge"])
    if edge < 384:
        return PixelPlan(
            resize="shortest_edge",
            shortest_edge=int(edge / p.crop_pct),
            crop=(edge, edge),
            **_common(p),
        )
    return PixelPlan(resize="exact", height=edge, width=edge, **_common(p))


PLANS: dict[str, Callable[[Any], PixelPlan]] = {
    "ViTImageProcessor": resize_then_crop,
    "DeiTImageProcessor": resize_then_crop,
    "BeitImageProcessor": resize_then_crop,
    "CLIPImageProcessor": resize_then_crop,
    "SiglipImageProcessor": resize_then_crop,
    "ConvNextImageProcessor": convnext,
}


def image_plan(processor: Any) -> PixelPlan:
    """The PixelPlan of a transformers image processor (a slow one: the fast ones resize with
    torchvision, another result)."""
    name = type(processor).__name__
    if name not in PLANS:
        raise UnsupportedModelError(
            f"image processor {name} is not one hf2triton reproduces "
            f"({', '.join(sorted(PLANS))}); report the model"
        )
    return PLANS[name](processor)
