"""Kind `embedding` (`task: feature-extraction`): sentence embeddings pooled and normalised the
way the model's own sentence-transformers files say. The gate compares served embeddings with
PyTorch's: minimum and mean cosine, and the Spearman correlation of all pairwise similarities.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field, field_validator

from hf2triton.errors import SpecError
from hf2triton.kinds.base import KINDS, Data, Limits, model_max_length, read_json, read_lines
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import TextEncoderKind
from hf2triton.kinds.torch_reference import TorchReference, largest_difference
from hf2triton.serving.embedding import Embedder, pool
from hf2triton.util.specbase import MaxLength, Probability, SpecPath, Strict


class EmbeddingThresholds(Strict):
    """How closely served embeddings must follow PyTorch's on the validation sentences."""

    min_cosine: Probability = Field(
        0.99,
        description="lowest cosine of a served embedding with "
        "PyTorch's, over the validation sentences",
    )
    mean_cosine: Probability = Field(0.995, description="mean of the same cosines")
    spearman: Probability = Field(
        0.99, description="Spearman correlation of all pairwise similarities with PyTorch's"
    )


class EmbeddingSpec(Strict):
    """`task: feature-extraction`: sentence embeddings, pooled and normalised as the model's
    sentence-transformers files say."""

    pooling: Literal["auto", "mean", "cls"] = Field(
        "auto", description="auto reads the sentence-transformers pooling config, else mean"
    )
    normalize: Literal["auto"] | bool = Field(
        "auto", description="auto: normalise when the model declares a Normalize module"
    )
    max_length: MaxLength = Field(None, description="truncation length; default: the model's")
    retrieval: SpecPath | None = Field(
        None,
        description="UTF-8 TSV of `query<TAB>passage<TAB>relevance` lines (relevance 0 "
        "or more): the served embeddings' nDCG@10 over these passages is measured, and "
        "compared with the serving champion's (validation.max_drop)",
    )
    thresholds: EmbeddingThresholds = Field(
        EmbeddingThresholds(), description="the gate's limits against PyTorch"
    )
    smoke_min_cosine: Probability | None = Field(
        None,
        description="deprecated, ignored: the smoke test now compares the served embeddings "
        "with the ones the gate recorded for the shipped candidate, within the served "
        "precision's tolerance (docs/pipeline.md#the-smoke-test)",
    )

    @field_validator("smoke_min_cosine")
    @classmethod
    def _no_longer_used(cls, v: float | None) -> float | None:
        if v is not None:
            logging.getLogger(__name__).warning(
                "hf2triton: [DEPRECATED] embedding.smoke_min_cosine is ignored: the smoke test "
                "compares the endpoint with what the gate judged, within the served precision's "
                "tolerance; remove it"
            )
        return v


@dataclass(frozen=True)
class EmbeddingConfig:
    """How token states become one sentence vector; written to the served serving.json."""

    pooling: str  # "mean" or "cls"
    normalize: bool
    max_length: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def resolve_embedding_config(
    model_dir: str | Path,
    pooling: str = "auto",
    normalize: bool | str = "auto",
    max_length: int | None = None,
) -> EmbeddingConfig:
    """Fill 'auto' from the model's own sentence-transformers files, so serving truncates and
    pools as the model's authors do."""
    model_dir = Path(model_dir)
    modules = read_json(model_dir / "modules.json")
    modules = modules if isinstance(modules, list) else []
    if pooling == "auto":
        pooling = "mean"
        for module in modules:
            if module.get("type", "").endswith("Pooling"):
                cfg = read_json(model_dir / module.get("path", "") / "config.json") or {}
                if cfg.get("pooling_mode_cls_token"):
                    pooling = "cls"
    if normalize == "auto":
        normalize = any(
            isinstance(m, dict) and m.get("type", "").endswith("Normalize") for m in modules
        )
    return EmbeddingConfig(
        pooling=pooling,
        normalize=bool(normalize),
        max_length=model_max_length(model_dir, max_length),
    )


def cosine_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine similarity of matching rows of a and b: 1 where both rows are zero (the same
    answer), 0 where only one is (a zero row points nowhere: it never agrees by accident)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    na, nb = np.linalg.norm(a, axis=1), np.linalg.norm(b, axis=1)
    both = na * nb
    dot = (a * b).sum(axis=1) / np.where(both > 0, both, 1.0)
    return np.where(both > 0, dot, np.where((na == 0) & (nb == 0), 1.0, 0.0))


