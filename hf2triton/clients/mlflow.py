"""The MLflow tracking server and model registry as the release uses them: one run and one model
version per distinct release, aliases, version tags. Failures are classified by exception type
and MLflow error code: a server that does not answer (a requests error under MLflow's
exception) or answers "temporarily unavailable" is a `ServiceUnavailableError`; the rest keep
their MLflow exception.

MLflow takes a server's credentials from the process environment only (MLFLOW_TRACKING_*): work
for a registry that needs other credentials than this process's runs in a child process whose
environment carries them (`call_with_credentials`), never by changing this process's os.environ.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypedDict, TypeVar

from hf2triton import errors
from hf2triton.clients.credentials import MlflowCredentials, child_environment
from hf2triton.errors import Hf2TritonError, MlflowAuthError, ServiceUnavailableError
from hf2triton.util import quiet
from hf2triton.util.workspace import home, redact_uri

T = TypeVar("T")
RELEASE_KEY_TAG = "hf2triton.release_key"
# MLflow error codes of an answer a second try can get past (HTTP 503, 504, 429).
TRANSIENT_CODES = ("TEMPORARILY_UNAVAILABLE", "DEADLINE_EXCEEDED", "RESOURCE_EXHAUSTED")
AUTH_CODES = ("UNAUTHENTICATED", "PERMISSION_DENIED")

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


def _chain(exc: BaseException | None) -> Iterator[BaseException]:
    seen: set[int] = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        yield exc
        exc = exc.__cause__ or exc.__context__


def error_code(exc: BaseException) -> str | None:
    """MLflow's error code name of an MlflowException (e.g. 'UNAUTHENTICATED'), else None."""
    from mlflow.exceptions import MlflowException
    from mlflow.protos.databricks_pb2 import ErrorCode

    if not isinstance(exc, MlflowException):
        return None
    return exc.error_code if isinstance(exc.error_code, str) else ErrorCode.Name(exc.error_code)


def is_transient(exc: BaseException) -> bool:
    """Did MLflow fail because its server did not answer, or answered 'try later'?"""
    import requests

    for link in _chain(exc):
        if isinstance(link, requests.exceptions.HTTPError) and link.response is not None:
            # The artifact endpoints answer through requests: 5xx and 429 pass, 4xx do not.
            status = link.response.status_code
            return status >= 500 or status == 429
        if isinstance(link, (requests.exceptions.RequestException, ConnectionError, TimeoutError)):
            return True
        if error_code(link) in TRANSIENT_CODES:
            return True
    return False


def auth_refusal(exc: BaseException) -> str | None:
    """'UNAUTHENTICATED' or 'PERMISSION_DENIED' when MLflow (its REST or artifact endpoints)
    refused the credentials, else None."""
    import requests

    for link in _chain(exc):
        if isinstance(link, requests.exceptions.HTTPError) and link.response is not None:
            return {401: "UNAUTHENTICATED", 403: "PERMISSION_DENIED"}.get(link.response.status_code)
        if error_code(link) in AUTH_CODES:
            return error_code(link)
    return None


