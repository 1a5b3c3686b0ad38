"""The release's three kinds of secret (image registry, MLflow, S3 object store): each a Prefect
block with its secrets as SecretStr, and one resolver that finds them.

`resolve(kind, block_name)` returns the saved block the spec names, else the same block built
from the environment variables that kind has always read, else None. The caller hands what it
gets to the one client that needs it (`auth_config` to docker-py, `client_kwargs` to boto3,
`environment()` to a child process: tritonserver, the MLflow download); nothing here writes the
running process's os.environ.

Example:
    >>> RegistryCredentials(username="ci", password="...").save("prod-registry")  # doctest: +SKIP
    and in the spec: `image: {credentials_block: prod-registry}`
    >>> resolve(RegistryCredentials, "prod-registry").auth_config("reg.example:5000")  # doctest: +SKIP
    {'username': 'ci', 'password': '...', 'serveraddress': 'reg.example:5000'}
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, ClassVar, TypedDict, TypeVar

from prefect.blocks.core import Block
from pydantic import SecretStr

from hf2triton.errors import Hf2TritonError, ModelStoreError, RegistryAuthError, SpecError

REGISTRY_USERNAME, REGISTRY_PASSWORD = "HF2TRITON_REGISTRY_USERNAME", "HF2TRITON_REGISTRY_PASSWORD"
MLFLOW_USERNAME, MLFLOW_PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
MLFLOW_TOKEN = "MLFLOW_TRACKING_TOKEN"
S3_ACCESS_KEY, S3_SECRET_KEY = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
S3_SESSION_TOKEN = "AWS_SESSION_TOKEN"  # temporary credentials (STS, IRSA)


def _secret(value: SecretStr | None) -> str | None:
    return value.get_secret_value() if value is not None else None


class _Kind:
    """What the resolver knows of one kind of secret; each block below sets these."""

    SPEC_KEY: ClassVar[str]  # where a spec names the block
    ERROR: ClassVar[type[Hf2TritonError]]  # what a missing block or missing credentials raise
    ENV_HINT: ClassVar[str]  # the environment variables, in words
    ENV_NAMES: ClassVar[tuple[str, ...]]  # every variable of this kind

    @classmethod
    def hint(cls) -> str:
        """How a user gives credentials of this kind, for the end of an error message."""
        return (f"set {cls.ENV_HINT}, or name a saved {cls.get_block_type_slug()} block in "  # type: ignore[attr-defined]
                f"{cls.SPEC_KEY}")

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Any:
        """The credentials the environment holds, None when it holds none."""
        raise NotImplementedError


class DockerAuth(TypedDict):
    """docker-py's `auth_config` for one registry."""

    username: str
    password: str
    serveraddress: str


class RegistryCredentials(_Kind, Block):
    """Credentials for the image registry, kept as a Prefect block; the password is a SecretStr.

    Example:
        >>> RegistryCredentials(username="ci", password="...").save("prod-registry")  # doctest: +SKIP
        and in the spec: `image: {credentials_block: prod-registry}`
    """

    _block_type_name = "hf2triton Registry Credentials"
    _block_type_slug = "hf2triton-registry-credentials"
    SPEC_KEY: ClassVar[str] = "image.credentials_block"
    ERROR: ClassVar[type[Hf2TritonError]] = RegistryAuthError
    ENV_HINT: ClassVar[str] = f"{REGISTRY_USERNAME} and {REGISTRY_PASSWORD}"
    ENV_NAMES: ClassVar[tuple[str, ...]] = (REGISTRY_USERNAME, REGISTRY_PASSWORD)
    username: str
    password: SecretStr

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> RegistryCredentials | None:
        """Both variables, or neither (an open registry); one alone is a mistake."""
        user, password = env.get(REGISTRY_USERNAME), env.get(REGISTRY_PASSWORD)
        if user and password:
            return cls(username=user, password=password)
        if user or password:
            raise RegistryAuthError(f"set both {REGISTRY_USERNAME} and {REGISTRY_PASSWORD}, or "
                                    f"neither (or name a saved block in {cls.SPEC_KEY})")
        return None

    def auth_config(self, registry: str) -> DockerAuth:
        return DockerAuth(username=self.username, password=self.password.get_secret_value(),
                          serveraddress=registry)


