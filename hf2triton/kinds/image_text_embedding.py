"""Kind `image_text_embedding` (`task: image-text-embedding`): a CLIP-style model (`CLIPModel`)
served as image and text embeddings in one space, L2-normalised: image search, zero-shot tagging,
multimodal retrieval.

Both towers are exported (the image tower as the graph the candidates vary, the text tower beside
it, hf2triton.serving.image_text_embedding). Validation items are the validation images, the
validation sentences (if any) and a prompt per zero-shot label (`labels`, with
`label_template`). The gate compares each served embedding with PyTorch's
(`get_image_features`, `get_text_features`) by cosine, and the zero-shot label each image gets
from the served embeddings (its nearest label prompt) with PyTorch's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from pydantic import Field

from hf2triton.errors import SpecError, UnsupportedModelError
from hf2triton.kinds.base import KINDS, Data, Limits
from hf2triton.kinds.data import read_lines, save_fast_tokenizer
from hf2triton.kinds.embedding import cosine_rows
from hf2triton.kinds.image_classification import TorchImages, data_uri, load_processor
from hf2triton.kinds.image_plan import image_plan
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import VisionKind, joined_files, onnx_files, read_images
from hf2triton.kinds.torch_reference import abs_difference, batched
from hf2triton.serving.image_text_embedding import ImageTextEmbedder, normalized
from hf2triton.util.specbase import Probability, Strict

TEXT_GRAPH = "text_model.onnx"  # the text tower, beside the image tower's model.onnx


class ImageTextThresholds(Strict):
    min_cosine: Probability = Field(
        0.99,
        description="lowest cosine of a served embedding with PyTorch's, over the validation "
        "images and texts",
    )
    mean_cosine: Probability = Field(0.995, description="mean of the same cosines")
    min_zero_shot_agreement: Probability = Field(
        0.99,
        description="share of validation images whose zero-shot label (the nearest label "
        "prompt) equals PyTorch's; needs `labels`",
    )


class ImageTextEmbeddingSpec(Strict):
    """`task: image-text-embedding`: CLIP-style image and text embeddings."""

    labels: list[str] = Field(
        default_factory=list,
        description="zero-shot labels the gate classifies the validation images with "
        "(each made a text by label_template)",
    )
    label_template: str = Field(
        "a photo of {}.", description="the text a zero-shot label becomes ({} is the label)"
    )
    thresholds: ImageTextThresholds = ImageTextThresholds()


@dataclass(frozen=True)
class ImageTextEmbeddingConfig:
    """What serving needs: the image processor's steps and the text tower's longest input."""

    pixels: dict[str, Any]  # hf2triton.serving.images.PixelPlan.to_dict()
    max_length: int
    logit_scale: float  # exp of the model's learned logit scale: zero-shot logits = it x cosine

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_logit_scale(model_dir: str | Path, config: Any) -> float:
    """exp of the learned `logit_scale` in the model's safetensors weights (the config's initial
    value for a model without them)."""
    from safetensors import safe_open

    for path in sorted(Path(model_dir).glob("*.safetensors")):
        with safe_open(str(path), "np") as weights:
            if "logit_scale" in weights.keys():  # noqa: SIM118 - safe_open has no __contains__
                return float(np.exp(weights.get_tensor("logit_scale")).reshape(-1)[0])
    return float(np.exp(config.logit_scale_init_value))


def modality_of(item: dict[str, str]) -> str:
    """An item's modality: items are {"image": path} or {"text": text}."""
    return "image" if "image" in item else "text"


class TorchClip(TorchImages):
    """The original PyTorch model's image and text features, on its own processor's tensors
    (images opened as transformers opens them: TorchImages) and its own tokenizer's ids."""

    def __init__(self, model_dir: str | Path, max_length: int):
        from transformers import AutoTokenizer

        super().__init__(model_dir, "AutoModel")
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.max_length = max_length

    def image_features(self, pixels: np.ndarray) -> np.ndarray:
        with self._torch.inference_mode():
            out = self.model.get_image_features(pixel_values=self._torch.from_numpy(pixels))
        return out.float().numpy()

    def tokens(self, texts: list[str]) -> dict[str, np.ndarray]:
        return dict(
            self.tokenizer(
                texts,
                padding=True,
                truncation=True,
                max_length=self.max_length,
                return_tensors="np",
            )
        )

    def text_features(self, tokens: dict[str, np.ndarray]) -> np.ndarray:
        feeds = {k: self._torch.from_numpy(v) for k, v in tokens.items()}
        with self._torch.inference_mode():
            return self.model.get_text_features(**feeds).float().numpy()

    def features(self, items: list[dict[str, str]]) -> np.ndarray:
        """Each item's raw (unnormalised) features, in order."""
        out: list[Any] = [None] * len(items)
        for modality, run in (("image", self._images), ("text", self._texts)):
            mine = [i for i, x in enumerate(items) if modality_of(x) == modality]
            for part in batched(mine, 16):
                for i, row in zip(part, run([items[i][modality] for i in part])):
                    out[i] = row
        return np.stack(out)

    def _images(self, paths: list[str]) -> np.ndarray:
        return self.image_features(self.pixel_values(paths))

    def _texts(self, texts: list[str]) -> np.ndarray:
        return self.text_features(self.tokens(texts))


