"""The served path's image decoding and pixels (hf2triton.serving.images) against transformers'
own loading (`load_image`) and image processors, on real photographs: the release's validation
set (releases/data/images) and matplotlib's bundled portrait of Grace Hopper (a US Navy
photograph in the public domain) cut and re-encoded at several sizes, aspect ratios, modes and
formats; and the inputs it refuses, each with why."""

from __future__ import annotations

import io
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from hf2triton.kinds.image_plan import image_plan
from hf2triton.serving.images import ImageRefused, decode, pixel_runs
from tests.tiny_models import PHOTOS


def photo() -> Path:
    import matplotlib

    return Path(matplotlib.get_data_path()) / "sample_data" / "grace_hopper.jpg"


def encoded(image, fmt: str, **options) -> bytes:
    out = io.BytesIO()
    image.save(out, format=fmt, **options)
    return out.getvalue()


def photographs() -> dict[str, bytes]:
    """The photograph as a client could send it: whole, thumbnails, a panorama and a tall strip
    cut from it, grey, with an alpha channel, EXIF-rotated, and in each format served."""
    from PIL import Image

    whole = Image.open(photo())
    whole.load()
    w, h = whole.size
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 clockwise to view
    shipped = {
        f"validation {p.name}": p.read_bytes()
        for p in sorted(PHOTOS.iterdir())
        if p.suffix not in (".py", ".md")
    }
    return {
        **shipped,
        "jpeg whole": photo().read_bytes(),
        "thumbnail 64": encoded(whole.resize((64, 75)), "JPEG"),
        "panorama": encoded(whole.crop((0, h // 3, w, h // 3 + w // 5)), "PNG"),
        "tall strip": encoded(whole.crop((w // 3, 0, w // 3 + h // 5, h)), "PNG"),
        "small 30x20": encoded(whole.resize((30, 20)), "PNG"),
        "grey": encoded(whole.convert("L"), "PNG"),
        "with alpha": encoded(whole.convert("RGBA"), "PNG"),
        "webp": encoded(whole.resize((300, 351)), "WEBP", quality=90),
        "bmp": encoded(whole.resize((97, 113)), "BMP"),
        "gif": encoded(whole.resize((120, 140)), "GIF"),
        "exif rotated": encoded(whole, "JPEG", exif=exif.tobytes()),
    }


def processors() -> dict[str, object]:
    from transformers import (
        BeitImageProcessor,
        CLIPImageProcessor,
        ConvNextImageProcessor,
        DeiTImageProcessor,
        SiglipImageProcessor,
        ViTImageProcessor,
    )

    return {
        "vit": ViTImageProcessor(),
        "deit": DeiTImageProcessor(),
        "beit": BeitImageProcessor(),
        "clip": CLIPImageProcessor(),
        "siglip": SiglipImageProcessor(),
        # Below 384 the shorter side to 224 / crop_pct, then a 224 crop; from 384 a square.
        "convnext 224": ConvNextImageProcessor(size={"shortest_edge": 224}),
        "convnext 384": ConvNextImageProcessor(size={"shortest_edge": 384}),
        # No resize: the center crop pads an image smaller than it with zeros.
        "crop only": CLIPImageProcessor(do_resize=False),
    }


@pytest.mark.parametrize("name", list(processors()))
def test_served_pixels_are_the_processors_pixel_values_on_every_photograph(name):
    processor = processors()[name]
    plan = image_plan(processor)
    from PIL import Image
    from transformers.image_utils import load_image

    for what, data in photographs().items():
        # transformers' own opening (EXIF orientation, RGB) and processor on one side, the
        # served path's on the other.
        theirs = load_image(Image.open(io.BytesIO(data)))
        # channels_last: a 3-pixel-high image is otherwise read as channels first.
        want = processor(theirs, return_tensors="np", input_data_format="channels_last")
        got = plan.pixels(decode(data))
        assert got.dtype == np.float32 and got.shape == want["pixel_values"][0].shape, what
        assert np.abs(got - want["pixel_values"][0]).max() <= 1e-5, what


def test_the_plan_travels_as_data():
    from hf2triton.serving.images import PixelPlan

    plan = image_plan(processors()["convnext 224"])
    assert (plan.resize, plan.shortest_edge, plan.crop) == ("shortest_edge", 256, (224, 224))
    assert PixelPlan.from_dict(plan.to_dict()) == plan


def test_decoding_applies_exif_orientation_and_gives_rgb():
    whole = decode(photographs()["jpeg whole"])
    rotated = decode(photographs()["exif rotated"])
    assert rotated.size == whole.size[::-1] and rotated.mode == "RGB"
    assert decode(photographs()["grey"]).mode == decode(photographs()["with alpha"]).mode == "RGB"


def test_an_unknown_processor_is_refused_naming_the_known_ones():
    from hf2triton.errors import UnsupportedModelError

    class PoolFormerImageProcessor:  # crop_pct means another thing there
        pass

    with pytest.raises(UnsupportedModelError, match="PoolFormerImageProcessor .*ViTImageProcessor"):
        image_plan(PoolFormerImageProcessor())


def png_claiming(width: int, height: int) -> bytes:
    """A small PNG whose header says `width` x `height` (a decompression bomb's header)."""
    from PIL import Image

    data = bytearray(encoded(Image.new("L", (4, 4)), "PNG"))
    ihdr = struct.pack(">II", width, height) + bytes(data[24:29])
    data[16:29] = ihdr
    data[29:33] = struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return bytes(data)


def animated_gif() -> bytes:
    from PIL import Image

    frames = [Image.new("RGB", (8, 8), c) for c in ("red", "blue")]
    return encoded(frames[0], "GIF", save_all=True, append_images=frames[1:])


@pytest.mark.parametrize(
    ("data", "says"),
    [
        (b"", "empty"),
        (b"this is not an image", "not an image file"),
        (photo().read_bytes()[:4000], "truncated"),
        (png_claiming(1, 1), "at least 2 x 2"),
        (png_claiming(8_000, 6_000), "8000 x 6000 pixels, over the 40,000,000"),
        (png_claiming(20_000, 20_000), r"pixels \(a decompression bomb to Pillow\)"),
        (animated_gif(), r"animated \(2 frames\)"),
    ],
    ids=[
        "empty",
        "not an image",
        "truncated",
        "1x1",
        "too large",
        "decompression bomb",
        "animated",
    ],
)
def test_bad_images_are_refused_naming_why(data, says):
    with pytest.raises(ImageRefused, match=says):
        decode(data)


def test_a_dynamic_batch_is_cut_into_a_run_per_stream_of_images_of_one_shape():
    """OpenVINO's THROUGHPUT streams run side by side only when a batch is several runs: three
    images on two streams run as 2 + 1, not as one run that leaves a stream idle; no run is
    longer than `rows`, no run mixes shapes, and every image runs once."""
    small, wide = np.zeros((3, 4, 4), np.float32), np.zeros((3, 4, 6), np.float32)
    assert pixel_runs([small] * 3, rows=4, jobs=2) == [[0, 1], [2]]
    assert pixel_runs([small] * 3, rows=4, jobs=1) == [[0, 1, 2]]
    assert pixel_runs([small] * 16, rows=4, jobs=2) == [
        [0, 1, 2, 3],
        [4, 5, 6, 7],
        [8, 9, 10, 11],
        [12, 13, 14, 15],
    ]
    mixed = [small, wide, small, wide, wide]
    runs = pixel_runs(mixed, rows=4, jobs=2)
    assert sorted(i for run in runs for i in run) == list(range(5))
    assert all(len({mixed[i].shape for i in run}) == 1 for run in runs)
    assert len(runs) == 4  # each shape's images in two runs
