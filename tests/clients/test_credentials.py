"""hf2triton.clients.credentials on its own: the three kinds of secret (image registry, MLflow, S3
store) from a saved Prefect block (the session's real test API) or the environment, what each client
is handed, the one-line errors, and MLflow's child process that carries a block's credentials
without this process's environment ever holding them."""

from __future__ import annotations

import os

import pytest

from hf2triton.clients.credentials import (
    MlflowCredentials,
    RegistryCredentials,
    S3Credentials,
    resolve,
)
from hf2triton.clients.mlflow import call_with_credentials
from hf2triton.errors import (
    Hf2TritonError,
    ModelStoreError,
    RegistryAuthError,
    ServiceUnavailableError,
    SourceError,
    SpecError,
    is_retryable,
)

SECRET = "test-only-s3cret-9"
# Each kind: a block holding SECRET, the environment giving the same account, the error a
# missing block raises, and the spec key the error names.
KINDS = [
    (
        RegistryCredentials(username="ci", password=SECRET),
        {"HF2TRITON_REGISTRY_USERNAME": "ci", "HF2TRITON_REGISTRY_PASSWORD": SECRET},
        RegistryAuthError,
        "image.credentials_block",
    ),
    (
        MlflowCredentials(username="ci", password=SECRET),
        {"MLFLOW_TRACKING_USERNAME": "ci", "MLFLOW_TRACKING_PASSWORD": SECRET},
        SpecError,
        "source.mlflow.credentials_block",
    ),
    (
        S3Credentials(access_key_id="AKIATEST", secret_access_key=SECRET),
        {"AWS_ACCESS_KEY_ID": "AKIATEST", "AWS_SECRET_ACCESS_KEY": SECRET},
        ModelStoreError,
        "deploy.model_store.credentials_block",
    ),
]
IDS = ["registry", "mlflow", "s3"]


def _values(block) -> dict:
    """The block's fields (SecretStr compares by its secret)."""
    return {k: getattr(block, k) for k in type(block).model_fields}


def test_the_block_type_slugs_saved_blocks_are_found_by_have_not_changed():
    # A saved block is stored under its type's slug: changing one orphans every saved block.
    assert [
        b.get_block_type_slug() for b in (RegistryCredentials, MlflowCredentials, S3Credentials)
    ] == [
        "hf2triton-registry-credentials",
        "hf2triton-mlflow-credentials",
        "hf2triton-s3-credentials",
    ]


@pytest.mark.parametrize("block, env, error, key", KINDS, ids=IDS)
def test_a_saved_block_wins_over_the_environment_and_hides_its_secret(
    block, env, error, key, environ_writes
):
    name = f"test-{block.get_block_type_slug()}"
    type(block)(**_values(block)).save(name, overwrite=True)
    other = {k: "environment-" + v for k, v in env.items()}
    found = resolve(type(block), name, other)
    assert type(found) is type(block) and _values(found) == _values(block)
    assert SECRET not in repr(found) and SECRET not in str(found)
    # Found by slug too, as a block saved before it moved to this module is.
    from prefect.blocks.core import Block

    assert type(Block.load(f"{block.get_block_type_slug()}/{name}")) is type(block)
    assert not [w for w in environ_writes if SECRET in w[1]]


@pytest.mark.parametrize("block, env, error, key", KINDS, ids=IDS)
def test_the_environment_gives_the_same_credentials_as_a_block(block, env, error, key):
    assert _values(resolve(type(block), None, env)) == _values(block)


@pytest.mark.parametrize("block, env, error, key", KINDS, ids=IDS)
def test_a_block_that_is_not_saved_fails_in_one_line_naming_the_key_and_what_to_do(
    block, env, error, key
):
    with pytest.raises(error) as caught:
        resolve(type(block), "no-such-block", env)
    message = str(caught.value)
    assert "\n" not in message and not is_retryable(caught.value)
    assert f"{key} 'no-such-block': no saved {block.get_block_type_slug()} block" in message
    assert f"{type(block).__name__}(...).save('no-such-block')" in message
    assert all(variable in message for variable in list(env)[:2]), message