class MlflowCredentials(_Kind, Block):
    """Credentials of a remote MLflow registry, kept as a Prefect block (secrets as SecretStr):
    a user and password, or a token.

    Example:
        >>> MlflowCredentials(username="ci", password="...").save("team-mlflow")  # doctest: +SKIP
        and in the spec: `source: {mlflow: {model: ..., credentials_block: team-mlflow}}`
    """

    _block_type_name = "hf2triton MLflow Credentials"
    _block_type_slug = "hf2triton-mlflow-credentials"
    SPEC_KEY: ClassVar[str] = "source.mlflow.credentials_block"
    ERROR: ClassVar[type[Hf2TritonError]] = SpecError
    ENV_HINT: ClassVar[str] = f"{MLFLOW_USERNAME} and {MLFLOW_PASSWORD} (or {MLFLOW_TOKEN})"
    ENV_NAMES: ClassVar[tuple[str, ...]] = (MLFLOW_USERNAME, MLFLOW_PASSWORD, MLFLOW_TOKEN)
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> MlflowCredentials | None:
        user, password, token = (env.get(k) for k in cls.ENV_NAMES)
        if not (user or password or token):
            return None  # MLflow may still find ~/.mlflow/credentials itself
        return cls(username=user or None, password=password or None, token=token or None)

    def environment(self) -> dict[str, str]:
        """MLflow's variables for these credentials (MLflow reads them from nowhere else)."""
        values = {MLFLOW_USERNAME: self.username, MLFLOW_PASSWORD: _secret(self.password),
                  MLFLOW_TOKEN: _secret(self.token)}
        return {k: v for k, v in values.items() if v}


class S3Credentials(_Kind, Block):
    """Access key of an S3-compatible store, kept as a Prefect block; the secret is a SecretStr.

    Example:
        >>> S3Credentials(access_key_id="AKIA...", secret_access_key="...").save("models-s3")  # doctest: +SKIP
        and in the spec: `deploy: {model_store: {kind: s3, ..., credentials_block: models-s3}}`
    """

    _block_type_name = "hf2triton S3 Credentials"
    _block_type_slug = "hf2triton-s3-credentials"
    SPEC_KEY: ClassVar[str] = "deploy.model_store.credentials_block"
    ERROR: ClassVar[type[Hf2TritonError]] = ModelStoreError
    ENV_HINT: ClassVar[str] = f"{S3_ACCESS_KEY} and {S3_SECRET_KEY}"
    ENV_NAMES: ClassVar[tuple[str, ...]] = (S3_ACCESS_KEY, S3_SECRET_KEY, S3_SESSION_TOKEN)
    access_key_id: str
    secret_access_key: SecretStr
    session_token: SecretStr | None = None

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> S3Credentials:
        """The key pair of the environment; a store of kind s3 cannot be read without one."""
        key, secret = env.get(S3_ACCESS_KEY), env.get(S3_SECRET_KEY)
        if not (key and secret):
            raise ModelStoreError(f"deploy.model_store is s3 but has no credentials: "
                                  f"{cls.hint()}")
        return cls(access_key_id=key, secret_access_key=secret,
                   session_token=env.get(S3_SESSION_TOKEN) or None)

    def client_kwargs(self) -> dict[str, str | None]:
        """boto3.client(...)'s credential arguments."""
        return {"aws_access_key_id": self.access_key_id,
                "aws_secret_access_key": self.secret_access_key.get_secret_value(),
                "aws_session_token": _secret(self.session_token)}

    def environment(self) -> dict[str, str]:
        """What a process reading the store (tritonserver's s3:// repository) needs in its
        environment."""
        values = {S3_ACCESS_KEY: self.access_key_id,
                  S3_SECRET_KEY: self.secret_access_key.get_secret_value(),
                  S3_SESSION_TOKEN: _secret(self.session_token)}
        return {k: v for k, v in values.items() if v}


Credentials = TypeVar("Credentials", RegistryCredentials, MlflowCredentials, S3Credentials)


def resolve(kind: type[Credentials], block_name: str | None,
            env: Mapping[str, str] | None = None) -> Credentials | None:
    """The saved `kind` block named `block_name` (the spec's credentials_block), else `kind` from
    the environment (`env`, default os.environ, only read), else None.

    Raises `kind.ERROR` when the block is not saved, or the environment's are incomplete."""
    if block_name:
        try:
            return kind.load(block_name)
        except ValueError:
            raise kind.ERROR(
                f"{kind.SPEC_KEY} {block_name!r}: no saved {kind.get_block_type_slug()} block of "
                f"that name: save one ({kind.__name__}(...).save({block_name!r})), or remove "
                f"{kind.SPEC_KEY} and set {kind.ENV_HINT}") from None
    return kind.from_env(os.environ if env is None else env)


def child_environment(credentials: MlflowCredentials | S3Credentials | None,
                      kind: type[MlflowCredentials] | type[S3Credentials],
                      base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a child process that is to use `credentials`: `base` (default this
    process's) with every variable of `kind` replaced by the credentials' own, so another
    account's password never goes along with this one's token."""
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if k not in kind.ENV_NAMES}
    return {**env, **(credentials.environment() if credentials is not None else {})}
