"""Register step: one MLflow run and one registered model version per distinct release, carrying
the whole release record (spec, library versions, metrics, artifacts, lineage tags). The same
inputs never make a second version; `promote` moves the `champion` alias after the smoke test.
"""

from __future__ import annotations

import json
import os
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypedDict

from prefect import task

from hf2triton import quiet
from hf2triton.errors import ServiceUnavailableError
from hf2triton.workspace import home
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT

RELEASE_KEY_TAG = "hf2triton.release_key"
LIBRARIES = ("torch", "transformers", "optimum", "optimum-onnx", "onnx", "onnxruntime", "mlflow",
             "prefect")


class RegisterResult(TypedDict):
    tracking_uri: str
    model_name: str
    version: str
    run_id: str
    experiment_id: str
    reused: bool


# A new local store announces its schema set-up at INFO on the first release; nothing to act on.
for _message in ("Creating initial MLflow database tables", "Updating database tables"):
    quiet.drop_log_message("mlflow.store.db.utils", _message)


def tracking_uri() -> str:
    """$MLFLOW_TRACKING_URI, else a SQLite store inside the hf2triton home."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if uri:
        return uri
    db = home() / "mlflow.db"
    db.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{db}"


def library_versions() -> dict[str, str]:
    found = {}
    for lib in LIBRARIES:
        try:
            found[lib] = version(lib)
        except PackageNotFoundError:
            found[lib] = "not installed"
    return found


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, list) else str(value)


def _client(uri: str):
    # MLflow's own HTTP retries back off for minutes; the task's retries own the schedule.
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
    os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
    from mlflow import MlflowClient

    return MlflowClient(tracking_uri=uri, registry_uri=uri)


def _transient(exc: Exception) -> bool:
    text = str(exc)
    return any(s in text for s in (
        "Connection refused", "Max retries exceeded", "ConnectionError", "503", "502", "504",
        "timed out", "Failed to establish",
    ))


def _call(what: str, uri: str, fn, *args, **kwargs):
    """Run an MLflow call; a server that does not answer is a transient error worth a retry."""
    from mlflow.exceptions import MlflowException

    try:
        return fn(*args, **kwargs)
    except (MlflowException, OSError) as exc:
        if isinstance(exc, ConnectionError) or _transient(exc):
            raise ServiceUnavailableError(
                f"MLflow at {uri} did not answer while trying to {what}: check that the server "
                "is up (MLFLOW_TRACKING_URI) and run again"
            ) from exc
        raise


def _experiment_id(client, uri: str, name: str) -> str:
    exp = _call("look up the experiment", uri, client.get_experiment_by_name, name)
    if exp is not None:
        return exp.experiment_id
    artifact_location = None
    if uri.startswith("sqlite:") or "://" not in uri:
        # A local store keeps artifacts beside it, not in ./mlruns of whatever the cwd is.
        artifact_location = (home() / "mlartifacts").as_uri()
    return _call("create the experiment", uri, client.create_experiment, name,
                 artifact_location=artifact_location)


def register_release(
    model_name: str,
    experiment: str,
    release_key: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    lineage: dict[str, str],
    artifacts: dict[str, str],
) -> RegisterResult:
    """Log a run and register a model version, unless one with `release_key` exists already.

    `artifacts` maps an artifact path in the run to a local file or directory; the version's
    source is the `triton_repository` artifact.
    """
    uri = tracking_uri()
    client = _client(uri)
    existing = _call(
        "search model versions", uri, client.search_model_versions,
        f"name = '{model_name}' and tags.`{RELEASE_KEY_TAG}` = '{release_key}'",
    ) if _call("look up the model", uri, _registered, client, model_name) else []
    if existing:
        mv = existing[0]
        _call("set the candidate alias", uri, client.set_registered_model_alias, model_name,
              "candidate", mv.version)
        run = _call("read the run", uri, client.get_run, mv.run_id)
        return RegisterResult(tracking_uri=uri, model_name=model_name, version=str(mv.version),
                              run_id=mv.run_id, experiment_id=run.info.experiment_id,
                              reused=True)

    exp_id = _experiment_id(client, uri, experiment)
    run = _call("create a run", uri, client.create_run, exp_id,
                run_name=f"{params.get('name', model_name)}-{release_key[:8]}",
                tags={RELEASE_KEY_TAG: release_key, "hf2triton.model_name": model_name})
    run_id = run.info.run_id
    try:
        flat: dict[str, str] = {}
        _flatten("", params, flat)
        from mlflow.entities import Metric, Param

        ts = run.info.start_time
        _call("log the release record", uri, client.log_batch, run_id,
              metrics=[Metric(k, float(v), ts, 0) for k, v in sorted(metrics.items())],
              params=[Param(k, v[:6000]) for k, v in sorted(flat.items())])
        for dest, src in artifacts.items():
            src_path = Path(src)
            if src_path.is_dir():
                _call(f"upload {dest}", uri, client.log_artifacts, run_id, str(src_path), dest)
            else:
                parent = str(Path(dest).parent) if str(Path(dest).parent) != "." else None
                _call(f"upload {dest}", uri, client.log_artifact, run_id, str(src_path), parent)
        if not _call("look up the model", uri, _registered, client, model_name):
            _call("create the registered model", uri, client.create_registered_model, model_name,
                  description="Released by hf2triton")
        tags = {RELEASE_KEY_TAG: release_key, **lineage}
        mv = _call("create the model version", uri, client.create_model_version, model_name,
                   source=f"{run.info.artifact_uri}/triton_repository", run_id=run_id, tags=tags)
        _call("set the candidate alias", uri, client.set_registered_model_alias, model_name,
              "candidate", mv.version)
    except BaseException:
        _call("mark the run failed", uri, client.set_terminated, run_id, "FAILED")
        raise
    _call("finish the run", uri, client.set_terminated, run_id, "FINISHED")
    return RegisterResult(tracking_uri=uri, model_name=model_name, version=str(mv.version),
                          run_id=run_id, experiment_id=exp_id, reused=False)


def _registered(client, name: str) -> bool:
    from mlflow.exceptions import MlflowException

    try:
        client.get_registered_model(name)
        return True
    except MlflowException as exc:
        if getattr(exc, "error_code", "") == "RESOURCE_DOES_NOT_EXIST":
            return False
        raise


def promote_release(model_name: str, version: str, metrics: dict[str, float]) -> str:
    """Move the `champion` alias to `version` (only called after its smoke test passed)."""
    uri = tracking_uri()
    client = _client(uri)
    for key, value in metrics.items():
        _call("tag the version", uri, client.set_model_version_tag, model_name, version,
              f"smoke.{key}", f"{value:.6g}")
    _call("move the champion alias", uri, client.set_registered_model_alias, model_name,
          "champion", version)
    return version


register = task(register_release, name="register", task_run_name="register {model_name}",
                **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
promote = task(promote_release, name="promote", task_run_name="promote {model_name} v{version}",
               **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
