"""The bases of the model kinds by input modality, as optimum's exporters group their configs: a
kind derives from the one its requests carry (text for an encoder or a text-to-text model, an
image, an audio clip), which knows how an item becomes a Triton request, what the export writes
beside the graph for serving to read its input, and which files a version directory holds. The
kind itself adds what is its own: its section, config, reference, metrics and limits.

Example (an image classifier, one module beside the others, registered like them):

    @KINDS.register
    class ImageClassificationKind(VisionKind[ImageClassificationConfig]):
        name, task = "image-classification", "image-classification"
        serving_class = Images                 # hf2triton.serving.image_classification
        def resolve(self, model_dir): ...      # and the other abstract methods of ModelKind
"""

from __future__ import annotations

import functools
import shutil
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hf2triton.errors import ArtifactError, ExportError, SpecError
from hf2triton.kinds.base import Data, ModelKind, read_lines, save_fast_tokenizer
from hf2triton.kinds.roles import C


def graph_files(candidate: str) -> dict[str, Path]:
    """A candidate's graph as a version directory holds it: an ONNX file as model.onnx with the
    external data files it names, an OpenVINO IR as its .xml and .bin (a stateful IR keeps its
    name: OpenVINO GenAI opens its directory by it)."""
    graph = Path(candidate)
    if graph.suffix == ".xml":
        name = graph.stem if graph.name == "openvino_model.xml" else "model"
        return {f"{name}.xml": graph, f"{name}.bin": graph.with_suffix(".bin")}
    return onnx_files("model.onnx", graph)


def onnx_files(name: str, graph: Path) -> dict[str, Path]:
    """An ONNX graph as `name` and the external data files its tensors name, under the names
    it reads them by (beside it): a graph over 2 GB keeps its weights there (multilingual-e5-
    large's 2.2 GB export in `model.onnx_data`, its int8 graph in `model.onnx.data`), and a
    version directory without them does not load."""
    return joined_files(
        {name: graph}, {place: graph.parent / place for place in external_data(graph)}
    )


def joined_files(*parts: dict[str, Path]) -> dict[str, Path]:
    """A version directory's files from several graphs' (name -> source); ArtifactError when
    one name would hold two different files (two graphs' external data saved under one name):
    the graph that lost its file would read the other's weights."""
    out: dict[str, Path] = {}
    for part in parts:
        for name, source in part.items():
            if name in out and Path(out[name]).resolve() != Path(source).resolve():
                raise ArtifactError(
                    f"the version directory's {name!r} would be both {out[name]} and {source}: "
                    "save each graph's external data under a name of its own "
                    "(onnx.save(..., location='<graph>.onnx.data'))"
                )
            out[name] = source
    return out


def external_data(graph: Path) -> list[str]:
    """The `location`s of the tensors an ONNX file keeps outside itself (relative to it); read
    once per file and state (a graph's protobuf is parsed whole, up to 2 GB). Nothing for a
    file that is missing or not an ONNX graph: opening it refuses it, saying why."""
    if not graph.is_file():
        return []
    stat = graph.stat()
    return list(_external_data(str(graph.resolve()), stat.st_mtime_ns, stat.st_size))


@functools.lru_cache(maxsize=64)
def _external_data(graph: str, mtime_ns: int, size: int) -> tuple[str, ...]:
    import onnx

    try:
        model = onnx.load(graph, load_external_data=False)
    except Exception:  # noqa: BLE001 - protobuf's DecodeError: not a graph, its opening says so
        return ()
    places: set[str] = set()

    def visit(g: onnx.GraphProto) -> None:
        tensors = list(g.initializer)
        for node in g.node:
            for attr in node.attribute:
                tensors += [attr.t] if attr.HasField("t") else []
                tensors += list(attr.tensors)
                for sub in [attr.g] if attr.HasField("g") else []:
                    visit(sub)
                for sub in attr.graphs:
                    visit(sub)
        for t in tensors:
            if t.data_location == onnx.TensorProto.EXTERNAL:
                places.update(e.value for e in t.external_data if e.key == "location")

    visit(model.graph)
    for place in places:  # the version directory holds them beside the graph, nowhere else
        parts = Path(place).parts
        if Path(place).is_absolute() or ".." in parts or not parts or parts == (".",):
            raise ArtifactError(
                f"{graph} keeps tensors in {place!r}, outside its own folder: save its external "
                "data beside it (onnx.save(..., location='model.onnx.data'))"
            )
    return tuple(sorted(places))


