"""Kind `reranking` (`task: text-ranking`): a cross-encoder scores (query, passage) pairs, the
model a retrieval stack puts in front of its embedder. A request is a query with a list of
passages; the answer is one relevance score per passage. The gate compares the served ranking
with PyTorch's: Spearman correlation of the scores per query (lowest and mean), and the share of
queries whose top passage is the same.

Validation data: `validation.sentences` is a UTF-8 TSV of `query<TAB>passage` lines; the lines
of one query form its passage list (in file order).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from hf2triton.errors import SpecError, UnsupportedModelError
from hf2triton.kinds.base import KINDS, Data, Limits, model_max_length, read_lines
from hf2triton.kinds.classification import TorchClassifier, check_logits
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import TextEncoderKind
from hf2triton.kinds.torch_reference import abs_difference
from hf2triton.serving.reranking import Reranker, relevance
from hf2triton.util.specbase import MaxLength, Probability, Strict


class RerankingThresholds(Strict):
    """How closely the served ranking must follow PyTorch's, query by query."""

    min_spearman: Probability = Field(
        0.9,
        description="lowest Spearman correlation, over the queries, of a query's served "
        "passage scores with PyTorch's",
    )
    mean_spearman: Probability = Field(0.98, description="mean of the same over the queries")
    min_top1_agreement: Probability = Field(
        0.95, description="share of queries whose top passage is PyTorch's top passage"
    )


class RerankingSpec(Strict):
    """`task: text-ranking`: a cross-encoder scores (query, passage) pairs."""

    max_length: MaxLength = Field(
        None, description="truncation length of a pair; default: the model's"
    )
    activation: Literal["auto", "none", "sigmoid", "softmax"] = Field(
        "auto",
        description="score of a pair: the logit (none), its sigmoid, or the softmax "
        "probability of the last label; auto: as sentence-transformers' CrossEncoder",
    )
    thresholds: RerankingThresholds = RerankingThresholds()


@dataclass(frozen=True)
class RerankingConfig:
    max_length: int
    activation: str  # "none" (the logit), "sigmoid", or "softmax" (two-label heads)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_reranking_config(
    model_dir: str | Path, max_length: int | None, activation: str
) -> RerankingConfig:
    """sentence-transformers' CrossEncoder scores a one-logit head with a sigmoid and a
    two-label head with the softmax of its second label; 'auto' does the same."""
    config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    labels = len(config.get("id2label") or {}) or int(config.get("num_labels", 0) or 0)
    if labels not in (1, 2):
        raise UnsupportedModelError(
            f"{model_dir}/config.json declares {labels or 'no'} labels: a cross-encoder for "
            "task 'text-ranking' has one relevance logit (or two labels, relevant last)"
        )
    if activation == "auto":
        declared = str(config.get("sbert_ce_default_activation_function") or "")
        activation = (
            "softmax" if labels == 2 else "none" if declared.endswith("Identity") else "sigmoid"
        )
    return RerankingConfig(
        max_length=model_max_length(model_dir, max_length), activation=activation
    )


def read_groups(path: str | None) -> list[tuple[str, list[str]]]:
    """(query, passages) groups of a `query<TAB>passage` file, queries in order of appearance."""
    groups: dict[str, list[str]] = {}
    for n, line in enumerate(read_lines(path, "validation.sentences"), 1):
        query, sep, passage = line.partition("\t")
        if not sep or not query.strip() or not passage.strip():
            raise SpecError(
                f"validation.sentences {path!r} line {n}: a text-ranking release reads "
                f"'query<TAB>passage' lines, got {line[:80]!r}"
            )
        groups.setdefault(query, []).append(passage)
    return list(groups.items())


def ranking_metrics(
    reference: list[np.ndarray], served: list[np.ndarray]
) -> tuple[dict[str, float], tuple[list[float], list[float]]]:
    """The metrics over every query, and per query (what their samples resample): the Spearman
    of served vs PyTorch scores (1.0 for a single passage), and whether the top passage is the
    same (1.0) or not."""
    from scipy.stats import spearmanr

    rhos, top1 = [], []
    for ref, got in zip(reference, served, strict=True):
        ref, got = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        if not np.isfinite(got).all():
            rhos.append(float("nan"))
        elif len(ref) < 2 or np.ptp(ref) == 0:
            rhos.append(1.0)
        else:
            rho = float(spearmanr(ref, got).statistic)
            rhos.append(rho if np.isfinite(rho) else 0.0)
        # np.argmax picks a NaN: a query with any score that is not a number has no top passage.
        top1.append(float(np.isfinite(got).all() and np.argmax(ref) == np.argmax(got)))
    return {
        "min_spearman": float(np.min(rhos)),
        "mean_spearman": float(np.mean(rhos)),
        "top1_agreement": float(np.mean(top1)),
        "max_score_diff": max(abs_difference(r, g) for r, g in zip(reference, served)),
    }, (rhos, top1)


