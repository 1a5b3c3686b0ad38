"""How these validation photographs were made from their sources (run once; the files are
committed). Sources and licences: LICENSE.md. Needs Pillow, and the source files: matplotlib's
sample_data, scikit-learn's datasets/images and scikit-image 0.26's data folder (unzip its wheel),
passed as arguments.

    python make.py MPL_SAMPLE_DATA SKLEARN_IMAGES SKIMAGE_DATA

Several sizes, aspect ratios, formats and modes on purpose: the served path must decode and
preprocess all of them as the model's own processor does (tests/serving/test_images.py)."""

import sys
from pathlib import Path

from PIL import Image

mpl, sklearn, skimage = (Path(a) for a in sys.argv[1:4])
out = Path(__file__).parent


def fit(image: Image.Image, longest: int) -> Image.Image:
    scale = longest / max(image.size)
    size = (max(2, round(image.width * scale)), max(2, round(image.height * scale)))
    return image.resize(size, Image.Resampling.LANCZOS)


def rgb(path: Path) -> Image.Image:
    return Image.open(path).convert("RGB")


fit(rgb(mpl / "grace_hopper.jpg"), 600).save(out / "grace-hopper.jpg", quality=85)
fit(rgb(skimage / "astronaut.png"), 512).save(out / "astronaut.jpg", quality=85)
fit(rgb(skimage / "chelsea.png"), 451).save(out / "chelsea-cat.webp", quality=85)
fit(rgb(skimage / "coffee.png"), 600).save(out / "coffee.jpg", quality=85)
fit(rgb(skimage / "rocket.jpg"), 640).save(out / "rocket.jpg", quality=85)
fit(rgb(sklearn / "china.jpg"), 96).save(out / "china-thumbnail.png")
flower = rgb(sklearn / "flower.jpg")
flower.crop((0, 120, flower.width, 300)).save(out / "flower-wide.jpg", quality=85)
Image.open(skimage / "camera.png").convert("L").resize((256, 256)).save(out / "camera-gray.bmp")
fit(Image.open(skimage / "coins.png").convert("L"), 300).convert("P").save(out / "coins.gif")
# Stored on its side with EXIF orientation 6 (rotate 90 clockwise to view), as phones save.
hubble = fit(rgb(skimage / "hubble_deep_field.jpg"), 400)
exif = Image.Exif()
exif[0x0112] = 6
hubble.transpose(Image.Transpose.ROTATE_90).save(out / "hubble-exif-rotated.jpg", exif=exif)
horse = fit(Image.open(skimage / "horse.png").convert("RGBA"), 200)
horse.save(out / "horse-transparent.png")
fit(rgb(skimage / "chelsea.png"), 64).save(out / "chelsea-tiny.jpg", quality=90)