def _flatten(prefix: str, value: Any, out: dict[str, str]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    else:
        out[prefix] = json.dumps(value) if isinstance(value, list) else str(value)


def _complete(mv: Any, run: Any | None) -> bool:
    """A registered version whose run finished: its record was written to the end."""
    return (
        mv.status == "READY"
        and run is not None
        and run.info.status == "FINISHED"
        and run.info.lifecycle_stage == "active"
    )


def _artifact_files(dest: str, src: str) -> dict[str, int]:
    """The artifact paths `log_release` gives the local file or directory `src` logged as
    `dest`, with their sizes."""
    src_path = Path(src)
    if src_path.is_dir():
        # __pycache__ is what Triton's Python backend may write beside model.py since.
        return {
            f"{dest}/{p.relative_to(src_path).as_posix()}": p.stat().st_size
            for p in sorted(src_path.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts
        }
    parent = Path(dest).parent.as_posix()
    rel = src_path.name if parent == "." else f"{parent}/{src_path.name}"
    return {rel: src_path.stat().st_size}


class RegisteredRelease(TypedDict):
    """A release's model version in the registry (`Registry.register_release`)."""

    tracking_uri: str
    model_name: str
    version: str
    run_id: str
    experiment_id: str
    reused: bool  # registered by an earlier run with the same release key


class Registry:
    """One MLflow tracking and registry URI."""

    def __init__(self, uri: str | None = None):
        # MLflow's own HTTP retries back off for minutes; the task's retries own the schedule.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR", "1")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "60")
        from mlflow import MlflowClient

        self.uri = uri or tracking_uri()
        self.client = MlflowClient(tracking_uri=self.uri, registry_uri=self.uri)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run one MLflow call; a server that does not answer is worth a retry."""
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            if is_transient(exc):
                raise ServiceUnavailableError(
                    f"MLflow at {redact_uri(self.uri)} did not answer while trying to {what}: "
                    "check that the server is up (MLFLOW_TRACKING_URI) and run again"
                ) from exc
            code = auth_refusal(exc)
            if code:
                refused = (
                    "refused the credentials"
                    if code == "UNAUTHENTICATED"
                    else "does not allow these credentials"
                )
                raise MlflowAuthError(
                    f"MLflow at {redact_uri(self.uri)} {refused} ({code}) while trying to {what}: "
                    f"set {MlflowCredentials.KIND.env_hint} for a user that may do this"
                ) from None
            raise

    def download_version(self, name: str, version: str, dst: str) -> str:
        """A registered version's files into `dst`, from this registry. (MLflow's `models:/`
        download reads the process-wide registry URI whatever registry_uri it is given, so
        the version's location is resolved here: a run's artifacts or a logged model's.)"""
        import mlflow

        where = self.call(
            "resolve the model version's files",
            self.client.get_model_version_download_uri,
            name,
            version,
        )
        if where.startswith("models:/m-"):  # MLflow 3: a logged model, by id
            where = self.call(
                "resolve the logged model",
                self.client.get_logged_model,
                where.removeprefix("models:/").split("/")[0],
            ).artifact_location
        return self.call(
            "download the model version",
            mlflow.artifacts.download_artifacts,
            artifact_uri=where,
            dst_path=dst,
            tracking_uri=self.uri,
        )

    # -- lookups --------------------------------------------------------------------------
    def has_model(self, name: str) -> bool:
        from mlflow.exceptions import MlflowException

        try:
            self.call("look up the model", self.client.get_registered_model, name)
            return True
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return False
            raise

    def versions_with_key(self, name: str, release_key: str) -> list[Any]:
        """Every version registered with `release_key`, complete or not, oldest first."""
        if not self.has_model(name):
            return []
        found = self.call(
            "search model versions",
            self.client.search_model_versions,
            f"name = '{name}' and tags.`{RELEASE_KEY_TAG}` = '{release_key}'",
        )
        return sorted(found, key=lambda mv: int(mv.version))

    def _run_or_none(self, run_id: str | None) -> Any | None:
        from mlflow.exceptions import MlflowException

        if not run_id:
            return None
        try:
            return self.run(run_id)
        except MlflowException as exc:
            if exc.error_code == "RESOURCE_DOES_NOT_EXIST":
                return None
            raise

    def version(self, name: str, version: str) -> Any:
        return self.call("read the model version", self.client.get_model_version, name, version)

    def version_by_alias(self, name: str, alias: str) -> Any:
        return self.call("resolve the alias", self.client.get_model_version_by_alias, name, alias)

    def run(self, run_id: str) -> Any:
        return self.call("read the run", self.client.get_run, run_id)

    def experiment_id(self, name: str) -> str:
        exp = self.call("look up the experiment", self.client.get_experiment_by_name, name)
        if exp is not None:
            return exp.experiment_id
        artifact_location = None
        if self.uri.startswith("sqlite:") or "://" not in self.uri:
            # A local store keeps artifacts beside it, not in ./mlruns of whatever the cwd is.
            artifact_location = (home() / "mlartifacts").as_uri()
        return self.call(
            "create the experiment",
            self.client.create_experiment,
            name,
            artifact_location=artifact_location,
        )

    # -- writes ---------------------------------------------------------------------------
    def set_alias(self, name: str, alias: str, version: str) -> None:
        self.call(
            f"move the {alias} alias", self.client.set_registered_model_alias, name, alias, version
        )

    def download_artifact(self, run_id: str, path: str, dst: str) -> str:
        return self.call(f"download {path}", self.client.download_artifacts, run_id, path, dst)

    def describe_version(self, name: str, version: str, description: str) -> None:
        self.call(
            "describe the version",
            self.client.update_model_version,
            name,
            version,
            description=description,
        )

    def register_release(
        self, name: str, experiment: str, record: Mapping[str, Any]
    ) -> RegisteredRelease:
        """The release's model version, alias `candidate` on it: the one already registered
        with the same release key (`reused`), else a new run and version carrying the whole
        record.

        Complete or nothing, as a later attempt sees it: an attempt that stopped half-way (MLflow
        went away, the process was killed) is settled first (`settle_attempts`), so a version
        found by its release key always carries the whole record and a re-run never adds a
        second one."""
        found, finished = self.settle_attempts(name, experiment, record)
        if found is not None:
            version, run_id = str(found.version), found.run_id
            exp_id, reused = self.run(run_id).info.experiment_id, not finished
        else:
            mv, run_id, exp_id = self.log_release(name, experiment, record)
            version, reused = str(mv.version), False
        self.set_alias(name, "candidate", version)
        return RegisteredRelease(
            tracking_uri=self.uri,
            model_name=name,
            version=version,
            run_id=run_id,
            experiment_id=exp_id,
            reused=reused,
        )

    def settle_attempts(
        self, name: str, experiment: str, record: Mapping[str, Any]
    ) -> tuple[Any | None, bool]:
        """What earlier attempts at this release left, made whole or removed: returns (the
        complete version with the release key or None, whether it was finished just now).

        A version whose run did not finish was created last of the record (`log_release`), so
        it is finished when its run holds the whole record; any other version or run of the
        release key that did not finish is deleted, never reused half-done."""
        key = record["release_key"]
        found, finished, deleted = None, False, []
        for mv in self.versions_with_key(name, key):
            run = self._run_or_none(mv.run_id)
            if found is None and _complete(mv, run):
                found = mv
            elif found is None and run is not None and not self._missing(mv, run, record):
                self.call("finish the run", self.client.set_terminated, run.info.run_id, "FINISHED")
                found, finished = mv, True
            elif not _complete(mv, run):
                self.call(
                    "delete an incomplete model version",
                    self.client.delete_model_version,
                    name,
                    mv.version,
                )
                deleted.append(f"version {mv.version}")
                if run is not None and run.info.lifecycle_stage == "active":
                    self.call("delete an incomplete run", self.client.delete_run, run.info.run_id)
                    deleted.append(f"run {run.info.run_id}")
        exp = self.call("look up the experiment", self.client.get_experiment_by_name, experiment)
        if exp is not None:
            runs = self.call(
                "search runs",
                self.client.search_runs,
                [exp.experiment_id],
                f"tags.`{RELEASE_KEY_TAG}` = '{key}'",
            )
            for run in runs:  # created by an attempt that never registered its version
                if run.info.status != "FINISHED":
                    self.call("delete an incomplete run", self.client.delete_run, run.info.run_id)
                    deleted.append(f"run {run.info.run_id}")
        if finished or deleted:
            from hf2triton.util.runs import step_logger

            log = step_logger()
            if deleted:
                log.info(
                    "register: deleted what an interrupted attempt left unfinished: %s",
                    ", ".join(deleted),
                )
            if finished:
                assert found is not None  # finished: the version found was finished just now
                log.info(
                    "register: finished %s version %s, which an interrupted attempt left "
                    "with its whole record",
                    name,
                    found.version,
                )
        return found, finished

    def _missing(self, mv: Any, run: Any, record: Mapping[str, Any]) -> list[str]:
        """What of the release record `run` and its version `mv` lack (empty: all there)."""
        if mv.status != "READY" or run.info.lifecycle_stage != "active":
            return [f"version status {mv.status}, run {run.info.lifecycle_stage}"]
        flat: dict[str, str] = {}
        _flatten("", record["params"], flat)
        missing = [f"tag {k}" for k in record["lineage"] if k not in mv.tags]
        missing += [f"param {k}" for k in flat if k not in run.data.params]
        missing += [f"metric {k}" for k in record["metrics"] if k not in run.data.metrics]
        remote = self._artifact_sizes(run.info.run_id, "")
        for dest, src in record["artifacts"].items():
            for rel, size in _artifact_files(dest, src).items():
                if remote.get(rel) != size:
                    missing.append(f"artifact {rel}")
        return missing

    def _artifact_sizes(self, run_id: str, path: str) -> dict[str, int | None]:
        """Every artifact file of the run below `path`, with its size (None: not known)."""
        sizes: dict[str, int | None] = {}
        for info in self.call(
            "list the run's artifacts", self.client.list_artifacts, run_id, path or None
        ):
            if info.is_dir:
                sizes.update(self._artifact_sizes(run_id, info.path))
            else:
                sizes[info.path] = info.file_size
        return sizes

    def log_artifacts(self, run_id: str, local_dir: str, dest: str) -> None:
        """Every file of `local_dir` into the run's artifacts under `dest`."""
        self.call(f"upload {dest}", self.client.log_artifacts, run_id, local_dir, dest)

    def tag_version(self, name: str, version: str, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            self.call(
                "tag the version", self.client.set_model_version_tag, name, version, key, value
            )

    def log_release(
        self, name: str, experiment: str, record: Mapping[str, Any]
    ) -> tuple[Any, str, str]:
        """A finished run with the release record (its release key, params, metrics, lineage
        tags and artifacts) and a new model version whose source is the run's
        `triton_repository` artifact; returns (version, run id, experiment id)."""
        release_key = record["release_key"]
        exp_id = self.experiment_id(experiment)
        run = self.call(
            "create a run",
            self.client.create_run,
            exp_id,
            run_name=f"{record['params'].get('name', name)}-{release_key[:8]}",
            tags={RELEASE_KEY_TAG: release_key, "hf2triton.model_name": name},
        )
        run_id = run.info.run_id
        try:
            self._log_record(run, record)
            if not self.has_model(name):
                self.call(
                    "create the registered model",
                    self.client.create_registered_model,
                    name,
                    description="Released by hf2triton",
                )
            mv = self.call(
                "create the model version",
                self.client.create_model_version,
                name,
                source=f"{run.info.artifact_uri}/triton_repository",
                run_id=run_id,
                tags={RELEASE_KEY_TAG: release_key, **record["lineage"]},
            )
        except BaseException:
            # Best effort (MLflow may be what failed): the next attempt settles what this one
            # left either way, and the error to report is the one that stopped it.
            with contextlib.suppress(Exception):
                self.call("mark the run failed", self.client.set_terminated, run_id, "FAILED")
            raise
        self.call("finish the run", self.client.set_terminated, run_id, "FINISHED")
        return mv, run_id, exp_id

    def _log_record(self, run: Any, record: Mapping[str, Any]) -> None:
        """The record's params (flattened) and metrics, and its artifacts, into `run`."""
        from mlflow.entities import Metric, Param

        run_id = run.info.run_id
        flat: dict[str, str] = {}
        _flatten("", record["params"], flat)
        ts = run.info.start_time
        self.call(
            "log the release record",
            self.client.log_batch,
            run_id,
            metrics=[Metric(k, float(v), ts, 0) for k, v in sorted(record["metrics"].items())],
            params=[Param(k, v[:6000]) for k, v in sorted(flat.items())],
        )
        for dest, src in record["artifacts"].items():
            if Path(src).is_dir():
                self.call(f"upload {dest}", self.client.log_artifacts, run_id, src, dest)
            else:
                parent = str(Path(dest).parent) if str(Path(dest).parent) != "." else None
                self.call(f"upload {dest}", self.client.log_artifact, run_id, src, parent)


# ---- work under other credentials than this process's ---------------------------------------

_CHILD = "from hf2triton.clients.mlflow import _serve_child; _serve_child()"


def call_with_credentials(
    credentials: MlflowCredentials | None, fn: Callable[..., T], *args: Any
) -> T:
    """`fn(*args)` in a child Python process whose environment has MLflow's variables set to
    `credentials` (none of this process's MLFLOW_TRACKING_* go along: another registry's password
    must not travel with a token). `fn` is a module-level function; its arguments and result
    are JSON. An hf2triton error raised in the child is raised here with its type and message.

    Why a child process: MLflow reads credentials from the environment at every request, in its
    REST stores and in every artifact repository alike; a child's own environment is the one
    place they can go without entering this process's (where other threads' MLflow calls, and
    anything that logs the environment, would see them).
    """
    import hf2triton

    env = child_environment(credentials, MlflowCredentials)
    # The child imports the same hf2triton as this process, whatever its sys.path was.
    root = str(Path(hf2triton.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [env.get("PYTHONPATH")])])
    target = f"{fn.__module__}:{fn.__qualname__}"
    with tempfile.TemporaryDirectory(prefix="hf2triton-mlflow-") as tmp:
        answer = Path(tmp) / "answer.json"
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD],
            env=env,
            capture_output=True,
            text=True,
            input=json.dumps({"target": target, "args": args, "answer": str(answer)}),
        )
        if not answer.is_file():
            tail = " ".join(proc.stderr.strip().splitlines()[-3:])
            for secret in credentials.environment().values() if credentials else ():
                tail = tail.replace(secret, "***")
            raise Hf2TritonError(
                f"{target} stopped in its child process (exit code "
                f"{proc.returncode}) without an answer: {tail}"
            )
        got = json.loads(answer.read_text())
    if "error" in got:
        raise _rebuilt(got["error"])
    return got["result"]


def _rebuilt(error: dict[str, Any]) -> Exception:
    """The child's exception as this process raises it: an hf2triton error keeps its type."""
    kind = getattr(errors, error["type"], None) if error["hf2triton"] else None
    if isinstance(kind, type) and issubclass(kind, Hf2TritonError):
        return kind(error["message"])
    message = f"{error['type']}: {error['message']}"
    return ServiceUnavailableError(message) if error["retryable"] else Hf2TritonError(message)


def _serve_child() -> None:
    """The child's side of `call_with_credentials`: one call, its answer written to a file
    (stdout and stderr are the libraries')."""
    request = json.loads(sys.stdin.read())
    module, name = request["target"].split(":")
    try:
        answer: dict[str, Any] = {
            "result": getattr(importlib.import_module(module), name)(*request["args"])
        }
    except Exception as exc:  # noqa: BLE001 - every failure goes back to the caller
        answer = {
            "error": {
                "type": type(exc).__name__,
                "message": str(exc),
                "hf2triton": isinstance(exc, Hf2TritonError),
                "retryable": errors.is_retryable(exc),
            }
        }
    tmp = Path(request["answer"] + ".tmp")
    tmp.write_text(json.dumps(answer))
    os.replace(tmp, request["answer"])
