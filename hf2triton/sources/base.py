"""What every model source shares: its spec section's common keys, the fetch result, and the
check that a directory is a complete Hugging Face model, with the sha256 of the files that
define it (config, weights, tokenizer) for the release record."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path
from typing import Any, ClassVar, NotRequired, TypedDict

from pydantic import Field

from hf2triton.errors import SourceError
from hf2triton.kinds.modality import PREPROCESSOR_FILE
from hf2triton.util import plugins
from hf2triton.util.specbase import Strict
from hf2triton.util.workspace import digest, hash_files

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "sentencepiece.bpe.model",
    "spiece.model",
    "source.spm",
    "target.spm",
)
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
SENTENCE_TRANSFORMERS_FILES = (
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "1_Pooling/config.json",
)


class FetchResult(TypedDict):
    model_dir: str
    source_id: str
    revision: str | None  # resolved hub commit, registry version; None for a local directory
    files: dict[str, str]  # relative path -> sha256
    content_hash: str
    registry: NotRequired[dict[str, str | None]]  # an mlflow source: uri, model, version, run


class Source(Strict):
    """A spec's `source:` section: one plug-in, named by the one key of its own it holds
    (`key`), with its own keys and how it brings the model to a local directory."""

    key: ClassVar[str]  # the spec key that names this source: repo_id, path, package, ...
    name: ClassVar[str]  # its registry name (its key unless it says): hub, path, package, ...

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "key" in cls.__dict__ and "name" not in cls.__dict__:
            cls.name = cls.key

    model_id: str | None = Field(None, description="id recorded as lineage for local sources")

    @property
    def lineage_id(self) -> str:
        """What the release record names the model by."""
        return self.model_id or str(getattr(self, self.key))

    def fetch(self, mlflow_uri: str) -> FetchResult:
        """The model in a checked local directory (`mlflow_uri`: the release's registry)."""
        model_dir, revision = self.locate()
        return local_result(model_dir, self.lineage_id, revision)

    def locate(self) -> tuple[Path, str | None]:
        """The model's directory and its resolved revision."""
        raise NotImplementedError

    def check_up_front(self) -> None:
        """What is cheap to check before any step runs (a local folder is a model folder);
        the fetch step checks the rest."""

    def trigger(self, name: str, spec_params: dict[str, Any]) -> dict[str, Any] | None:
        """A Prefect trigger that releases the spec when the source has something new (None:
        the source announces nothing)."""
        return None


# The sources by name; each source's module registers it where it is defined
# (`@SOURCES.register`), and hf2triton.sources imports the modules.
SOURCES = plugins.Registry(lambda cls: cls.name, default="path")


def local_result(model_dir: Path, source_id: str, revision: str | None) -> FetchResult:
    files = inspect_model_dir(model_dir)
    return FetchResult(
        model_dir=str(model_dir.resolve()),
        source_id=source_id,
        revision=revision,
        files=files,
        content_hash=digest(files),
    )


def _weight_files(model_dir: Path) -> list[str]:
    for index in WEIGHT_INDEXES:
        if (model_dir / index).is_file():
            _check_json(model_dir, [index])
            weight_map = json.loads((model_dir / index).read_text(encoding="utf-8"))
            if not isinstance(weight_map, dict) or not isinstance(
                weight_map.get("weight_map"), dict
            ):
                raise SourceError(
                    f"{model_dir / index} has no weight_map of tensors to shard files: "
                    "re-download or re-save the model"
                )
            shards = sorted(set(map(str, weight_map["weight_map"].values())))
            missing = [s for s in shards if not (model_dir / s).is_file()]
            if missing:
                raise SourceError(
                    f"{model_dir}: weight shards {missing} listed in {index} are missing"
                )
            return [index, *shards]
    found = [w for w in WEIGHT_FILES if (model_dir / w).is_file()]
    if not found:
        raise SourceError(
            f"{model_dir} has no model weights (expected one of {', '.join(WEIGHT_FILES)}): "
            "point source.path at a complete save_pretrained() directory"
        )
    return found[:1]  # safetensors first: it is what transformers loads when both exist


def _check_weights(model_dir: Path, names: list[str]) -> None:
    """Cheap structural checks so corrupt weights fail here, with the file named."""
    for name in names:
        path = model_dir / name
        try:
            if name.endswith(".safetensors"):
                from safetensors import safe_open

                with safe_open(str(path), framework="np") as f:
                    if not list(f.keys()):
                        raise ValueError("no tensors")
            elif name.endswith(".bin"):
                with zipfile.ZipFile(path) as z:
                    if z.testzip() is not None:
                        raise ValueError("a member fails its CRC")
        except Exception as exc:  # the libraries raise many types for a damaged file
            raise SourceError(
                f"weights file {path} is corrupt or truncated ({exc}): re-download or re-save "
                "the model"
            ) from None


def check_model_folder(model_dir: Path) -> None:
    """A model directory exists, can be read and has its config.json."""
    try:
        is_dir, has_config = model_dir.is_dir(), (model_dir / "config.json").is_file()
    except OSError as exc:  # a folder this user may not enter
        raise SourceError(
            f"model directory {model_dir} cannot be read ({exc.strerror}): give the user that "
            "runs hf2triton read access to it, or point the source at a copy it can read"
        ) from None
    if not is_dir:
        raise SourceError(
            f"model directory {model_dir} does not exist: point the source at a folder that "
            "save_pretrained() wrote"
        )
    if not has_config:
        raise SourceError(
            f"{model_dir} has no config.json: it is not a Hugging Face model directory (point "
            "the source at a folder that save_pretrained() wrote)"
        )


def inspect_model_dir(model_dir: Path) -> dict[str, str]:
    """Check that a directory is a complete Hugging Face model and hash its defining files."""
    check_model_folder(model_dir)
    weights = _weight_files(model_dir)
    _check_weights(model_dir, weights)
    tokenizer = [t for t in TOKENIZER_FILES if (model_dir / t).is_file()]
    # An image or audio model reads its input through its processor's configuration instead.
    processor = [p for p in (PREPROCESSOR_FILE,) if (model_dir / p).is_file()]
    if not tokenizer and not processor:
        raise SourceError(
            f"{model_dir} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}) and no "
            f"{PREPROCESSOR_FILE}: save the tokenizer (or the image processor, the feature "
            "extractor) beside the model with .save_pretrained(dir)"
        )
    extras = [
        f for f in (*TOKENIZER_EXTRAS, *SENTENCE_TRANSFORMERS_FILES) if (model_dir / f).is_file()
    ]
    names = ["config.json", *weights, *tokenizer, *processor, *extras]
    _check_json(model_dir, [n for n in names if n.endswith(".json")])
    return hash_files(model_dir, names)


def _check_json(model_dir: Path, names: list[str]) -> None:
    """Every JSON file that defines the model parses, so a damaged one is named here and not met
    as a bare JSONDecodeError deep inside transformers or optimum."""
    for name in names:
        path = model_dir / name
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise SourceError(
                f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                "re-download or re-save the model"
            ) from None
        except ValueError as exc:
            raise SourceError(
                f"{path} is not valid JSON ({exc}): re-download or re-save the model"
            ) from None
