"""The interface every model kind implements, and the parts of it they share.

A kind (embedding, classification, translation, reranking) is chosen once from the spec's `task`
(`hf2triton.spec.kind_for`) and given the settings it owns: its own spec section and the
validation data's settings, never the whole spec. It knows what the export needs, what its
validation data looks like, what the PyTorch reference says, how served answers are scored against
it and with which limits (the gate and the smoke test use the same ones), and which files its Triton
version directory holds. Everything else (the gate loop, the repository, the smoke test, the
reports) is written once, against this interface.
"""

from __future__ import annotations

import json
import math
import shutil
import time
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import numpy as np

from hf2triton import serving
from hf2triton.errors import ExportError, SpecError
from hf2triton.kinds.margin import Sample

if TYPE_CHECKING:
    from hf2triton.serving.base import ServedModel


class ValidationSettings(Protocol):
    """What a kind reads of the spec's `validation` section."""

    @property
    def sentences(self) -> str: ...

    @property
    def smoke_sentences(self) -> int: ...


# A limit is (metric, ">=" or "<=", value): a metric passes when it is on the right side of it.
Limits = dict[str, tuple[str, float]]


@dataclass
class Data:
    """A kind's validation data: `items` (one served request each: a text, or a query with its
    passages) and whatever else its metrics need (gold labels, reference translations)."""

    items: list[Any]
    extra: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.items)


@dataclass(frozen=True)
class Candidate:
    """One ONNX variant the gate measures (a file, or a directory of files for seq2seq), on the
    runtime serving.json will name (None: ONNX Runtime, CPU, fp32, as versions before runtimes
    were plug-ins), and the runtime the gate runs it on (the same, but for a CPU numerics check
    of a GPU runtime)."""

    name: str  # e.g. "dynamic-int8/qint8/per-channel", "fp32", "fp32 on openvino bf16"
    onnx_path: str
    runtime: dict[str, Any] | None = None
    gate_runtime: dict[str, Any] | None = None
    error: str | None = None  # building its graph failed: the gate refuses it with this

    @property
    def gated_runtime(self) -> dict[str, Any] | None:
        return self.gate_runtime or self.runtime


def read_lines(path: str | Path, what: str, items: str = "sentences") -> list[str]:
    """Non-empty lines of a UTF-8 file; SpecError naming `what` (the spec key) otherwise."""
    p = Path(path)
    try:
        lines = p.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise SpecError(f"{what} file {str(p)!r} does not exist") from None
    except UnicodeDecodeError as exc:
        raise SpecError(
            f"{what} file {str(p)!r} is not UTF-8 text ({exc.reason} at byte {exc.start}): save "
            f"it as UTF-8, one of its {items} per line"
        ) from None
    except OSError as exc:
        raise SpecError(f"{what} file {str(p)!r} cannot be read: {exc.strerror}") from None
    found = [line for line in lines if line.strip()]
    if not found:
        raise SpecError(f"{what} file {str(p)!r} holds no {items}: put one per line")
    return found