def towers(model: Any) -> tuple[Any, Any]:
    """The model's `get_image_features` and `get_text_features` as modules of their own (the
    model a submodule of each: its weights become the graph's initializers)."""
    import torch

    class Image(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, pixel_values: Any) -> Any:
            return self.model.get_image_features(pixel_values=pixel_values)

    class Text(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, input_ids: Any, attention_mask: Any) -> Any:
            return self.model.get_text_features(input_ids=input_ids, attention_mask=attention_mask)

    return Image(), Text()


def export_towers(model_dir: str, out: Path, opset: int) -> None:
    """The image tower as model.onnx (pixel_values -> image_embeds) and the text tower as
    text_model.onnx (input_ids, attention_mask -> text_embeds), each exactly the model's
    `get_image_features` / `get_text_features`, with dynamic batch (and text length).

    torch.onnx's exporter directly: optimum exports CLIP as one graph that needs both an image
    and a text in every run, and its tower configs answer unprojected states."""
    import torch
    from transformers import AutoModel

    from hf2triton.util import quiet

    model = AutoModel.from_pretrained(model_dir).eval()
    vision, text = model.config.vision_config, model.config.text_config
    image_tower, text_tower = towers(model)
    size = vision.image_size
    # Traced with 2 rows of 7 tokens (a length of 1 would freeze a branch of the mask's code).
    ids = torch.full((2, 7), max(0, (text.bos_token_id or 0)), dtype=torch.long)
    ids[:, -1] = text.eos_token_id if text.eos_token_id is not None else text.vocab_size - 1
    batch = {0: "batch"}
    # The TorchScript exporter warns that it is deprecated, traces warn of Python values made
    # constants, and the text tower's pick of its end token (an index from argmax, never
    # negative) of what negative indices would do: the check on real inputs follows.
    with (
        torch.no_grad(),
        quiet.ignored_warnings(torch.jit.TracerWarning),
        quiet.ignored_warnings(DeprecationWarning),
        quiet.ignored_warnings(UserWarning, r"torch\.onnx"),
    ):
        torch.onnx.export(
            image_tower,
            (torch.zeros(2, 3, size, size),),
            str(out / "model.onnx"),
            dynamo=False,
            opset_version=opset,
            input_names=["pixel_values"],
            output_names=["image_embeds"],
            dynamic_axes={"pixel_values": batch, "image_embeds": batch},
        )
        tokens = {0: "batch", 1: "tokens"}
        torch.onnx.export(
            text_tower,
            (ids, torch.ones_like(ids)),
            str(out / TEXT_GRAPH),
            dynamo=False,
            opset_version=opset,
            input_names=["input_ids", "attention_mask"],
            output_names=["text_embeds"],
            dynamic_axes={"input_ids": tokens, "attention_mask": tokens, "text_embeds": batch},
        )


def zero_shot(embeddings: np.ndarray, data: Data) -> np.ndarray | None:
    """Each validation image's zero-shot label (index of its nearest label prompt), or None
    when the data has no labels."""
    found = data.extra.get("zero_shot")
    if not found:
        return None
    emb = normalized(embeddings)
    prompts = emb[found["prompts"]]
    return np.argmax(emb[found["images"]] @ prompts.T, axis=1)