class TorchEmbedder(TorchReference):
    """The original PyTorch model, the reference every served embedding is compared with."""

    def __init__(self, model_dir: str | Path, cfg: EmbeddingConfig):
        super().__init__(model_dir, "AutoModel", cfg.max_length)
        self.cfg = cfg

    def embed(self, texts: list[str], batch_size: int = 32) -> np.ndarray:
        cfg = self.cfg
        return self.each_row(
            texts,
            lambda states, mask: pool(states, mask, cfg.pooling, cfg.normalize),
            "last_hidden_state",
            batch_size,
        )


def read_retrieval(path: str) -> tuple[list[str], list[str], list[tuple[int, int, float]]]:
    """Queries, passages and (query, passage, relevance) judgements of a
    `query<TAB>passage<TAB>relevance` file; the passages of all queries form one corpus."""
    queries: dict[str, int] = {}
    passages: dict[str, int] = {}
    qrels = []
    for n, line in enumerate(read_lines(path, "embedding.retrieval", "judgements"), 1):
        parts = line.split("\t")
        try:
            rel = float(parts[2]) if len(parts) == 3 else float("nan")
        except ValueError:
            rel = float("nan")
        if len(parts) != 3 or not parts[0].strip() or not parts[1].strip() or not rel >= 0:
            raise SpecError(
                f"embedding.retrieval {path!r} line {n}: expected "
                f"'query<TAB>passage<TAB>relevance' (relevance 0 or more), got "
                f"{line[:80]!r}"
            )
        q = queries.setdefault(parts[0], len(queries))
        p = passages.setdefault(parts[1], len(passages))
        qrels.append((q, p, rel))
    return list(queries), list(passages), qrels


def ndcg_at_10(embeddings: np.ndarray, retrieval: dict[str, Any]) -> float:
    """Mean nDCG@10 of ranking the retrieval passages by cosine to each query."""
    start, nq = retrieval["offset"], retrieval["queries"]
    emb = embeddings / np.clip(np.linalg.norm(embeddings, axis=1, keepdims=True), 1e-12, None)
    queries, passages = emb[start : start + nq], emb[start + nq :]
    gains = np.zeros((nq, len(passages)))
    for q, p, rel in retrieval["qrels"]:
        gains[q, p] = rel
    scores = []
    discount = 1 / np.log2(np.arange(2, 12))
    for q in range(nq):
        if not gains[q].any():
            continue
        top = np.argsort(-(passages @ queries[q]), kind="stable")[:10]
        ideal = np.sort(gains[q])[::-1][:10]
        dcg = ((2 ** gains[q][top] - 1) * discount[: len(top)]).sum()
        scores.append(dcg / ((2**ideal - 1) * discount[: len(ideal)]).sum())
    return float(np.mean(scores)) if scores else float("nan")


def pairwise(emb: np.ndarray) -> np.ndarray:
    sims = emb @ emb.T
    return sims[np.triu_indices(len(emb), k=1)]


def embedding_metrics(
    reference: np.ndarray, candidate: np.ndarray
) -> tuple[dict[str, float], np.ndarray]:
    """Per-text cosine plus the Spearman correlation of all pairwise similarities."""
    from scipy.stats import spearmanr

    cos = cosine_rows(reference, candidate)
    ref = reference / np.clip(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12, None)
    cand = candidate / np.clip(np.linalg.norm(candidate, axis=1, keepdims=True), 1e-12, None)
    rho = float(spearmanr(pairwise(ref), pairwise(cand)).statistic) if len(ref) > 2 else 1.0
    return {"min_cosine": float(cos.min()), "mean_cosine": float(cos.mean()), "spearman": rho}, cos


