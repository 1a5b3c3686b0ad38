"""Kind `classification` (`task: text-classification`): labels from the model's id2label, softmax
(or sigmoid for multi-label models) scores. The gate compares served labels and probabilities
with PyTorch's (label agreement, largest probability difference) and, with a labelled set,
measures accuracy against its gold labels.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
from pydantic import Field, model_validator

from hf2triton.errors import SpecError, UnsupportedModelError
from hf2triton.kinds.base import KINDS, Data, KindConfig, Limits, model_max_length, read_lines
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import TextEncoderKind
from hf2triton.kinds.roles import GateRole
from hf2triton.kinds.torch_reference import TorchReference, largest_difference
from hf2triton.serving.classification import Classifier, activate, label_names
from hf2triton.util.specbase import MaxLength, Probability, SpecPath, Strict, unless


class ClassificationThresholds(Strict):
    min_label_agreement: Probability = Field(
        0.99, description="share of validation texts whose label equals PyTorch's"
    )
    max_prob_diff: float = Field(
        0.05, ge=0, le=1, description="largest allowed |probability - PyTorch's| of any label"
    )
    min_accuracy: Probability | None = Field(
        None, description="accuracy against the gold labels of `labelled`; needs `labelled`"
    )


class ClassificationSpec(Strict):
    """`task: text-classification`: labels from the model's id2label."""

    max_length: MaxLength = Field(None, description="truncation length; default: the model's")
    labelled: SpecPath | None = Field(
        None,
        description="UTF-8 TSV file of `text<TAB>label` lines (label as in id2label): "
        "accuracy against these gold labels is measured and reported",
    )
    thresholds: ClassificationThresholds = ClassificationThresholds()

    @model_validator(mode="after")
    def _accuracy_needs_labels(self) -> ClassificationSpec:
        return unless(
            self.thresholds.min_accuracy is not None and self.labelled is None,
            self,
            "thresholds.min_accuracy needs gold labels: give classification.labelled",
        )


