"""The roles a model kind plays, one small abstract class each: what it needs to be exported
(`ExportRole`), served (`ServingRole`: its serving class, which declares the Triton inputs and
outputs, its requests and its version directory), judged (`GateRole`: the PyTorch reference,
the scores, the limits, the margin's samples) and answered over the OpenAI-compatible API
(`OpenAIRole`). They share `KindBase`: the kind's names, its spec section, its config and its
validation data.

`hf2triton.kinds.base.ModelKind` plays them all; the modality bases (hf2triton.kinds.modality)
implement what an input modality decides (requests, the files beside the graph), so a kind
writes its own pieces only. Each role checks its own class attributes when a kind's class is
made, and leaves abstract what every kind must say for itself.

The kind's config type `C` (what `resolve` returns: `EmbeddingConfig`, `TranslationConfig`, ...)
is the roles' type parameter: `EmbeddingKind(TextEncoderKind[EmbeddingConfig])`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Generic, TypeVar

import numpy as np

from hf2triton import serving
from hf2triton.kinds.config import KindConfig
from hf2triton.kinds.data import Data, ValidationSettings
from hf2triton.kinds.limits import Limits
from hf2triton.kinds.margin import Sample
from hf2triton.serving.base import ServedModel

C = TypeVar("C", bound=KindConfig)

# Where serving classes live: serving.json names one by its module in this package.
SERVING_PACKAGE = serving.__name__


def is_kind(cls: type) -> bool:
    """Whether `cls` is a kind (it names itself), not a base (a role's, a modality's)."""
    return "name" in cls.__dict__


class KindBase(ABC, Generic[C]):
    """What every role knows of its kind: its names, its spec section and the options read from
    it, its config (`resolve`: 'auto' and unset values filled from the model's own files) and
    its validation data (`read_data`, `item_size`)."""

    name: ClassVar[str]  # "embedding"
    task: ClassVar[str]  # the spec's `task:` value, "feature-extraction"
    # Its spec section: the key (default: `name`) and the pydantic model of what it holds.
    section: ClassVar[str]
    Options: ClassVar[type]
    modality: ClassVar[str]  # "text", "image", "audio": what one request carries
    item_word: ClassVar[str] = "items"
    tunable: ClassVar[bool] = True  # deploy.tuning.search can drive it
    # Spec keys this kind read elsewhere before (old dotted key -> new one), accepted for one
    # release with a deprecation notice (hf2triton.spec).
    moved_keys: ClassVar[dict[str, str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if is_kind(cls):
            cls.section = cls.__dict__.get("section") or cls.name

    def __init__(self, options: Any, validation: ValidationSettings):
        # Its own spec section (defaults filled in when the spec leaves it out), and where its
        # validation data lies.
        self.options = options if options is not None else self.Options()
        self.validation = validation

    @abstractmethod
    def resolve(self, model_dir: str) -> C:
        """The kind's config, 'auto' and unset values filled from the model's own files."""

    @abstractmethod
    def config_from_dict(self, data: dict[str, Any]) -> C:
        """The config back from its `to_dict()` (the smoke test reads it from a file)."""

    @abstractmethod
    def read_data(self) -> Data:
        """The validation data the spec names."""

    @abstractmethod
    def item_size(self, item: Any) -> int:
        """How long an item is (characters, bytes): the export checks and the smoke test send
        items of every size, the longest included."""


class ExportRole(KindBase[C]):
    """What the export needs: optimum's task, the file it writes, what serving reads beside the
    graph, and the check of the fp32 graph against PyTorch."""

    onnx_task: ClassVar[str]  # optimum's export task (default: the same as `task`)
    main_file: ClassVar[str] = "model.onnx"  # absent after an export: it failed

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if is_kind(cls):
            cls.onnx_task = cls.__dict__.get("onnx_task") or cls.task

    # The files beside the graph the serving core reads its input with (tokenizer.json, the
    # image processor's preprocessor_config.json): set by the modality bases.
    input_files: ClassVar[tuple[str, ...]] = ()

    def calibration(self, data: Data) -> list[Any] | None:
        """What post-training quantization calibrates on, as the serving core encodes it;
        None: the kind's graph is not calibrated."""
        return None

    def calibration_feeds(
        self, items: list[Any], onnx_path: str, export_dir: str, max_length: int
    ) -> list[dict[str, np.ndarray]]:
        """The graph's inputs for calibration `items` (`calibration`'s), as the serving core
        feeds them, one dict a run."""
        raise NotImplementedError(f"{self.name} is not calibrated")

    def export_inputs(self, data: Data) -> list[Any]:
        """What the export's check against PyTorch runs on: ordinary items and the longest."""
        longest = sorted(data.items, key=self.item_size, reverse=True)[:4]
        return list({repr(x): x for x in [*data.items[:20], *longest]}.values())

    def export_graph(self, model_dir: str, out: Path, opset: int) -> bool:
        """Export the kind's graphs into `out` itself (True), or leave it to optimum's
        `main_export` of `onnx_task` (False, the default)."""
        return False

    @abstractmethod
    def prepare_export(self, model_dir: str, out: Path, cfg: C) -> None:
        """Write what serving needs beside the exported graph (a tokenizer, a preprocessor's
        configuration)."""

    @abstractmethod
    def check_export(
        self, model_dir: str, out: Path, cfg: C, inputs: list[Any]
    ) -> dict[str, float]:
        """Compare the fp32 export with PyTorch; return {"max_abs_diff": ...}."""


def serving_module(cls: type[ServedModel]) -> str:
    """The module serving.json names for a serving class: its module within hf2triton.serving
    (`Embedder` -> "embedding"); TypeError for a class that is not a ServedModel there."""
    prefix = SERVING_PACKAGE + "."
    if not (isinstance(cls, type) and issubclass(cls, ServedModel)):
        raise TypeError(f"{cls!r} is not a serving class: name a ServedModel of {SERVING_PACKAGE}")
    if not cls.__module__.startswith(prefix):
        raise TypeError(
            f"serving class {cls.__qualname__} is defined in {cls.__module__}: the serving core "
            f"loads classes of {SERVING_PACKAGE} only"
        )
    return cls.__module__.removeprefix(prefix)


class ServingRole(KindBase[C]):
    """How the kind is served: its serving class (which declares the Triton inputs and outputs
    the config.pbtxt is rendered from), the requests its items become and how their answers are
    read, and its version directory (files, serving.json, config values)."""

    # The class of hf2triton.serving that serves it: serving.json names its module and class,
    # derived from this one definition.
    serving_class: ClassVar[type[ServedModel]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if is_kind(cls):
            try:
                serving_module(cls.serving_class)
            except (AttributeError, TypeError) as exc:
                raise TypeError(f"{cls.__name__}.serving_class: {exc}") from None

    @property
    def serving(self) -> tuple[str, str]:
        """(module, class) of hf2triton.serving that serves this kind, as serving.json names
        them."""
        return serving_module(self.serving_class), self.serving_class.__name__

    @property
    def served(self) -> type[ServedModel]:
        """Its serving class, which declares the Triton inputs and outputs."""
        return self.serving_class

    @property
    def outputs(self) -> tuple[str, ...]:
        """The names of the Triton outputs its serving class answers with."""
        return tuple(t.name for t in self.served.outputs)

    @abstractmethod
    def requests(self, items: list[Any]) -> list[dict[str, np.ndarray]]:
        """One Triton request (input arrays) per validation item."""

    @abstractmethod
    def extract(self, answers: list[dict[str, np.ndarray]]) -> Any:
        """The served answers in the form `score` compares with the reference."""

    def settings(self, cfg: C, export_dir: str) -> dict[str, Any]:
        """serving.json without its file names: the kind's own serving settings."""
        return cfg.to_dict()

    @abstractmethod
    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        """Files of a Triton version directory (name there -> source), besides model.py, the
        serving core and serving.json: the candidate's graph and what reads its input."""

    @abstractmethod
    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        """serving.json keys that locate the files (names of `version_files`, or paths)."""

    def serving_json(
        self,
        cfg: C,
        export_dir: str,
        files: dict[str, str] | None = None,
        runtime: dict[str, Any] | None = None,
        max_batch_tokens: int = 0,
        threads: int = 0,
    ) -> dict[str, Any]:
        """serving.json of this kind's model (without `files`: without file locations, what the
        served model and the gate share)."""
        module, cls = self.serving
        speed = {"intra_op_threads": threads, "max_batch_tokens": max_batch_tokens}
        return serving.serving_json(
            module,
            cls,
            self.name,
            {**self.settings(cfg, export_dir), **speed},
            self.file_settings(files) if files else None,
            runtime,
        )

    def open_candidate(self, candidate: str, export_dir: str, settings: dict[str, Any]) -> Any:
        """The serving core's model on a candidate's files where they lie (no copy), with
        `settings` (serving.json without file locations)."""
        files = {
            name: str(path) for name, path in self.version_files(candidate, export_dir).items()
        }
        return serving.load("", {**settings, **self.file_settings(files)})

    def info(self, reference: Any) -> dict[str, Any]:
        """Facts the repository needs from the reference (e.g. the embedding's dimension)."""
        return {}

    def config_values(self, cfg: C, info: dict[str, Any]) -> dict[str, Any]:
        """Substitutions of the config.pbtxt template beyond batching (from `info`'s facts)."""
        return {}

    def config_parameters(self, cfg: C) -> dict[str, str]:
        """config.pbtxt `parameters` clients read off the model's configuration (a
        classifier's label names, for the OpenAI-compatible API's /predict)."""
        return {}


class GateRole(ServingRole[C]):
    """How the gate and the smoke test judge a candidate served in-process: what PyTorch says,
    how served answers are scored against it, with which limits and margin, how two runs must
    agree, and how fast it serves."""

    # The task metric labelled data gives (accuracy, nDCG@10), compared with the champion's.
    quality_metric: ClassVar[str | None] = None
    thresholds_key: ClassVar[str]  # where the gate's limits live: <section>.thresholds
    # A kind whose PyTorch reference is dear sizes the gate's sample by its bounds: the gate
    # judges this many items first, and more (doubling) only while the bounds leave the verdict
    # open (hf2triton.kinds.margin.looks). Its reference must be a list, one entry an item, and
    # every limit should have a sample (`samples`) for a look to pass early. None: every item.
    first_look: ClassVar[int | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if is_kind(cls):
            cls.thresholds_key = f"{cls.section}.thresholds"

    @abstractmethod
    def reference(self, model_dir: str, cfg: C, data: Data) -> Any:
        """What the original PyTorch model says for every item (comparable with `extract`)."""

    @abstractmethod
    def score(
        self, reference: Any, outputs: Any, data: Data, cfg: C
    ) -> tuple[dict[str, float], dict]:
        """Metrics of `outputs` against `reference`, and details for the report."""

    @abstractmethod
    def limits(self) -> Limits:
        """The gate's limits, from the kind's `thresholds`."""

    @abstractmethod
    def agreement_limits(self, tolerance: float) -> Limits:
        """What two runs of one candidate on the same items must agree on (scored by `score`
        with one run's outputs, `as_reference`, as the reference), `tolerance` being what the
        served precision allows: what the smoke test holds the endpoint to against the outputs
        the gate recorded."""

    def gate_data(self, data: Data, cfg: C) -> Data:
        """The data the gate measures, once the config is known (e.g. labelled texts added)."""
        return data

    def judging_requests(self, items: list[Any], reference: Any) -> list[dict[str, np.ndarray]]:
        """The gate's requests of its items, once PyTorch's reference is known (a kind may ask
        the candidate to score PyTorch's own answers too); by default `requests`."""
        return self.requests(items)

    def served_checks(self, model: Any, data: Data) -> tuple[dict[str, Any], dict[str, float]]:
        """What a candidate must also do as served, beyond matching PyTorch (a text generator's
        constrained decoding): the figures for the report, and the checks it fails (name ->
        how far off)."""
        return {}, {}

    def labelled_metrics(self, data: Data) -> set[str]:
        """The metrics `score` computes from labelled data that `data` carries."""
        return set()

    def labelled_scores(self, outputs: Any, data: Data, cfg: C) -> dict[str, float]:
        """Those metrics from the served `outputs` and the labels alone, with no PyTorch
        reference: what the serving champion (other weights, other sizes) is scored by."""
        return {}

    def pytorch_scores(self, reference: Any, data: Data, cfg: C) -> dict[str, float]:
        """PyTorch's own figures on the metrics `score` takes from labels (its transcripts
        against the words spoken): where PyTorch itself misses a limit, no candidate can pass,
        and the gate's refusal says that the model, not its export, misses it."""
        return {}

    def as_reference(self, outputs: Any) -> Any:
        """Served outputs (`extract`'s) in the form `score` takes as its reference."""
        return outputs

    def samples(self, reference: Any, outputs: Any, data: Data, cfg: C) -> dict[str, Sample]:
        """How each metric that averages over the items is re-computed from a resample of them,
        for the gate's margin (hf2triton.kinds.margin); a metric without one (a worst case, a
        statistic of the whole set) is judged as measured."""
        return {}

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        """A worst case of a candidate's details, for the one-line error and the report;
        `against`: what its answers were compared with (PyTorch's, or the judged ones)."""
        return ""

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
        at batch 1 and 32, ranked at 32, or at 1 when `batch` is 1 (the latency objective: one
        request alone)."""
        figures = throughput(model, self.requests(items))
        return {"speed": figures["batch_1" if batch == 1 else "batch_32"], **figures}


class TextAnswerGate(GateRole[C]):
    """What the gate of every kind that answers text (a translation, a transcript, a generated
    continuation) shares: the answer column read back as strings (`answer_column`), greedy text
    that two runs of one candidate must give alike, and a differing answer as the example (its
    item under `item_key` in the details' `differ`)."""

    answer_column: ClassVar[str] = ""
    item_key: ClassVar[str] = "text"

    def extract(self, answers: list[dict[str, np.ndarray]]) -> Any:
        return [
            (v.decode("utf-8") if isinstance(v, bytes) else str(v))
            for a in answers
            for v in a[self.answer_column][:, 0]
        ]

    def agreement_limits(self, tolerance: float) -> Limits:
        return {"exact_match": (">=", 1.0)}  # greedy text is equal, or it is not what was judged

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        first = (details.get("differ") or [None])[0]
        if not first:
            return ""
        return (
            f"e.g. {first[self.item_key][:40]!r} -> {first['candidate'][:40]!r}, {against} "
            f"{first['pytorch'][:40]!r}"
        )


class OpenAIRole(ServingRole[C]):
    """The kind's route on the OpenAI-compatible API (hf2triton/openai_api), if it has one: its
    Triton requests as the API's request bodies and the API's answers as Triton answers, so the
    smoke test and the watch ask the API what they ask Triton. A kind without a route implements
    nothing here."""

    # The route under the API's base URL (".../v1"); None: Triton's protocol only.
    openai_route: ClassVar[str | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = cls.__dict__
        if own.get("openai_route") and not ("openai_body" in own and "openai_answer" in own):
            raise TypeError(
                f"{cls.__name__} serves {cls.openai_route} on the OpenAI-compatible "
                "API: it must implement openai_body and openai_answer"
            )

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        """One of `requests()`'s Triton requests as the API's request body (without `model`)."""
        raise NotImplementedError(f"{self.name} has no OpenAI-compatible route")

    def openai_answer(
        self, body: Any, request: dict[str, np.ndarray], cfg: C
    ) -> dict[str, np.ndarray]:
        """The API's answer `body` to `request` as the Triton answer `extract` reads."""
        raise NotImplementedError(f"{self.name} has no OpenAI-compatible route")


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
