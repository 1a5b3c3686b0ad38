"""The release specification: the one pydantic model a release is described by.

A spec is read from YAML (`load_spec`) or passed as the flow's parameter. Unknown keys and bad
values are rejected with a message that names the key and the value.
"""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

from pydantic import Field, create_model, field_validator, model_validator

from hf2triton.image.spec import ImageSpec
from hf2triton.kinds import DEFAULT_TASK, KINDS, kind_class, kind_classes
from hf2triton.runtimes.quantizers import QuantizationSpec
from hf2triton.serving.runtimes import RuntimeSettings, runtime_class
from hf2triton.sources import SourceSpec
from hf2triton.spec import file as specfile
from hf2triton.spec.watch import WatchSpec
from hf2triton.targets import DeploySpec, default_deploy
from hf2triton.targets.base import TuningSpec  # noqa: F401 - the tuning step's section
from hf2triton.util.specbase import Name, SpecPath, Strict, first_line, unless

log = logging.getLogger(__name__)

# The spec's `task:` values: one per registered model kind (known at run time only: to a
# static checker, a string).
if TYPE_CHECKING:
    Task = str
else:
    Task = Literal[tuple(KINDS)]


class ExportSpec(Strict):
    # 18 is optimum's minimum for BERT-family exports (it warns below it); on all-MiniLM-L6-v2
    # opsets 17 and 18 give identical outputs and speed.
    opset: int = Field(18, ge=11, le=21, description="ONNX opset of the export")
    atol: float = Field(
        1e-3, gt=0, le=1.0, description="largest allowed |ONNX - PyTorch| on hidden states"
    )


class RuntimeChoice(Strict):
    """One runtime of the serving core and the precision it is pinned to."""

    name: str = Field(
        description="a serving runtime: onnxruntime, openvino, onnxruntime-cuda "
        "or onnxruntime-tensorrt"
    )
    precision: str = Field(
        description="fp32, bf16 or fp16, as the runtime offers; always "
        "pinned (OpenVINO would pick bf16 by itself where the CPU has it)"
    )
    options: dict[str, Any] = Field(
        {},
        description="the runtime's own settings, e.g. openvino {streams: 2, hint: "
        "THROUGHPUT, threads: 0}; onnxruntime-tensorrt {cache_dir: ...}",
    )

    @model_validator(mode="after")
    def _known(self) -> RuntimeChoice:
        try:
            RuntimeSettings(
                self.name, runtime_class(self.name).devices[0], self.precision, self.options
            )
        except (KeyError, ValueError) as exc:
            raise ValueError(str(exc).strip("'\"")) from None
        return self


class RuntimeSpec(Strict):
    """Which runtimes and precisions the gate tries, each on deploy.device; the fastest
    candidate that passes ships."""

    candidates: Literal["auto"] | list[RuntimeChoice] = Field(
        "auto",
        description="auto: on cpu ONNX Runtime fp32 and OpenVINO f32, and bf16 where "
        "the CPU offers it (a generator: OpenVINO GenAI f32 and bf16, KV cache as computed "
        "and u8, and under objective latency activations quantized in groups of 32 beside "
        "int8 or int4 weights); on gpu ONNX Runtime CUDA fp32 and fp16. Or a list of "
        "{name, precision, options}",
    )

    objective: Literal["throughput", "latency"] = Field(
        "throughput",
        description="what the fastest candidate is fastest at: throughput, requests (or "
        "generated tokens) per second with deploy.max_batch_size requests (streams) at once; "
        "latency, one request (one stream) alone, as a person chatting alone sends them",
    )

    @field_validator("candidates")
    @classmethod
    def _not_empty(cls, v: Any) -> Any:
        return unless(v == [], v, "list at least one runtime, or say auto")


class ValidationSpec(Strict):
    sentences: SpecPath | None = Field(
        None,
        description="text kinds: UTF-8 text file, one sentence per line (a TSV where the kind "
        "says so)",
    )
    images: SpecPath | None = Field(
        None,
        description="image kinds: a folder of image files (JPEG, PNG, WebP, BMP, GIF), or a "
        "UTF-8 text file listing them one per line (paths relative to the file)",
    )
    audio: SpecPath | None = Field(
        None,
        description="speech kinds: a folder of audio files (WAV, FLAC, OGG, MP3, M4A, WebM), "
        "with a transcripts.tsv beside them (file name TAB reference transcript) where the "
        "clips have reference transcripts",
    )
    smoke_sentences: int = Field(
        16, ge=1, le=256, description="how many validation items the smoke test sends"
    )
    max_drop: float = Field(
        0.0,
        ge=0,
        le=1,
        description="with labelled data (classification.labelled, "
        "embedding.retrieval): the most the candidate's task metric (accuracy, nDCG@10) may fall "
        "below the serving champion's, scored on the same data by the same serving code",
    )
    judge_all: bool = Field(
        False,
        description="judge every candidate's accuracy: by default, once the candidates "
        "are timed, they are judged fastest first and the first that passes ships, the slower "
        "ones left unjudged; true judges them all, for the report (slower)",
    )

    @model_validator(mode="after")
    def _some_data(self) -> ValidationSpec:
        return unless(
            self.sentences is None and self.images is None and self.audio is None,
            self,
            "give the validation data: validation.sentences (a text file) for a text kind, "
            "validation.images (a folder of image files) for an image kind, validation.audio "
            "(a folder of audio files) for a speech kind",
        )


