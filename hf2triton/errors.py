"""The one place that defines hf2triton's error types.

Every failure a user can meet is a subclass of `Hf2TritonError`, carrying an error code and a
`retryable` flag, so retry conditions can tell "try again" from "this will never work".
"""

from __future__ import annotations


class Hf2TritonError(Exception):
    """Root of all hf2triton errors. The message says what was wrong and what to do."""

    code = "HF2TRITON_ERROR"
    retryable = False
    exit_code = 1  # what the CLI exits with

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message

    def __reduce__(self):  # keep the type across Prefect's result serialisation
        return (self.__class__, (self.message,))


# Permanent errors: a second try gives the same answer.


class SpecError(Hf2TritonError):
    """The release spec is missing, malformed or has a bad value."""

    code = "INVALID_SPEC"
    exit_code = 2


class EnvironmentSetupError(Hf2TritonError):
    """This machine cannot run a release as set up: the hf2triton home cannot be created or
    written, or Prefect's API cannot be started or reached. Nothing was started."""

    code = "ENVIRONMENT"
    exit_code = 3


class SourceError(Hf2TritonError):
    """The model source cannot be used: missing files, corrupt weights, no tokenizer."""

    code = "INVALID_SOURCE"


class UnsupportedModelError(Hf2TritonError):
    """The model's architecture or task is one the exporter cannot handle."""

    code = "UNSUPPORTED_MODEL"


class ExportError(Hf2TritonError):
    """ONNX export failed or the exported graph disagrees with PyTorch."""

    code = "EXPORT_FAILED"


class QuantizationError(Hf2TritonError):
    """Quantization failed."""

    code = "QUANTIZATION_FAILED"


class AccuracyGateError(Hf2TritonError):
    """The candidate model missed an accuracy threshold; nothing after validation runs."""

    code = "ACCURACY_GATE_FAILED"


class ArtifactError(Hf2TritonError):
    """An artifact on disk is missing, corrupt, or cannot be written (disk full, permissions)."""

    code = "ARTIFACT_ERROR"


class DiskFullError(ArtifactError):
    """A step ran out of disk space (or quota) writing its output. What it had written is removed;
    the message names the folder, the space free there and about how much the step needs."""

    code = "DISK_FULL"


class WorkerDiedError(Hf2TritonError):
    """A step's work in a process of its own (a large model's export or PyTorch reference) ended
    without an answer: killed, most often by the kernel for memory."""

    code = "WORKER_DIED"


class DeployError(Hf2TritonError):
    """Triton could not be set up or refused to load the model."""

    code = "DEPLOY_FAILED"


class SmokeTestError(Hf2TritonError):
    """The deployed endpoint answered, but not with what the PyTorch model says."""

    code = "SMOKE_TEST_FAILED"


class DockerUnavailableError(Hf2TritonError):
    """No Docker engine, registry or base image can be had where the release needs one."""

    code = "DOCKER_UNAVAILABLE"


class ImageBuildError(Hf2TritonError):
    """The serving image did not build: a Dockerfile step failed or the wheelhouse is incomplete."""

    code = "IMAGE_BUILD_FAILED"


class RegistryAuthError(Hf2TritonError):
    """The image registry refused the credentials, or gave none where it needs them."""

    code = "REGISTRY_AUTH_FAILED"


class MlflowAuthError(Hf2TritonError):
    """An MLflow server refused the credentials (401), or the user may not do this (403)."""

    code = "MLFLOW_AUTH_FAILED"


class ModelStoreError(Hf2TritonError):
    """The S3-compatible model store is misconfigured: no bucket, no or refused credentials."""

    code = "MODEL_STORE"


# Transient errors: a server still starting, a refused connection, a 5xx.


class TransientError(Hf2TritonError):
    """A failure that can succeed on a second try."""

    code = "TRANSIENT"
    retryable = True


class ServiceUnavailableError(TransientError):
    """A server (MLflow, Triton, the hub) did not answer or answered 5xx."""

    code = "SERVICE_UNAVAILABLE"


class RegistryUnavailableError(TransientError):
    """The image registry or the Docker engine did not answer, or answered 5xx, mid-push."""

    code = "REGISTRY_UNAVAILABLE"


class ReleaseBusyError(TransientError):
    """Another run of the same release held its lock (hf2triton.orchestration.locks) for longer
    than this run
    would wait (HF2TRITON_LOCK_WAIT_S): nothing was started. Run again when that one finished."""

    code = "RELEASE_BUSY"


def is_retryable(exc: BaseException | None) -> bool:
    """True when a second try can succeed: our transient errors and plain network failures."""
    if exc is None:
        return False
    if isinstance(exc, Hf2TritonError):
        return exc.retryable
    return isinstance(exc, (ConnectionError, TimeoutError))
