"""Source `mlflow`: a model version of an MLflow model registry (by alias or version), as a
training run registered it (the transformers flavour, or a plain Hugging Face directory logged
as artifacts). Its registry's credentials go to a child process that does the MLflow work, never
into this process's environment. A source that follows an alias is released again when a
training flow announces a new version under it (its Prefect trigger)."""

from __future__ import annotations

import copy
import re
import shutil
import tempfile
from pathlib import Path
from typing import Annotated, Any

from pydantic import AfterValidator, Field, model_validator

from hf2triton.clients.credentials import MlflowCredentials, resolve
from hf2triton.clients.mlflow import Registry, call_with_credentials
from hf2triton.errors import MlflowAuthError, SourceError
from hf2triton.sources.base import SOURCES, FetchResult, Source, inspect_model_dir
from hf2triton.training.classifier import REGISTERED_EVENT
from hf2triton.util.specbase import Strict, without_login
from hf2triton.util.workspace import cached_step, digest, home, redact_uri

# A server's host and port without the scheme: MLflow would read the host as a scheme.
HOST_PORT = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]*:[0-9]+(/|$)")


def _with_scheme(uri: str | None) -> str | None:
    if uri is not None and HOST_PORT.match(uri):
        raise ValueError(
            f"{uri!r} is a host and port without its scheme: write the tracking URI as "
            f"'http://{uri}' (or https://)"
        )
    return uri


class MlflowSourceSpec(Strict):
    """A model version of an MLflow model registry, by name and alias or by name and version.
    Credentials come from MLFLOW_TRACKING_USERNAME/PASSWORD or _TOKEN, or from a saved Prefect
    block named in `credentials_block`; never from the spec."""

    model: str = Field(description="the registered model's name")
    alias: str | None = Field(None, description="e.g. 'trained'; exactly one of alias, version")
    version: str | None = Field(None, description="a version number, e.g. '3'")
    tracking_uri: Annotated[
        str | None,
        without_login("MLFLOW_TRACKING_USERNAME/PASSWORD or a credentials_block"),
        AfterValidator(_with_scheme),
    ] = Field(
        None,
        description="the registry's URI; default: MLFLOW_TRACKING_URI, else the release's "
        "own store",
    )
    credentials_block: str | None = Field(
        None, description="name of a saved hf2triton-mlflow-credentials Prefect block"
    )

    @model_validator(mode="after")
    def _alias_or_version(self) -> MlflowSourceSpec:
        given = [k for k in ("alias", "version") if getattr(self, k)]
        if len(given) != 1:
            raise ValueError(f"give exactly one of alias or version (got {given or 'none'})")
        if self.version is not None and not self.version.isdigit():
            raise ValueError(f"version {self.version!r} is not a version number such as '3'")
        return self


@SOURCES.register
class MlflowSource(Source):
    """A version of an MLflow model registry."""

    key = "mlflow"

    mlflow: MlflowSourceSpec = Field(description="a version of an MLflow registry")

    @property
    def lineage_id(self) -> str:
        m = self.mlflow
        return self.model_id or f"mlflow:{m.model}@{m.alias or 'v' + str(m.version)}"

    def fetch(self, mlflow_uri: str) -> FetchResult:
        """Resolve the registry version, download its files once (by version and run) and check
        them like any model directory. A missing model, alias or version is a SourceError that
        names it, and so are refused credentials; a registry that does not answer is worth a
        retry."""
        spec = self.mlflow
        uri = spec.tracking_uri or mlflow_uri
        credentials = resolve(MlflowCredentials, spec.credentials_block)
        try:
            return call_with_credentials(
                credentials, fetch_mlflow_here, spec.model_dump(mode="json"), uri
            )
        except MlflowAuthError as exc:
            raise SourceError(
                f"source.mlflow: {exc}, or name a saved "
                f"{MlflowCredentials.get_block_type_slug()} block in "
                f"{MlflowCredentials.KIND.spec_key}"
            ) from None

    def trigger(self, name: str, spec_params: dict[str, Any]) -> dict[str, Any] | None:
        """Following an alias, the spec is released when a training flow announces a new version
        under that alias, with that version in the spec. Prefect merges trigger parameters into
        the deployment's at the top level only, so the whole spec is passed."""
        source = self.mlflow
        if not source.alias:
            return None  # a pinned version stays
        params = copy.deepcopy(spec_params)
        pinned = {k: v for k, v in params["source"]["mlflow"].items() if k != "alias"}
        params["source"] = {
            **params["source"],
            "mlflow": {**pinned, "version": "{{ event.resource.version }}"},
        }
        # Only the alias the spec follows: a run that moves another alias starts no release.
        return {
            "type": "event",
            "enabled": True,
            "name": f"{name}-on-new-{source.model}-version",
            "match": {"prefect.resource.id": f"mlflow.model.{source.model}", "alias": source.alias},
            "expect": [REGISTERED_EVENT],
            "parameters": {"spec": params},
        }


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
                "with mlflow.transformers.log_model, or log a save_pretrained() directory"
            )
        parts = [inner[0]]
    for part in parts:
        if part.is_dir():
            shutil.copytree(part, out, dirs_exist_ok=True)


def fetch_mlflow_here(spec_fields: dict[str, Any], uri: str) -> FetchResult:
    """`MlflowSource.fetch`'s work, in the process whose environment holds the registry's
    credentials."""
    from mlflow.exceptions import MlflowException

    spec = MlflowSourceSpec.model_validate(spec_fields)
    registry = Registry(uri)
    where = f"source.mlflow: registered model {spec.model!r} in {redact_uri(uri)}"
    try:
        mv = (
            registry.version_by_alias(spec.model, spec.alias)
            if spec.alias
            else registry.version(spec.model, str(spec.version))
        )
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            if not registry.has_model(spec.model):
                raise SourceError(
                    f"{where} does not exist: check source.mlflow.model and the registry URI"
                ) from None
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
        model_dir=str(done.path),
        source_id=f"mlflow:{spec.model}",
        revision=version,
        files=files,
        content_hash=digest(files),
        registry={
            "uri": uri,
            "model": spec.model,
            "version": version,
            "run_id": mv.run_id,
            "alias": spec.alias,
        },
    )