class RegistrySpec(Strict):
    model_name: Name = Field(description="MLflow registered model name")
    experiment: str = Field("hf2triton", description="MLflow experiment of the release runs")
    log_export: bool = Field(
        False,
        description="also upload the fp32 ONNX export's graph to the release's run (model/); "
        "by default model/ holds the export's configuration and tokenizer files only: the "
        "served graph is in triton_repository/, and the export is made again from the "
        "recorded revision",
    )


class ScheduleSpec(Strict):
    """When the Prefect deployment of this spec re-runs the release (e.g. a retraining release)."""

    cron: str = Field(description="cron expression, e.g. '0 3 * * 1' (Mondays 03:00)")
    timezone: str = Field("UTC", description="IANA time zone the cron is read in")
    active: bool = Field(True, description="false: the schedule is kept but paused")

    @field_validator("cron")
    @classmethod
    def _check_cron(cls, v: str) -> str:
        from datetime import datetime

        from cronsim import CronSim, CronSimError

        try:
            CronSim(v, datetime(2026, 1, 1))
        except CronSimError as exc:
            raise ValueError(f"{v!r} is not a cron expression: {exc}") from None
        return v

    @field_validator("timezone")
    @classmethod
    def _check_timezone(cls, v: str) -> str:
        from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{v!r} is not an IANA time zone such as 'Europe/Berlin'") from None
        return v


class _Release(Strict):
    """A whole release: what to ship, how to check it, where to record and serve it. The model
    kinds' own sections (`embedding:`, `classification:`, ...) come from their registry
    (`ReleaseSpec` below)."""

    name: Name = Field(
        description="the release's name: the Triton model, the image "
        "repository and the Prefect deployment are named after it"
    )
    task: Task = Field(
        DEFAULT_TASK,
        description="the model kind; its own section (named after the kind) holds its settings",
    )
    source: SourceSpec
    export: ExportSpec = ExportSpec()
    quantization: QuantizationSpec = QuantizationSpec()
    runtime: RuntimeSpec = RuntimeSpec()
    validation: ValidationSpec
    registry: RegistrySpec
    deploy: DeploySpec = Field(
        default_factory=default_deploy,
        description="where the release serves: `target` picks the "
        "deploy target, whose own keys follow",
    )
    image: ImageSpec = ImageSpec()
    schedule: ScheduleSpec | None = Field(
        None, description="re-release on a schedule (the Prefect deployment's cron)"
    )
    watch: WatchSpec = Field(
        WatchSpec(),
        description="budgets the champion is held to after "
        "release, and the rollback window (docs/watch.md)",
    )

    @model_validator(mode="before")
    @classmethod
    def _moved_keys(cls, data: object) -> object:
        """Keys a kind read elsewhere before are read from there for one more release."""
        if not isinstance(data, dict):
            return data
        task = data.get("task", DEFAULT_TASK)
        data = copy.deepcopy(data)
        for kind in kind_classes():
            for old, new in kind.moved_keys.items():
                found, value = _pop(data, old)
                if not found:
                    continue
                if kind.task != task:
                    raise ValueError(
                        f"'{old}' moved to '{new}', which task {task!r} does not "
                        f"read: remove '{old}'"
                    )
                if _pop(copy.deepcopy(data), new)[0]:  # present already: given twice
                    raise ValueError(f"'{old}' moved to '{new}'; both are given: keep '{new}'")
                _put(data, new, value)
                log.warning(
                    "hf2triton: [DEPRECATED] spec key '%s' moved to '%s': it is read "
                    "from there in this release and refused in the next; move it",
                    old,
                    new,
                )
        return data

    @model_validator(mode="after")
    def _sections_match_task(self) -> _Release:
        own = kind_class(self.task).section
        wrong = [
            k.section
            for k in kind_classes()
            if k.section in self.model_fields_set and k.section != own
        ]
        return unless(
            bool(wrong),
            self,
            f"task {self.task!r} does not read the section(s) "
            f"{wrong}: use '{own}:' for this task, or change 'task:'",
        )

    @model_validator(mode="after")
    def _image_for_target(self) -> _Release:
        return unless(
            self.deploy.runs_image and self.image.build is False,
            self,
            f"deploy.target {self.deploy.target!r} runs the release's image: "
            "image.build cannot be false",
        )

    @model_validator(mode="after")
    def _settings_for_task(self) -> _Release:
        listed = self.runtime.candidates if self.runtime.candidates != "auto" else []
        wrong = [
            (c.name, key, tasks)
            for c in listed
            for key, tasks in runtime_class(c.name).tasks_of.items()
            if c.options.get(key) and self.task not in tasks
        ]
        name, key, tasks = wrong[0] if wrong else ("", "", ())
        return unless(
            bool(wrong),
            self,
            f"runtime.candidates: {name}'s {key} applies to {' and '.join(tasks)} releases "
            f"only, and this one is {self.task!r}: drop {key} from its options",
        )

    @model_validator(mode="after")
    def _settings_beside_compressed_weights(self) -> _Release:
        listed = self.runtime.candidates if self.runtime.candidates != "auto" else []
        needs = [
            (c.name, why)
            for c in listed
            if (why := runtime_class(c.name).needs_compressed_weights(c.options))
        ]
        q = self.quantization
        name, why = needs[0] if needs else ("", "")
        return unless(
            bool(needs) and q.method == "none" and not q.search,
            self,
            f"runtime.candidates: {name}'s {why} applies beside int8 or int4 weights only, and "
            "quantization.method is none: set quantization.method to int8-blockwise or "
            f"int4-blockwise (or quantization.search: true), or drop {why}",
        )

    @model_validator(mode="after")
    def _tuning_task(self) -> _Release:
        return unless(
            self.deploy.tuning.search and not kind_class(self.task).tunable,
            self,
            f"deploy.tuning.search cannot drive {self.task!r} releases: set it false",
        )

    @property
    def image_repository(self) -> str:
        return self.image.repository or self.name

    @property
    def task_section(self) -> Any:
        """The task's own section, defaults filled in when the spec leaves it out."""
        kind = kind_class(self.task)
        return getattr(self, kind.section) or kind.Options()

    @property
    def triton_model_name(self) -> str:
        return self.name