@KINDS.register
class RerankingKind(TextEncoderKind[RerankingConfig]):
    name = "reranking"
    task = "text-ranking"
    Options = RerankingSpec
    onnx_task = "text-classification"  # a cross-encoder is a sequence classifier of pairs
    serving_class = Reranker
    item_word = "queries"

    def resolve(self, model_dir: str) -> RerankingConfig:
        return resolve_reranking_config(model_dir, self.options.max_length, self.options.activation)

    def read_data(self) -> Data:
        return Data(read_groups(self.validation.sentences))

    def export_inputs(self, data: Data) -> list[tuple[str, str]]:
        pairs = [(q, p) for q, passages in data.items for p in passages]
        longest = sorted(pairs, key=lambda x: len(x[0]) + len(x[1]), reverse=True)[:4]
        return list(dict.fromkeys([*pairs[:20], *longest]))

    def check_export(
        self, model_dir: str, out: Path, cfg: RerankingConfig, inputs: list[tuple[str, str]]
    ) -> dict[str, float]:
        return check_logits(model_dir, out / self.main_file, cfg.max_length, inputs)

    def calibration(self, data: Data) -> list[tuple[str, str]]:
        """Every (query, passage) pair, as the serving core encodes them."""
        return [(query, passage) for query, passages in data.items for passage in passages]

    def requests(self, items: list[tuple[str, list[str]]]) -> list[dict[str, np.ndarray]]:
        return [
            {
                "QUERY": np.array([[q.encode("utf-8")]], dtype=np.object_),
                "PASSAGES": np.array([[p.encode("utf-8") for p in passages]], dtype=np.object_),
            }
            for q, passages in items
        ]

    def extract(self, answers: list[dict[str, np.ndarray]]) -> list[np.ndarray]:
        return [row.astype(np.float32) for a in answers for row in a["SCORES"]]

    openai_route = "/rerank"

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        return {
            "query": request["QUERY"][0, 0].decode("utf-8"),
            "documents": [p.decode("utf-8") for p in request["PASSAGES"][0]],
        }

    def openai_answer(
        self, body: dict[str, Any], request: dict[str, np.ndarray], cfg: RerankingConfig
    ) -> dict[str, np.ndarray]:
        scores = np.full((1, request["PASSAGES"].shape[1]), np.nan, np.float32)
        for r in body["results"]:
            scores[0, r["index"]] = r["relevance_score"]
        return {"SCORES": scores}

    def reference(self, model_dir: str, cfg: RerankingConfig, data: Data) -> list[np.ndarray]:
        pairs = [(q, p) for q, passages in data.items for p in passages]
        scores = relevance(
            TorchClassifier(model_dir, cfg.max_length).all_logits(pairs), cfg.activation
        )
        out, k = [], 0
        for _, passages in data.items:
            out.append(scores[k : k + len(passages)])
            k += len(passages)
        return out

    def config_from_dict(self, data: dict[str, Any]) -> RerankingConfig:
        return RerankingConfig(**data)

    def score(
        self,
        reference: list[np.ndarray],
        outputs: list[np.ndarray],
        data: Data,
        cfg: RerankingConfig,
    ) -> tuple[dict[str, float], dict]:
        metrics, (rhos, _) = ranking_metrics(reference, outputs)
        worst = np.argsort(np.nan_to_num(rhos, nan=-2.0))[:10]
        return metrics, {
            "worst": [{"text": data.items[i][0][:200], "spearman": rhos[i]} for i in worst]
        }

    def agreement_limits(self, tolerance: float) -> Limits:
        return {"top1_agreement": (">=", 1.0), "max_score_diff": ("<=", tolerance)}

    def samples(
        self,
        reference: list[np.ndarray],
        outputs: list[np.ndarray],
        data: Data,
        cfg: RerankingConfig,
    ) -> dict[str, Sample]:
        _, (rhos, top1) = ranking_metrics(reference, outputs)
        return {"mean_spearman": Sample.mean(rhos), "top1_agreement": Sample.mean(top1)}

    def limits(self) -> Limits:
        t = self.options.thresholds
        return {
            "min_spearman": (">=", t.min_spearman),
            "mean_spearman": (">=", t.mean_spearman),
            "top1_agreement": (">=", t.min_top1_agreement),
        }

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        worst = (details.get("worst") or [None])[0]
        return (
            f"worst query {worst['text'][:40]!r} at Spearman {worst['spearman']:.4f} to {against}'s"
            if worst
            else ""
        )

    def from_json(self, reference: Any) -> list[np.ndarray]:
        return [np.asarray(r, dtype=np.float32) for r in reference]