@KINDS.register
class ImageTextEmbeddingKind(VisionKind[ImageTextEmbeddingConfig]):
    name = "image_text_embedding"
    task = "image-text-embedding"
    Options = ImageTextEmbeddingSpec
    serving_class = ImageTextEmbedder
    item_word = "images and texts"
    input_files = ("preprocessor_config.json", "tokenizer.json")
    tunable = False

    def resolve(self, model_dir: str) -> ImageTextEmbeddingConfig:
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(model_dir)
        if config.model_type != "clip":
            # SigLIP's text tower pools the last position of texts padded to a fixed length with
            # no attention mask: served as CLIP is, its text embeddings would be wrong.
            raise UnsupportedModelError(
                f"task image-text-embedding serves CLIP models (model_type 'clip'); "
                f"{model_dir} is {config.model_type!r}"
            )
        plan = image_plan(load_processor(model_dir))
        return ImageTextEmbeddingConfig(
            plan.to_dict(),
            int(config.text_config.max_position_embeddings),
            read_logit_scale(model_dir, config),
        )

    def config_from_dict(self, data: dict[str, Any]) -> ImageTextEmbeddingConfig:
        return ImageTextEmbeddingConfig(**data)

    def read_data(self) -> Data:
        """The images, the validation sentences (optional) and a prompt per label."""
        images = [{"image": p} for p in read_images(self.validation.images)]
        texts = (
            read_lines(self.validation.sentences, "validation.sentences")
            if self.validation.sentences
            else []
        )
        options = self.options
        if options.labels and "{}" not in options.label_template:
            raise SpecError(
                f"image_text_embedding.label_template {options.label_template!r} has no {{}} "
                "where the label goes: write e.g. 'a photo of {}.'"
            )
        prompts = [options.label_template.replace("{}", label) for label in options.labels]
        items = [*images, *({"text": t} for t in dict.fromkeys([*texts, *prompts]))]
        at = {x["text"]: i for i, x in enumerate(items) if "text" in x}
        extra = (
            {
                "zero_shot": {
                    "images": list(range(len(images))),
                    "prompts": [at[p] for p in prompts],
                    "labels": list(options.labels),
                }
            }
            if prompts
            else {}
        )
        return Data(items, extra)

    def item_size(self, item: Any) -> int:
        return Path(item["image"]).stat().st_size if "image" in item else len(item["text"])

    def requests(self, items: list[Any]) -> list[dict[str, np.ndarray]]:
        return [
            {"IMAGE": np.array([[Path(x["image"]).read_bytes()]], dtype=np.object_)}
            if "image" in x
            else {"TEXT": np.array([[x["text"].encode("utf-8")]], dtype=np.object_)}
            for x in items
        ]

    def calibration(self, data: Data) -> list[Any] | None:
        """The images: the image tower is the graph quantization calibrates."""
        return [x["image"] for x in data.items if "image" in x]

    def speed(self, model: Any, items: list[Any], batch: int) -> dict[str, float]:
        """Timed on the images: the candidates differ in the image tower alone (the texts, most
        of the items, would rank them by the fp32 text tower they share)."""
        images = [x for x in items if "image" in x]
        return super().speed(model, images or items, batch)

    def export_graph(self, model_dir: str, out: Path, opset: int) -> bool:
        export_towers(model_dir, out, opset)
        return True

    def prepare_export(self, model_dir: str, out: Path, cfg: ImageTextEmbeddingConfig) -> None:
        super().prepare_export(model_dir, out, cfg)
        save_fast_tokenizer(model_dir, out)

    def check_export(
        self, model_dir: str, out: Path, cfg: ImageTextEmbeddingConfig, inputs: list[Any]
    ) -> dict[str, float]:
        """Largest |ONNX - PyTorch| of the features, on the processor's tensors of the images
        and the tokenizer's ids of the texts in `inputs`."""
        import onnxruntime as ort

        torch_model = TorchClip(model_dir, cfg.max_length)
        cpu = ["CPUExecutionProvider"]
        image = ort.InferenceSession(str(out / self.main_file), providers=cpu)
        text = ort.InferenceSession(str(out / TEXT_GRAPH), providers=cpu)
        worst = 0.0
        for part in batched([x["image"] for x in inputs if "image" in x], 8):
            pixels = torch_model.pixel_values(part).astype(np.float32)
            (onnx,) = image.run(["image_embeds"], {"pixel_values": pixels})
            worst = max(worst, abs_difference(torch_model.image_features(pixels), onnx))
        for part in batched([x["text"] for x in inputs if "text" in x], 8):
            tokens = torch_model.tokens(part)
            feeds = {
                k: v.astype(np.int64)
                for k, v in tokens.items()
                if k in ("input_ids", "attention_mask")
            }
            (onnx,) = text.run(["text_embeds"], feeds)
            worst = max(worst, abs_difference(torch_model.text_features(tokens), onnx))
        return {"max_abs_diff": worst}

    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        files = super().version_files(candidate, export_dir)
        files["tokenizer.json"] = Path(export_dir) / "tokenizer.json"
        return joined_files(files, onnx_files(TEXT_GRAPH, Path(export_dir) / TEXT_GRAPH))

    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        return {
            **super().file_settings(files),
            "text_onnx": files[TEXT_GRAPH],
            "tokenizer": files["tokenizer.json"],
        }

    def info(self, reference: np.ndarray) -> dict[str, Any]:
        return {"embedding_dim": int(np.asarray(reference).shape[1])}

    def config_values(self, cfg: ImageTextEmbeddingConfig, info: dict[str, Any]) -> dict[str, Any]:
        return {"embedding_dim": info["embedding_dim"]}

    def config_parameters(self, cfg: ImageTextEmbeddingConfig) -> dict[str, str]:
        """The zero-shot temperature, for the OpenAI-compatible API's /v1/predict."""
        return {"logit_scale": f"{cfg.logit_scale:.9g}"}

    def reference(self, model_dir: str, cfg: ImageTextEmbeddingConfig, data: Data) -> np.ndarray:
        return normalized(TorchClip(model_dir, cfg.max_length).features(data.items))

    def extract(self, answers: list[dict[str, np.ndarray]]) -> np.ndarray:
        return np.concatenate([a["EMBEDDING"] for a in answers]).astype(np.float32)

    def from_json(self, reference: Any) -> np.ndarray:
        return np.asarray(reference, dtype=np.float32)

    def score(
        self, reference: Any, outputs: np.ndarray, data: Data, cfg: ImageTextEmbeddingConfig
    ) -> tuple[dict[str, float], dict]:
        reference = np.asarray(reference, dtype=np.float32)
        cos = cosine_rows(reference, outputs)
        images = np.array([modality_of(x) == "image" for x in data.items])
        metrics = {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean())}
        for name, mask in (("image", images), ("text", ~images)):
            if mask.any():
                metrics[f"min_{name}_cosine"] = float(cos[mask].min())
        served, torch = zero_shot(outputs, data), zero_shot(reference, data)
        if served is not None and torch is not None:
            metrics["zero_shot_agreement"] = float((served == torch).mean())
        worst = np.argsort(cos)[:10]
        return metrics, {
            "worst": [
                {"item": str(next(iter(data.items[i].values())))[:200], "cosine": float(cos[i])}
                for i in worst
            ]
        }

    def agreement_limits(self, tolerance: float) -> Limits:
        return {"min_cosine": (">=", 1.0 - tolerance)}

    def samples(
        self, reference: Any, outputs: np.ndarray, data: Data, cfg: ImageTextEmbeddingConfig
    ) -> dict[str, Sample]:
        reference = np.asarray(reference, dtype=np.float32)
        found = {"mean_cosine": Sample.mean(cosine_rows(reference, outputs))}
        served, torch = zero_shot(outputs, data), zero_shot(reference, data)
        if served is not None and torch is not None:
            found["zero_shot_agreement"] = Sample.mean((served == torch).astype(float))
        return found

    def limits(self) -> Limits:
        t = self.options.thresholds
        found: Limits = {"min_cosine": (">=", t.min_cosine), "mean_cosine": (">=", t.mean_cosine)}
        if self.options.labels:
            found["zero_shot_agreement"] = (">=", t.min_zero_shot_agreement)
        return found

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        worst = (details.get("worst") or [None])[0]
        if not worst:
            return ""
        return f"worst item {worst['item'][:40]!r} at cosine {worst['cosine']:.4f} to {against}'s"

    openai_route = "/embeddings"

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        """Images as base64 data URIs with `modality: image` (as infinity takes them), texts
        as the input strings."""
        if "IMAGE" in request:
            return {
                "input": [data_uri(bytes(b)) for b in request["IMAGE"][:, 0]],
                "modality": "image",
            }
        return {"input": [t.decode("utf-8") for t in request["TEXT"][:, 0]]}

    def openai_answer(
        self, body: dict[str, Any], request: dict[str, np.ndarray], cfg: ImageTextEmbeddingConfig
    ) -> dict[str, np.ndarray]:
        rows = sorted(body["data"], key=lambda d: d["index"])
        return {"EMBEDDING": np.array([d["embedding"] for d in rows], np.float32)}