if TYPE_CHECKING:
    # What the checker sees: the release's own sections, typed (a kind's section is read
    # through `task_section`, never by name).
    ReleaseSpec = _Release
else:
    # The kinds' sections as **field definitions: mypy would match them against create_model's
    # own keyword arguments too (__config__, __base__, ...).
    ReleaseSpec = create_model(  # type: ignore[call-overload]
        "ReleaseSpec",
        __base__=_Release,
        __module__=__name__,
        __doc__=_Release.__doc__,
        **{
            k.section: (k.Options | None, Field(None, description=first_line(k.Options.__doc__)))
            for k in kind_classes()
        },
    )


def _pop(data: dict[str, Any], dotted: str) -> tuple[bool, Any]:
    """Take `dotted` ("a.b") out of nested mappings; (found, value)."""
    *parents, last = dotted.split(".")
    node: Any = data
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    if isinstance(node, dict) and last in node:
        return True, node.pop(last)
    return False, None


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    """Set `dotted` in nested mappings, making the sections on the way (an empty `embedding:`
    is one); a section that is not a mapping is left for validation to refuse."""
    *parents, last = dotted.split(".")
    for key in parents:
        if data.get(key) is None:
            data[key] = {}
        if not isinstance(data[key], dict):
            return
        data = data[key]
    data[last] = value


class TrainingSpec(Strict):
    """A retraining job (`flows/train.py`): fine-tune an encoder with a classification head on a
    labelled TSV, log the model to an MLflow registry and point an alias at the new version."""

    name: Name = Field(description="the training deployment's name")
    base: SourceSpec = Field(description="the encoder to start from (package, path or hub id)")
    data: SpecPath = Field(description="UTF-8 TSV of `text<TAB>label` lines to train on")
    eval: SpecPath | None = Field(None, description="a held-out TSV of the same form, reported")
    labels: list[str] = Field(min_length=2, description="the label names, in id order")
    steps: int = Field(300, ge=1, le=100_000)
    batch_size: int = Field(16, ge=1, le=1024)
    learning_rate: float = Field(5e-5, gt=0, le=1)
    max_length: int = Field(64, ge=8, le=8192)
    seed: int = 0
    registry: RegistrySpec
    alias: str = Field("trained", description="the alias the new version gets")
    schedule: ScheduleSpec | None = None

    @model_validator(mode="after")
    def _distinct_labels(self) -> TrainingSpec:
        return unless(
            len(set(self.labels)) != len(self.labels),
            self,
            f"labels {self.labels} name a label twice",
        )


SpecT = TypeVar("SpecT", bound=Strict)


@overload
def parse_spec(
    data: object, base_dir: str | Path | None = None, origin: str = "spec"
) -> ReleaseSpec: ...
@overload
def parse_spec(
    data: object, base_dir: str | Path | None = None, origin: str = "spec", *, model: type[SpecT]
) -> SpecT: ...
def parse_spec(
    data: object,
    base_dir: str | Path | None = None,
    origin: str = "spec",
    model: type[Strict] = ReleaseSpec,
) -> Strict:
    """Validate a release spec (or a `model` one) given as a mapping; relative paths are taken
    from `base_dir`. Reading YAML and describing errors are hf2triton.spec.file's."""
    return specfile.parse_spec(data, model, base_dir, origin)


@overload
def load_spec(path: str | Path) -> ReleaseSpec: ...
@overload
def load_spec(path: str | Path, model: type[SpecT]) -> SpecT: ...
def load_spec(path: str | Path, model: type[Strict] = ReleaseSpec) -> Strict:
    """Read and validate a release (or training) spec YAML file."""
    return specfile.load_spec(path, model)


__all__ = ["ReleaseSpec", "TrainingSpec", "load_spec", "parse_spec"]