@dataclass(frozen=True)
class ClassificationConfig:
    """What serving needs to turn logits into labels; written to the served serving.json."""

    labels: list[str]  # index i is id2label[i]
    max_length: int
    activation: str  # "softmax" (single label) or "sigmoid" (multi-label)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def read_labels(model_dir: str | Path, task: str) -> tuple[list[str], str]:
    """The model's label names (index i is id2label[i]) and how its logits become scores:
    "softmax" (single label) or "sigmoid" (a multi-label model)."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    id2label = config.get("id2label")
    if not id2label:
        raise UnsupportedModelError(
            f"{model_dir}/config.json has no id2label: it is not a classification model, so "
            f"task {task!r} cannot serve labels from it"
        )
    labels = [str(id2label[k]) for k in sorted(id2label, key=int)]
    multi = config.get("problem_type") == "multi_label_classification"
    return labels, "sigmoid" if multi else "softmax"


def resolve_classification_config(
    model_dir: str | Path, max_length: int | None = None
) -> ClassificationConfig:
    labels, activation = read_labels(model_dir, "text-classification")
    return ClassificationConfig(
        labels=labels, max_length=model_max_length(model_dir, max_length), activation=activation
    )


def read_labelled(
    path: str | Path, labels: list[str], what: str = "classification.labelled"
) -> tuple[list[str], list[int]]:
    """`text<TAB>label` lines; labels must be among `labels` (the model's id2label names, or a
    training spec's); `what` names the file's key in errors."""
    texts, gold = [], []
    index = {name: i for i, name in enumerate(labels)}
    for n, (text, label) in enumerate(labelled_lines(path, what, labels), 1):
        if label not in index:
            raise SpecError(
                f"{what} {str(path)!r} line {n}: expected 'text<TAB>label' "
                f"with a label among {labels}, got label {label[:80]!r}"
            )
        texts.append(text)
        gold.append(index[label])
    return texts, gold


def labelled_lines(
    path: str | Path, what: str, labels: list[str] | None = None
) -> list[tuple[str, str]]:
    """`text<TAB>label` lines as (text, label): a line without both is refused, named (before
    the model's `labels` are known, where None)."""
    among = f" with a label among {labels}" if labels is not None else ""
    rows = []
    for n, line in enumerate(read_lines(path, what, "labelled texts"), 1):
        text, sep, label = line.rpartition("\t")
        if not sep or not label.strip() or not text.strip():
            raise SpecError(
                f"{what} {str(path)!r} line {n}: expected 'text<TAB>label'{among}, "
                f"got {line[:80]!r}"
            )
        rows.append((text, label.strip()))
    return rows


class TorchClassifier(TorchReference):
    """The original PyTorch sequence classifier (texts or pairs): the reference."""

    def __init__(self, model_dir: str | Path, max_length: int):
        super().__init__(model_dir, "AutoModelForSequenceClassification", max_length)

    def all_logits(self, rows: list[Any], batch_size: int = 32) -> np.ndarray:
        return self.each_row(rows, lambda logits, _: logits, "logits", batch_size)


def check_logits(
    model_dir: str, onnx_path: Path, max_length: int, rows: list[Any]
) -> dict[str, float]:
    """Largest |ONNX - PyTorch| of the logits on `rows` (texts or pairs)."""
    return {
        "max_abs_diff": largest_difference(
            TorchClassifier(model_dir, max_length),
            onnx_path,
            rows,
            "logits",
            "logits",
            masked=False,
        )
    }


def agreeing(probs: np.ndarray, reference: np.ndarray, activation: str) -> np.ndarray:
    """Per text, whether `probs` predict what `reference` does: the same argmax, or for
    multi-label models the same set of labels above 0.5 (every label compared, however many)."""
    if activation == "sigmoid":
        return ((probs > 0.5) == (reference > 0.5)).all(axis=1)
    return probs.argmax(axis=1) == reference.argmax(axis=1)


def label_answer(body: Any, cfg: Labelled) -> dict[str, np.ndarray]:
    """text-embeddings-inference's /predict answer (every label with its score, per item) back
    in the label order, LABEL named as the served model names it."""
    at = {name: i for i, name in enumerate(cfg.labels)}
    scores = np.full((len(body), len(cfg.labels)), np.nan, np.float32)
    for row, labelled in enumerate(body):
        for item in labelled:
            scores[row, at[item["label"]]] = item["score"]
    names = label_names(scores, list(cfg.labels), cfg.activation)
    return {
        "SCORES": scores,
        "LABEL": np.array([[n.encode("utf-8")] for n in names], dtype=np.object_),
    }


class Labelled(KindConfig, Protocol):
    """A classifier's config as the shared gate reads it."""

    @property
    def labels(self) -> list[str]: ...

    @property
    def activation(self) -> str: ...


L = TypeVar("L", bound=Labelled)


class LabelGate(GateRole[L]):
    """What every classifier's gate shares, whatever its input (text, an image): served LABEL and
    SCORES read back, label agreement and probability differences against PyTorch's scores, the
    margin's samples, and the worst case for the report. A kind adds its labelled data's
    metrics (`labelled_scores`) and metrics of its own."""

    def config_values(self, cfg: L, info: dict[str, Any]) -> dict[str, Any]:
        return {"num_labels": len(cfg.labels)}

    def config_parameters(self, cfg: L) -> dict[str, str]:
        """The label names, for the OpenAI-compatible API's /predict."""
        return {"labels": json.dumps(list(cfg.labels), ensure_ascii=False)}

    def extract(self, answers: list[dict[str, np.ndarray]]) -> dict[str, Any]:
        return {
            "probs": np.concatenate([a["SCORES"] for a in answers]).astype(np.float32),
            "labels": [
                a["LABEL"][i][0].decode("utf-8")
                if isinstance(a["LABEL"][i][0], bytes)
                else str(a["LABEL"][i][0])
                for a in answers
                for i in range(len(a["LABEL"]))
            ],
        }

    def score(
        self, reference: Any, outputs: dict[str, Any], data: Data, cfg: L
    ) -> tuple[dict[str, float], dict]:
        activation = cfg.activation
        reference = np.asarray(reference, dtype=np.float32)
        probs = outputs["probs"]
        diff = np.abs(probs - reference).max(axis=1)
        agree = agreeing(probs, reference, activation)
        metrics = {
            "label_agreement": float(agree.mean()),
            "max_prob_diff": float(diff.max()) if np.isfinite(diff).all() else float("inf"),
            "mean_prob_diff": float(diff.mean()),
        }
        metrics.update(self.labelled_scores(outputs, data, cfg))
        worst = np.argsort(-diff)[:10]
        return metrics, {
            "disagreements": [str(data.items[i])[:200] for i in np.flatnonzero(~agree)][:20],
            "worst": [
                {"text": str(data.items[i])[:200], "prob_diff": float(diff[i])} for i in worst
            ],
        }

    def agreement_limits(self, tolerance: float) -> Limits:
        return {"label_agreement": (">=", 1.0), "max_prob_diff": ("<=", tolerance)}

    def as_reference(self, outputs: dict[str, Any]) -> np.ndarray:
        return outputs["probs"]

    def samples(
        self, reference: Any, outputs: dict[str, Any], data: Data, cfg: L
    ) -> dict[str, Sample]:
        reference = np.asarray(reference, dtype=np.float32)
        agree = agreeing(outputs["probs"], reference, cfg.activation)
        return {"label_agreement": Sample.mean(agree.astype(np.float64))}

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        if details.get("disagreements"):
            return (
                f"first label that differs from {against}'s: {details['disagreements'][0][:40]!r}"
            )
        worst = (details.get("worst") or [None])[0]
        if not worst:
            return ""
        return f"largest difference from {against}'s {worst['prob_diff']:.4f} on " + repr(
            worst["text"][:40]
        )

    def from_json(self, reference: Any) -> np.ndarray:
        return np.asarray(reference, dtype=np.float32)


@KINDS.register
class ClassificationKind(LabelGate[ClassificationConfig], TextEncoderKind[ClassificationConfig]):
    name = "classification"
    task = "text-classification"
    Options = ClassificationSpec
    serving_class = Classifier
    quality_metric = "accuracy"

    def resolve(self, model_dir: str) -> ClassificationConfig:
        return resolve_classification_config(model_dir, self.options.max_length)

    def read_data(self) -> Data:
        data = Data(read_lines(self.validation.sentences, "validation.sentences"))
        if self.options.labelled:
            # Readable and each line a text and a label now; the labels are checked once the
            # model's are known.
            labelled_lines(self.options.labelled, "classification.labelled")
        return data

    def gate_data(self, data: Data, cfg: ClassificationConfig) -> Data:
        """The validation texts, then the labelled texts whose gold labels accuracy counts."""
        if not self.options.labelled:
            return data
        texts, gold = read_labelled(self.options.labelled, cfg.labels)
        return Data([*data.items, *texts], {**data.extra, "gold": gold})

    def check_export(
        self, model_dir: str, out: Path, cfg: ClassificationConfig, inputs: list[str]
    ) -> dict[str, float]:
        return check_logits(model_dir, out / self.main_file, cfg.max_length, inputs)

    openai_route = "/predict"

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"inputs": [t.decode("utf-8") for t in request["TEXT"][:, 0]]}

    def openai_answer(
        self, body: Any, request: dict[str, np.ndarray], cfg: ClassificationConfig
    ) -> dict[str, np.ndarray]:
        return label_answer(body, cfg)

    def reference(self, model_dir: str, cfg: ClassificationConfig, data: Data) -> np.ndarray:
        return activate(
            TorchClassifier(model_dir, cfg.max_length).all_logits(data.items), cfg.activation
        )

    def labelled_metrics(self, data: Data) -> set[str]:
        return {"accuracy"} if "gold" in data.extra else set()

    def labelled_scores(
        self, outputs: dict[str, Any], data: Data, cfg: ClassificationConfig
    ) -> dict[str, float]:
        """Accuracy of the served labels (by name, so a model with another label order is
        judged fairly; a multi-label answer counts when it is exactly the gold label)."""
        if "gold" not in data.extra:
            return {}
        gold = [cfg.labels[g] for g in data.extra["gold"]]
        served = outputs["labels"][-len(gold) :]
        return {"accuracy": float(np.mean([s == g for s, g in zip(served, gold)]))}

    def config_from_dict(self, data: dict[str, Any]) -> ClassificationConfig:
        return ClassificationConfig(**data)

    def samples(
        self, reference: Any, outputs: dict[str, Any], data: Data, cfg: ClassificationConfig
    ) -> dict[str, Sample]:
        found = super().samples(reference, outputs, data, cfg)
        n = len(outputs["labels"])
        if "gold" in data.extra:  # the labelled items are the last ones
            gold = [cfg.labels[g] for g in data.extra["gold"]]
            served = outputs["labels"][-len(gold) :]
            correct = np.zeros(n)
            labelled = np.zeros(n)
            correct[-len(gold) :] = [s == g for s, g in zip(served, gold)]
            labelled[-len(gold) :] = 1.0
            found["accuracy"] = Sample.ratio(correct.tolist(), labelled.tolist())
        return found

    def limits(self) -> Limits:
        t = self.options.thresholds
        out = {
            "label_agreement": (">=", t.min_label_agreement),
            "max_prob_diff": ("<=", t.max_prob_diff),
        }
        if t.min_accuracy is not None:
            out["accuracy"] = (">=", t.min_accuracy)
        return out
