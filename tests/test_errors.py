"""The error types callers rely on: each carries its code and the CLI's exit code, retry
conditions tell "try again" from "this will never work", and an error keeps its type and message
across pickling (Prefect's result serialisation)."""

from __future__ import annotations

import pickle

import pytest

from hf2triton import errors

PERMANENT = {
    errors.SpecError: ("INVALID_SPEC", 2),
    errors.EnvironmentSetupError: ("ENVIRONMENT", 3),
    errors.SourceError: ("INVALID_SOURCE", 1),
    errors.UnsupportedModelError: ("UNSUPPORTED_MODEL", 1),
    errors.ExportError: ("EXPORT_FAILED", 1),
    errors.QuantizationError: ("QUANTIZATION_FAILED", 1),
    errors.AccuracyGateError: ("ACCURACY_GATE_FAILED", 1),
    errors.ArtifactError: ("ARTIFACT_ERROR", 1),
    errors.DiskFullError: ("DISK_FULL", 1),
    errors.WorkerDiedError: ("WORKER_DIED", 1),
    errors.DeployError: ("DEPLOY_FAILED", 1),
    errors.SmokeTestError: ("SMOKE_TEST_FAILED", 1),
    errors.DockerUnavailableError: ("DOCKER_UNAVAILABLE", 1),
    errors.ImageBuildError: ("IMAGE_BUILD_FAILED", 1),
    errors.RegistryAuthError: ("REGISTRY_AUTH_FAILED", 1),
    errors.MlflowAuthError: ("MLFLOW_AUTH_FAILED", 1),
    errors.ModelStoreError: ("MODEL_STORE", 1),
}
TRANSIENT = {
    errors.TransientError: "TRANSIENT",
    errors.ServiceUnavailableError: "SERVICE_UNAVAILABLE",
    errors.RegistryUnavailableError: "REGISTRY_UNAVAILABLE",
    errors.ReleaseBusyError: "RELEASE_BUSY",
}


@pytest.mark.parametrize(
    "cls, expected", PERMANENT.items(), ids=lambda v: getattr(v, "__name__", "")
)
def test_permanent_errors_carry_their_code_and_are_not_retried(cls, expected):
    code, exit_code = expected
    exc = cls("the spec has no name: add `name:`")
    assert isinstance(exc, errors.Hf2TritonError)
    assert (exc.code, exc.exit_code) == (code, exit_code)
    assert not exc.retryable and not errors.is_retryable(exc)
    assert str(exc) == exc.message == "the spec has no name: add `name:`"


@pytest.mark.parametrize("cls, code", TRANSIENT.items(), ids=lambda v: getattr(v, "__name__", ""))
def test_transient_errors_are_retried(cls, code):
    exc = cls("MLflow answered 503")
    assert isinstance(exc, errors.TransientError) and exc.code == code
    assert exc.retryable and errors.is_retryable(exc)
    assert exc.exit_code == 1


def test_every_code_names_one_error_type():
    every = [errors.Hf2TritonError, *PERMANENT, *TRANSIENT]
    codes = [cls.code for cls in every]
    assert len(set(codes)) == len(codes)
    # Every error type the module defines is in one of the tables above.
    defined = {
        v
        for v in vars(errors).values()
        if isinstance(v, type) and issubclass(v, errors.Hf2TritonError)
    }
    assert defined == set(every)


def test_a_full_disk_is_an_artifact_error():
    # Callers that handle ArtifactError (a half-written artifact) also see a full disk.
    with pytest.raises(errors.ArtifactError) as info:
        raise errors.DiskFullError("/work: 10 MB free, about 300 MB needed")
    assert info.value.code == "DISK_FULL"


@pytest.mark.parametrize(
    "exc, retry",
    [
        (ConnectionRefusedError("refused"), True),
        (ConnectionResetError("reset"), True),
        (TimeoutError("timed out"), True),
        (ValueError("bad value"), False),
        (KeyError("missing"), False),
        (RuntimeError("boom"), False),
        (None, False),
    ],
)
def test_plain_network_failures_are_retryable_and_nothing_else(exc, retry):
    assert errors.is_retryable(exc) is retry


@pytest.mark.parametrize("cls", [errors.SpecError, errors.ServiceUnavailableError])
def test_an_error_keeps_its_type_and_message_when_pickled(cls):
    back = pickle.loads(pickle.dumps(cls("mlflow at http://x:5000 did not answer")))
    assert type(back) is cls
    assert str(back) == "mlflow at http://x:5000 did not answer"
    assert back.code == cls.code and back.retryable is cls.retryable