def read_json(path: Path) -> Any:
    """A JSON file of a model's directory, or None when it is missing or not JSON."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None


def model_max_length(model_dir: str | Path, max_length: int | None = None) -> int:
    """The truncation length the model's authors serve with: sentence-transformers'
    max_seq_length (all-MiniLM-L6-v2: 256, not the tokenizer's 512), else the smaller of the
    tokenizer's and the position embeddings' limits."""
    model_dir = Path(model_dir)
    if max_length is None:
        max_length = (read_json(model_dir / "sentence_bert_config.json") or {}).get(
            "max_seq_length"
        )
    if max_length is None:
        tok_cfg = read_json(model_dir / "tokenizer_config.json") or {}
        model_cfg = read_json(model_dir / "config.json") or {}
        limits = [
            v
            for v in (tok_cfg.get("model_max_length"), model_cfg.get("max_position_embeddings"))
            if isinstance(v, int) and 0 < v < 100_000
        ]
        max_length = min(limits) if limits else 512
    return int(max_length)


def misses(metrics: dict[str, float], limits: Limits) -> dict[str, float]:
    """How far each metric is on the wrong side of its limit (empty: every limit is met).
    A metric the limits name but the figures lack is not judged (e.g. accuracy in a smoke test,
    which has no gold labels); a NaN metric always misses."""
    out = {}
    for name, (op, limit) in limits.items():
        if name not in metrics:
            continue
        value = metrics[name]
        ok = value >= limit if op == ">=" else value <= limit  # False for NaN
        if not ok:
            out[name] = abs(limit - value) if not math.isnan(value) else float("inf")
    return out


def describe_misses(metrics: dict[str, float], limits: Limits, missed: dict[str, float]) -> str:
    parts = []
    for name, gap in missed.items():
        op, limit = limits[name]
        side = "<" if op == ">=" else ">"
        word = "short by" if op == ">=" else "over by"
        parts.append(f"{name} {metrics[name]:.4f} {side} {limit} ({word} {gap:.4f})")
    return ", ".join(parts)


def worst_of(runs: list[dict[str, float]], limits: Limits) -> dict[str, float]:
    """The worst value of each metric over several runs (e.g. batch compositions)."""
    out = {}
    for name in runs[0]:
        values = [r[name] for r in runs]
        if any(isinstance(v, float) and math.isnan(v) for v in values):
            out[name] = float("nan")
        elif limits.get(name, (">=",))[0] == "<=":
            out[name] = max(values)
        else:
            out[name] = min(values)
    return out


def to_json(value: Any) -> Any:
    """numpy values to plain JSON-able ones."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, (np.floating, np.integer)):
        return value.item()
    if isinstance(value, dict):
        return {k: to_json(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(v) for v in value]
    return value


def save_fast_tokenizer(model_dir: str, out: Path) -> None:
    """Serving tokenizes with the `tokenizers` library: tokenizer.json must sit beside the
    exported graph."""
    if (out / "tokenizer.json").is_file():
        return
    if (Path(model_dir) / "tokenizer.json").is_file():
        shutil.copyfile(Path(model_dir) / "tokenizer.json", out / "tokenizer.json")
        return
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(model_dir, use_fast=True).save_pretrained(out)
    if not (out / "tokenizer.json").is_file():
        raise ExportError(
            f"{model_dir} has no fast tokenizer, which serving needs (tokenizer.json)"
        )


class ModelKind(ABC):
    """One kind of model, whatever its input. A kind derives from the base of its input modality
    (hf2triton.kinds.modality: text encoder, text-to-text, vision, audio), sets the class
    attributes and implements every abstract method; the registry `hf2triton.kinds.KINDS` names
    it by its `task` and refuses, when its module is imported, a kind that lacks one."""

    name: ClassVar[str]  # "embedding"
    task: ClassVar[str]  # the spec's `task:` value, "feature-extraction"
    # Its spec section: the key (default: `name`) and the pydantic model of what it holds.
    section: ClassVar[str]
    Options: ClassVar[type]
    onnx_task: ClassVar[str]  # optimum's export task (default: the same as `task`)
    # Its serving code: the class `serving_class` of hf2triton/serving/<name>.py, which
    # declares the Triton inputs and outputs.
    serving_class: ClassVar[str]
    main_file: ClassVar[str] = "model.onnx"  # absent after an export: it failed
    thresholds_key: ClassVar[str]  # where the gate's limits live: <section>.thresholds
    tunable: ClassVar[bool] = True  # deploy.tuning.search can drive it
    # Spec keys this kind read elsewhere before (old dotted key -> new one), accepted for one
    # release with a deprecation notice (hf2triton.spec).
    moved_keys: ClassVar[dict[str, str]] = {}
    # The task metric labelled data gives (accuracy, nDCG@10), compared with the champion's.
    quality_metric: ClassVar[str | None] = None
    item_word: ClassVar[str] = "items"
    modality: ClassVar[str]  # "text", "image", "audio": what one request carries

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "name" not in cls.__dict__:  # a base (a modality's), not a kind
            return
        cls.section = cls.__dict__.get("section") or cls.name
        cls.onnx_task = cls.__dict__.get("onnx_task") or cls.task
        cls.thresholds_key = f"{cls.section}.thresholds"
        if cls.__dict__.get("openai_route") and "openai_body" not in cls.__dict__:
            raise TypeError(
                f"{cls.__name__} serves {cls.openai_route} on the OpenAI-compatible "
                "API: it must implement openai_body and openai_answer"
            )

    def __init__(self, options: Any, validation: ValidationSettings):
        # Its own spec section (defaults filled in when the spec leaves it out), and where its
        # validation data lies.
        self.options = options if options is not None else self.Options()
        self.validation = validation

    @property
    def serving(self) -> tuple[str, str]:
        """(module, class) of hf2triton.serving that serves this kind."""
        return self.name, self.serving_class

    @property
    def served(self) -> type[ServedModel]:
        """Its serving class, which declares the Triton inputs and outputs."""
        import importlib

        module, cls = self.serving
        return getattr(importlib.import_module(f"hf2triton.serving.{module}"), cls)

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of the Triton outputs its serving class answers with."""
        return tuple(t.name for t in self.served.outputs)

    # -- the model and its data -----------------------------------------------------------
    @abstractmethod
    def resolve(self, model_dir: str) -> Any:
        """The kind's config, 'auto' and unset values filled from the model's own files."""
        raise NotImplementedError

    @abstractmethod
    def read_data(self) -> Data:
        raise NotImplementedError

    def calibration(self, data: Data) -> list[Any] | None:
        """What post-training quantization calibrates on, as the serving core encodes it;
        None: the kind's graph is not calibrated."""
        return None

    def export_inputs(self, data: Data) -> list[Any]:
        """What the export's check against PyTorch runs on: ordinary items and the longest."""
        longest = sorted(data.items, key=self.item_size, reverse=True)[:4]
        return list({repr(x): x for x in [*data.items[:20], *longest]}.values())

    @abstractmethod
    def prepare_export(self, model_dir: str, out: Path, cfg: Any) -> None:
        """Write what serving needs beside the exported graph (a tokenizer, a preprocessor's
        configuration)."""

    @abstractmethod
    def check_export(
        self, model_dir: str, out: Path, cfg: Any, inputs: list[Any]
    ) -> dict[str, float]:
        """Compare the fp32 export with PyTorch; return {"max_abs_diff": ...}."""
        raise NotImplementedError

    # -- serving ----------------------------------------------------------------------------
    def settings(self, cfg: Any, export_dir: str) -> dict[str, Any]:
        """serving.json without its file names: the kind's own serving settings."""
        return cfg.to_dict()

    @abstractmethod
    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        """Files of a Triton version directory (name there -> source), besides model.py, the
        serving core and serving.json: the candidate's graph and what reads its input."""

    def serving_json(
        self,
        cfg: Any,
        export_dir: str,
        files: dict[str, str] | None = None,
        runtime: dict[str, Any] | None = None,
        max_batch_tokens: int = 0,
        threads: int = 0,
    ) -> dict[str, Any]:
        """serving.json of this kind's model (without `files`: without file locations, what the
        served model and the gate share)."""
        module, cls = self.serving
        return serving.serving_json(
            module,
            cls,
            self.name,
            self.settings(cfg, export_dir),
            self.file_settings(files) if files else None,
            runtime,
            threads,
            max_batch_tokens,
        )

    def open_candidate(self, candidate: str, export_dir: str, settings: dict[str, Any]) -> Any:
        """The serving core's model on a candidate's files where they lie (no copy), with
        `settings` (serving.json without file locations)."""
        files = {
            name: str(path) for name, path in self.version_files(candidate, export_dir).items()
        }
        return serving.load("", {**settings, **self.file_settings(files)})

    @abstractmethod
    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        """serving.json keys that locate the files (names of `version_files`, or paths)."""

    def config_values(self, cfg: Any, reference: dict[str, Any]) -> dict[str, Any]:
        """Substitutions of the config.pbtxt template beyond batching."""
        return {}

    def config_parameters(self, cfg: Any) -> dict[str, str]:
        """config.pbtxt `parameters` clients read off the model's configuration (a
        classifier's label names, for the OpenAI-compatible API's /predict)."""
        return {}

    # -- the OpenAI-compatible API (hf2triton/openai_api) ------------------------------------
    # The kind's route under the API's base URL (".../v1"); None: Triton's protocol only.
    openai_route: ClassVar[str | None] = None

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        """One of `requests()`'s Triton requests as the API's request body (without `model`):
        the smoke test and the watch ask the API what they ask Triton."""
        raise NotImplementedError

    def openai_answer(
        self, body: dict[str, Any], request: dict[str, np.ndarray], cfg: Any
    ) -> dict[str, np.ndarray]:
        """The API's answer `body` to `request` as the Triton answer `extract` reads."""
        raise NotImplementedError

    @abstractmethod
    def requests(self, items: list[Any]) -> list[dict[str, np.ndarray]]:
        """One Triton request (input arrays) per validation item."""

    @abstractmethod
    def item_size(self, item: Any) -> int:
        """How long an item is (characters, bytes): the export checks and the smoke test send
        items of every size, the longest included."""

    def served_checks(self, model: Any, data: Data) -> tuple[dict[str, Any], dict[str, float]]:
        """What a candidate must also do as served, beyond matching PyTorch (a text generator's
        constrained decoding): the figures for the report, and the checks it fails (name ->
        how far off)."""
        return {}, {}

    def judging_requests(self, items: list[Any], reference: Any) -> list[dict[str, np.ndarray]]:
        """The gate's requests of its items, once PyTorch's reference is known (a kind may ask
        the candidate to score PyTorch's own answers too); by default `requests`."""
        return self.requests(items)

    @abstractmethod
    def extract(self, answers: list[dict[str, np.ndarray]]) -> Any:
        """The served answers in the form `score` compares with the reference."""
        raise NotImplementedError

    # -- the gate and the smoke test ----------------------------------------------------------
    @abstractmethod
    def reference(self, model_dir: str, cfg: Any, data: Data) -> Any:
        """What the original PyTorch model says for every item (comparable with `extract`)."""
        raise NotImplementedError

    def gate_data(self, data: Data, cfg: Any) -> Data:
        """The data the gate measures, once the config is known (e.g. labelled texts added)."""
        return data

    def labelled_metrics(self, data: Data) -> set[str]:
        """The metrics `score` computes from labelled data that `data` carries."""
        return set()

    def labelled_scores(self, outputs: Any, data: Data, cfg: Any) -> dict[str, float]:
        """Those metrics from the served `outputs` and the labels alone, with no PyTorch
        reference: what the serving champion (other weights, other sizes) is scored by."""
        return {}

    @abstractmethod
    def config_from_dict(self, data: dict[str, Any]) -> Any:
        """The config back from its `to_dict()` (the smoke test reads it from a file)."""
        raise NotImplementedError

    @abstractmethod
    def score(
        self, reference: Any, outputs: Any, data: Data, cfg: Any
    ) -> tuple[dict[str, float], dict]:
        """Metrics of `outputs` against `reference`, and details for the report."""
        raise NotImplementedError

    @abstractmethod
    def agreement_limits(self, tolerance: float) -> Limits:
        """What two runs of one candidate on the same items must agree on (scored by `score`
        with one run's outputs, `as_reference`, as the reference), `tolerance` being what the
        served precision allows: what the smoke test holds the endpoint to against the outputs
        the gate recorded."""

    def as_reference(self, outputs: Any) -> Any:
        """Served outputs (`extract`'s) in the form `score` takes as its reference."""
        return outputs

    def samples(self, reference: Any, outputs: Any, data: Data, cfg: Any) -> dict[str, Sample]:
        """How each metric that averages over the items is re-computed from a resample of them,
        for the gate's margin (hf2triton.kinds.margin); a metric without one (a worst case, a
        statistic of the whole set) is judged as measured."""
        return {}

    @abstractmethod
    def limits(self) -> Limits:
        raise NotImplementedError

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        """A worst case of a candidate's details, for the one-line error and the report;
        `against`: what its answers were compared with (PyTorch's, or the judged ones)."""
        return ""

    def info(self, reference: Any) -> dict[str, Any]:
        """Facts the repository needs from the reference (e.g. the embedding's dimension)."""
        return {}

    def smoke_indices(self, data: Data) -> list[int]:
        """Which items the smoke test sends: spread over the length range."""
        n = self.validation.smoke_sentences
        order = sorted(range(len(data.items)), key=lambda i: self.item_size(data.items[i]))
        if len(order) <= n:
            return order
        picks = np.linspace(0, len(order) - 1, n).round().astype(int)
        return [order[i] for i in dict.fromkeys(picks.tolist())]

    def from_json(self, reference: Any) -> Any:
        """A reference read back from the smoke file (`to_json` of what `reference` gave)."""
        return reference

    def speed(self, model: Any, items: list[Any], batch: int) -> dict[str, float]:
        """How fast a candidate serves in-process, for the gate to judge the fastest first:
        `speed` (what candidates are ranked by) and the figures behind it. Requests per second
        at batch 1 and 32, ranked at 32."""
        figures = throughput(model, self.requests(items))
        return {"speed": figures["batch_32"], **figures}


def throughput(
    model: Any, requests: list[dict[str, np.ndarray]], repeats: int = 3
) -> dict[str, float]:
    """Requests per second in-process at batch 1 and 32 (best of `repeats`, after a warm-up)."""
    figures = {}
    for size in (1, 32):
        part = (requests * 32)[:size]
        model.answer(part)
        reps = 8 if size == 1 else 1
        best = float("inf")
        for _ in range(repeats):
            started = time.perf_counter()
            for _ in range(reps):
                model.answer(part)
            best = min(best, (time.perf_counter() - started) / reps)
        figures[f"batch_{size}"] = round(len(part) / best, 1)
    return figures


def timing_items(items: list[Any], n: int = 32) -> list[Any]:
    """What the in-process timing runs on: `n` items drawn from the validation data at random
    (seeded), every length, as a dynamic batch of real traffic holds them."""
    import random

    return random.Random(0).choices(items, k=n) if items else []


def take(values: Any, indices: list[int]) -> Any:
    """Rows `indices` of an array or list."""
    if isinstance(values, np.ndarray):
        return values[indices]
    return [values[i] for i in indices]