def test_missing_or_half_given_credentials_say_what_to_set():
    assert resolve(RegistryCredentials, None, {}) is None  # an open registry needs none
    with pytest.raises(
        RegistryAuthError,
        match="HF2TRITON_REGISTRY_PASSWORD is not set, but "
        "HF2TRITON_REGISTRY_USERNAME is: set HF2TRITON_REGISTRY_USERNAME and "
        "HF2TRITON_REGISTRY_PASSWORD, or name a saved",
    ):
        resolve(RegistryCredentials, None, {"HF2TRITON_REGISTRY_USERNAME": "ci"})
    assert resolve(MlflowCredentials, None, {}) is None  # MLflow may read its own file
    assert resolve(MlflowCredentials, None, {"MLFLOW_TRACKING_TOKEN": "t"}).environment() == {
        "MLFLOW_TRACKING_TOKEN": "t"
    }
    hint = (
        "set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or name a saved "
        "hf2triton-s3-credentials block in deploy.model_store.credentials_block"
    )
    with pytest.raises(ModelStoreError) as none_given:
        resolve(S3Credentials, None, {})
    assert str(none_given.value) == f"deploy.model_store is s3 but has no credentials: {hint}"
    with pytest.raises(ModelStoreError) as half_given:
        resolve(S3Credentials, None, {"AWS_SESSION_TOKEN": "t", "AWS_ACCESS_KEY_ID": "AKIATEST"})
    assert str(half_given.value) == (
        f"AWS_SECRET_ACCESS_KEY is not set, but AWS_ACCESS_KEY_ID and AWS_SESSION_TOKEN are: {hint}"
    )


def test_what_each_client_is_handed():
    registry = RegistryCredentials(username="ci", password=SECRET)
    assert registry.auth_config("reg.example:5000") == {
        "username": "ci",
        "password": SECRET,
        "serveraddress": "reg.example:5000",
    }
    s3 = resolve(
        S3Credentials,
        None,
        {
            "AWS_ACCESS_KEY_ID": "AKIATEST",
            "AWS_SECRET_ACCESS_KEY": SECRET,
            "AWS_SESSION_TOKEN": "sts-token",
        },
    )
    import boto3

    signing = boto3.session.Session(**s3.client_kwargs()).get_credentials().get_frozen_credentials()
    assert (signing.access_key, signing.secret_key, signing.token) == (
        "AKIATEST",
        SECRET,
        "sts-token",
    )
    assert s3.environment() == {
        "AWS_ACCESS_KEY_ID": "AKIATEST",
        "AWS_SECRET_ACCESS_KEY": SECRET,
        "AWS_SESSION_TOKEN": "sts-token",
    }


# ---- MLflow's child process ------------------------------------------------------------------


def mlflow_environment() -> dict[str, str | None]:
    """Run in the child: what MLflow itself reads as its credentials there."""
    from mlflow.utils.credentials import get_default_host_creds

    creds = get_default_host_creds("http://mlflow.example")
    return {"username": creds.username, "password": creds.password, "token": creds.token}


def raise_in_child(kind: str) -> None:
    """Run in the child: fail as `kind` says."""
    raise {
        "source": SourceError("registered model 'm' does not exist"),
        "network": ConnectionRefusedError("connection refused"),
        "other": ValueError("something else"),
    }[kind]


def test_the_child_sees_the_blocks_credentials_and_none_of_this_process(
    monkeypatch, environ_writes
):
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "release-user")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "release-password")
    environ_writes.clear()
    seen = call_with_credentials(MlflowCredentials(token=SECRET), mlflow_environment)
    # The release's own user and password do not go along with the source's token.
    assert seen == {"username": None, "password": None, "token": SECRET}
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == "release-password"
    assert "MLFLOW_TRACKING_TOKEN" not in os.environ and environ_writes == []
    # Without a block, the child sees what MLflow would have seen here.
    assert call_with_credentials(resolve(MlflowCredentials, None), mlflow_environment) == {
        "username": "release-user",
        "password": "release-password",
        "token": None,
    }


def test_failures_in_the_child_keep_their_type_and_retryability():
    with pytest.raises(SourceError, match="registered model 'm' does not exist"):
        call_with_credentials(None, raise_in_child, "source")
    with pytest.raises(ServiceUnavailableError, match="ConnectionRefusedError") as network:
        call_with_credentials(None, raise_in_child, "network")
    assert is_retryable(network.value)
    with pytest.raises(Hf2TritonError, match="ValueError: something else") as other:
        call_with_credentials(None, raise_in_child, "other")
    assert not is_retryable(other.value)


def test_links_to_mlflow_in_the_prefect_ui_carry_no_password():
    """The release report's and the watch's links to the MLflow run and version are artifacts
    stored by Prefect and shown in its UI: a tracking URI's user:password stays out of them."""
    from hf2triton.release.report import mlflow_links

    links = mlflow_links("https://alice:s3cret@mlflow.example:5443/", "abc", "7", "m", "3")
    assert links == {
        "run": "https://mlflow.example:5443/#/experiments/7/runs/abc",
        "version": "https://mlflow.example:5443/#/models/m/versions/3",
    }