def graph_setting(files: dict[str, str]) -> str:
    """serving.json's `onnx`: the graph file the runtime opens."""
    return files.get("model.xml") or files["model.onnx"]


class TextKind(ModelKind[C]):
    """Text in: each request carries its text (or texts) as BYTES, tokenized by the serving core
    with the `tokenizers` library from the tokenizer.json the export writes beside the graph."""

    modality: ClassVar[str] = "text"
    item_word: ClassVar[str] = "texts"
    input_files: ClassVar[tuple[str, ...]] = ("tokenizer.json",)

    def item_size(self, item: Any) -> int:
        return len(str(item))

    def requests(self, items: list[Any]) -> list[dict[str, np.ndarray]]:
        """One request per item: its text as the served class's first input."""
        first = self.served.inputs[0].name
        return [{first: np.array([[str(t).encode("utf-8")]], dtype=np.object_)} for t in items]

    def calibration(self, data: Data) -> list[Any] | None:
        """The texts, as the serving core encodes them; None for a kind of several graph files
        (calibrated file by file it would not be: they are not quantized that way)."""
        return [str(x) for x in data.items] if self.main_file == "model.onnx" else None

    def calibration_feeds(
        self,
        items: list[Any],
        onnx_path: str,
        export_dir: str,
        max_length: int,
        max_batch_tokens: int = 512,
    ) -> list[dict[str, np.ndarray]]:
        """The texts (or pairs) tokenized with the served tokenizer, sorted by length into
        token-bounded sub-batches, padded within each."""
        from hf2triton.serving.text import OnnxText, plan_sub_batches

        tokenizer = str(Path(export_dir) / "tokenizer.json")
        text = OnnxText(onnx_path, tokenizer, max_length, max_batch_tokens=max_batch_tokens)
        encodings = text.encode(items)
        lengths = [len(e.ids) for e in encodings]
        return [
            text.feeds([encodings[i] for i in group])
            for group in plan_sub_batches(lengths, max_batch_tokens)
        ]

    def prepare_export(self, model_dir: str, out: Path, cfg: C) -> None:
        """tokenizer.json beside the exported graph."""
        save_fast_tokenizer(model_dir, out)

    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        return {**graph_files(candidate), "tokenizer.json": Path(export_dir) / "tokenizer.json"}

    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        return {"onnx": graph_setting(files), "tokenizer": files["tokenizer.json"]}


class TextEncoderKind(TextKind[C]):
    """An encoder read whole at once (BERT-like): one graph, one forward pass per batch; its
    answer is a vector, labels or scores (embedding, classification, reranking)."""


class TextToTextKind(TextKind[C]):
    """Text in, text out, generated token by token (translation, text generation): graphs
    decoded in a loop, not calibrated whole."""


# The Hugging Face file of a model's input processor (an image processor's resizing and
# normalisation, an audio feature extractor's sampling rate and features).
PREPROCESSOR_FILE = "preprocessor_config.json"


class _ProcessedKind(ModelKind[C]):
    """Input that a preprocessor configuration turns into tensors: each request carries the
    item's encoded bytes (an image file, an audio file) as BYTES; the export copies the model's
    preprocessor_config.json beside the graph for the serving core to read."""

    input_name: ClassVar[str]
    input_files: ClassVar[tuple[str, ...]] = (PREPROCESSOR_FILE,)

    def item_size(self, item: Any) -> int:
        return len(item) if isinstance(item, bytes) else Path(item).stat().st_size

    def requests(self, items: list[Any]) -> list[dict[str, np.ndarray]]:
        """One request per item: the file's bytes (items are bytes or paths)."""
        return [
            {
                self.input_name: np.array(
                    [[x if isinstance(x, bytes) else Path(x).read_bytes()]], dtype=np.object_
                )
            }
            for x in items
        ]

    def prepare_export(self, model_dir: str, out: Path, cfg: C) -> None:
        found = Path(model_dir) / PREPROCESSOR_FILE
        if not found.is_file():
            raise ExportError(
                f"{model_dir} has no {PREPROCESSOR_FILE}, which serving needs to "
                f"turn {self.item_word} into the model's input"
            )
        shutil.copyfile(found, out / PREPROCESSOR_FILE)

    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        return {**graph_files(candidate), PREPROCESSOR_FILE: Path(export_dir) / PREPROCESSOR_FILE}

    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        return {"onnx": graph_setting(files), "preprocessor": files[PREPROCESSOR_FILE]}


IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif")


def read_images(path: str | Path | None, what: str = "validation.images") -> list[str]:
    """The image files `path` names (a folder's, sorted, or a list file's lines, relative to the
    file), each checked to be one image the served path takes; SpecError naming the file and
    why otherwise."""
    from hf2triton.serving.images import ImageRefused, decode

    if path is None:
        raise SpecError(f"{what} is not set: an image kind reads its validation images from it")
    where = Path(path)
    if where.is_dir():
        files = sorted(f for f in where.iterdir() if f.suffix.lower() in IMAGE_SUFFIXES)
    elif where.is_file():
        files = [where.parent / line.strip() for line in read_lines(where, what, "image paths")]
    else:
        raise SpecError(f"{what} {str(where)!r} does not exist: give a folder of image files")
    if not files:
        raise SpecError(f"{what} {str(where)!r} holds no image files ({', '.join(IMAGE_SUFFIXES)})")
    for f in files:
        try:
            decode(f.read_bytes())
        except OSError as exc:
            raise SpecError(f"{what}: {str(f)!r} cannot be read: {exc.strerror}") from None
        except ImageRefused as exc:
            raise SpecError(f"{what}: {str(f)!r} is refused: {exc}") from None
    return [str(f) for f in files]


class VisionKind(_ProcessedKind[C]):
    """An image in (encoded PNG, JPEG, ... as the IMAGE input); validation data is
    `validation.images`."""

    modality: ClassVar[str] = "image"
    item_word: ClassVar[str] = "images"
    input_name: ClassVar[str] = "IMAGE"

    def read_data(self) -> Data:
        return Data(read_images(self.validation.images))

    def calibration(self, data: Data) -> list[Any] | None:
        """The image files, for a kind of one graph."""
        return list(data.items) if self.main_file == "model.onnx" else None

    def calibration_feeds(
        self, items: list[Any], onnx_path: str, export_dir: str, max_length: int
    ) -> list[dict[str, np.ndarray]]:
        """The images decoded and preprocessed by the served path (the processor's steps read
        off its preprocessor_config.json beside the graph), in the served path's runs."""
        from transformers import AutoImageProcessor

        from hf2triton.kinds.image_plan import image_plan
        from hf2triton.serving.image_classification import MAX_ROWS
        from hf2triton.serving.images import decode, pixel_runs

        plan = image_plan(AutoImageProcessor.from_pretrained(export_dir, use_fast=False))
        pixels = [plan.pixels(decode(Path(p).read_bytes())) for p in items]
        return [
            {"pixel_values": np.stack([pixels[i] for i in part])}
            for part in pixel_runs(pixels, MAX_ROWS)
        ]


AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".m4a", ".webm")


def read_audio(
    path: str | Path | None, max_seconds: float = 600.0, what: str = "validation.audio"
) -> list[str]:
    """The audio files in the folder `path` names (sorted), each checked to be one clip the
    served path decodes, `max_seconds` long at most; SpecError naming the file and why
    otherwise."""
    from hf2triton.serving.audio import AudioRefused, decode

    if path is None:
        raise SpecError(f"{what} is not set: a speech kind reads its validation clips from it")
    where = Path(path)
    if not where.is_dir():
        raise SpecError(f"{what} {str(where)!r} is not a folder: give a folder of audio files")
    files = sorted(f for f in where.iterdir() if f.suffix.lower() in AUDIO_SUFFIXES)
    if not files:
        raise SpecError(f"{what} {str(where)!r} holds no audio files ({', '.join(AUDIO_SUFFIXES)})")
    for f in files:
        try:
            decode(f.read_bytes(), max_seconds=max_seconds)
        except AudioRefused as exc:
            raise SpecError(f"{what}: {str(f)!r} is refused: {exc}") from None
    return [str(f) for f in files]


class AudioKind(_ProcessedKind[C]):
    """An audio clip in (encoded WAV, FLAC, OGG, MP3, ... as the AUDIO input); validation data
    is `validation.audio`."""

    modality: ClassVar[str] = "audio"
    item_word: ClassVar[str] = "clips"
    input_name: ClassVar[str] = "AUDIO"

    def read_data(self) -> Data:
        return Data(read_audio(self.validation.audio))