@KINDS.register
class EmbeddingKind(TextEncoderKind[EmbeddingConfig]):
    name = "embedding"
    task = "feature-extraction"
    Options = EmbeddingSpec
    serving_class = Embedder
    # Keys of releases before 0.2, read for one more release (hf2triton.spec says so).
    moved_keys = {
        "validation.thresholds": "embedding.thresholds",
        "deploy.smoke_min_cosine": "embedding.smoke_min_cosine",
    }
    item_word = "sentences"
    quality_metric = "ndcg_at_10"

    def resolve(self, model_dir: str) -> EmbeddingConfig:
        e = self.options
        return resolve_embedding_config(model_dir, e.pooling, e.normalize, e.max_length)

    def read_data(self) -> Data:
        data = Data(read_lines(self.validation.sentences, "validation.sentences"))
        if self.options.retrieval:
            read_retrieval(self.options.retrieval)  # a bad file fails before any work
        return data

    def gate_data(self, data: Data, cfg: EmbeddingConfig) -> Data:
        """The validation sentences, then the retrieval set's queries and passages, whose
        relevance judgements give nDCG@10."""
        if not self.options.retrieval:
            return data
        queries, passages, qrels = read_retrieval(self.options.retrieval)
        return Data(
            [*data.items, *queries, *passages],
            {
                **data.extra,
                "retrieval": {"offset": len(data.items), "queries": len(queries), "qrels": qrels},
            },
        )

    def labelled_metrics(self, data: Data) -> set[str]:
        return {"ndcg_at_10"} if "retrieval" in data.extra else set()

    def labelled_scores(
        self, outputs: np.ndarray, data: Data, cfg: EmbeddingConfig
    ) -> dict[str, float]:
        if "retrieval" not in data.extra:
            return {}
        return {"ndcg_at_10": ndcg_at_10(outputs, data.extra["retrieval"])}

    def check_export(
        self, model_dir: str, out: Path, cfg: EmbeddingConfig, inputs: list[str]
    ) -> dict[str, float]:
        """Largest |ONNX - PyTorch| over the real (unpadded) token states of `inputs`."""
        return {
            "max_abs_diff": largest_difference(
                TorchEmbedder(model_dir, cfg),
                out / self.main_file,
                inputs,
                "last_hidden_state",
                None,
                masked=True,
            )
        }

    def info(self, reference: np.ndarray) -> dict[str, Any]:
        return {"embedding_dim": int(np.asarray(reference).shape[1])}

    def config_values(self, cfg: EmbeddingConfig, info: dict[str, Any]) -> dict[str, Any]:
        return {"embedding_dim": info["embedding_dim"]}

    def extract(self, answers: list[dict[str, np.ndarray]]) -> np.ndarray:
        return np.concatenate([a["EMBEDDING"] for a in answers]).astype(np.float32)

    openai_route = "/embeddings"

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        return {"input": [t.decode("utf-8") for t in request["TEXT"][:, 0]]}

    def openai_answer(
        self, body: dict[str, Any], request: dict[str, np.ndarray], cfg: EmbeddingConfig
    ) -> dict[str, np.ndarray]:
        rows = sorted(body["data"], key=lambda d: d["index"])
        return {"EMBEDDING": np.array([d["embedding"] for d in rows], np.float32)}

    def reference(self, model_dir: str, cfg: EmbeddingConfig, data: Data) -> np.ndarray:
        return TorchEmbedder(model_dir, cfg).embed(data.items)

    def config_from_dict(self, data: dict[str, Any]) -> EmbeddingConfig:
        return EmbeddingConfig(**data)

    def score(
        self, reference: np.ndarray, outputs: np.ndarray, data: Data, cfg: EmbeddingConfig
    ) -> tuple[dict[str, float], dict]:
        metrics, cos = embedding_metrics(np.asarray(reference, np.float32), outputs)
        metrics.update(self.labelled_scores(outputs, data, cfg))
        worst = np.argsort(cos)[:10]
        return metrics, {
            "worst": [{"text": str(data.items[i])[:200], "cosine": float(cos[i])} for i in worst]
        }

    def agreement_limits(self, tolerance: float) -> Limits:
        return {"min_cosine": (">=", 1.0 - tolerance)}

    def samples(
        self, reference: np.ndarray, outputs: np.ndarray, data: Data, cfg: EmbeddingConfig
    ) -> dict[str, Sample]:
        return {"mean_cosine": Sample.mean(cosine_rows(np.asarray(reference, np.float32), outputs))}

    def limits(self) -> Limits:
        t = self.options.thresholds
        return {
            "min_cosine": (">=", t.min_cosine),
            "mean_cosine": (">=", t.mean_cosine),
            "spearman": (">=", t.spearman),
        }

    def example(self, details: dict[str, Any], against: str = "PyTorch") -> str:
        worst = (details.get("worst") or [None])[0]
        return (
            f"worst sentence {worst['text'][:40]!r} at cosine {worst['cosine']:.4f} to {against}'s"
            if worst
            else ""
        )

    def from_json(self, reference: Any) -> np.ndarray:
        return np.asarray(reference, dtype=np.float32)
