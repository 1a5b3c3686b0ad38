"""The release's kinds of secret (image registry, MLflow, S3 object store, the keys of the
OpenAI-compatible API): each a Prefect block with its secrets as SecretStr, and one resolver that
finds them.

`resolve(kind, block_name)` returns the saved block the spec names, else the same block built
from the environment variables that kind has always read, else None. The caller hands what it
gets to the one client that needs it (`auth_config` to docker-py, `client_kwargs` to boto3,
`environment()` to a child process: tritonserver, the MLflow download); nothing here writes the
running process's os.environ.

Example:
    >>> RegistryCredentials(username="ci", password="...").save("prod-registry")  # doctest: +SKIP
    and in the spec: `image: {credentials_block: prod-registry}`
    >>> resolve(RegistryCredentials, "prod-registry").auth_config("reg.example:5000")  # doctest:
    +SKIP {'username': 'ci', 'password': '...', 'serveraddress': 'reg.example:5000'}
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypedDict, TypeVar, cast

from prefect.blocks.core import Block
from pydantic import SecretStr

from hf2triton.errors import Hf2TritonError, ModelStoreError, RegistryAuthError, SpecError

REGISTRY_USERNAME, REGISTRY_PASSWORD = "HF2TRITON_REGISTRY_USERNAME", "HF2TRITON_REGISTRY_PASSWORD"
MLFLOW_USERNAME, MLFLOW_PASSWORD = "MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD"
MLFLOW_TOKEN = "MLFLOW_TRACKING_TOKEN"
S3_ACCESS_KEY, S3_SECRET_KEY = "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"
S3_SESSION_TOKEN = "AWS_SESSION_TOKEN"  # temporary credentials (STS, IRSA)
OPENAI_API_KEYS = "HF2TRITON_OPENAI_API_KEYS"  # comma-separated


def _secret(value: SecretStr | str | None) -> str | None:
    return value.get_secret_value() if isinstance(value, SecretStr) else value


@dataclass(frozen=True)
class Kind:
    """What the resolver knows of one kind of secret; each block below holds one as KIND."""

    spec_key: str  # where a spec names the block
    error: type[Hf2TritonError]  # what a missing block, or missing credentials, raise
    env: dict[str, str]  # environment variable -> the block's field
    env_hint: str  # the environment variables, in words
    needed_by: str | None = None  # who cannot do without credentials (None: none is fine)


class _Credentials:
    """The behaviour the three blocks share, driven by their KIND."""

    KIND: ClassVar[Kind]

    @classmethod
    def hint(cls) -> str:
        """How a user gives credentials of this kind, for the end of an error message."""
        slug = cls.get_block_type_slug()  # type: ignore[attr-defined]
        return f"set {cls.KIND.env_hint}, or name a saved {slug} block in {cls.KIND.spec_key}"

    @classmethod
    def from_env(cls, env: Mapping[str, str]) -> Any:
        """The credentials `env` holds; None when it holds none and none are needed. The
        block's required fields come together or not at all."""
        given = {field: env[k] for k, field in cls.KIND.env.items() if env.get(k)}
        if not given:
            if cls.KIND.needed_by:
                raise cls.KIND.error(f"{cls.KIND.needed_by} but has no credentials: {cls.hint()}")
            return None
        fields = cls.model_fields  # type: ignore[attr-defined]
        missing = [k for k, f in cls.KIND.env.items() if fields[f].is_required() and f not in given]
        if missing:
            present = [k for k, f in cls.KIND.env.items() if f in given]
            raise cls.KIND.error(
                f"{' and '.join(missing)} is not set, but "
                f"{' and '.join(present)} {'is' if len(present) == 1 else 'are'}"
                f": {cls.hint()}"
            )
        return cls(**given)

    def environment(self) -> dict[str, str]:
        """These credentials as the environment variables of this kind (those given)."""
        values = {k: _secret(getattr(self, field)) for k, field in self.KIND.env.items()}
        return {k: v for k, v in values.items() if v}


class DockerAuth(TypedDict):
    """docker-py's `auth_config` for one registry."""

    username: str
    password: str
    serveraddress: str


class RegistryCredentials(_Credentials, Block):
    """Credentials for the image registry, kept as a Prefect block; the password is a SecretStr.

    Example:
        >>> RegistryCredentials(username="ci", password="...").save("prod-registry")  # doctest:
        +SKIP and in the spec: `image: {credentials_block: prod-registry}`
    """

    _block_type_name = "hf2triton Registry Credentials"
    _block_type_slug = "hf2triton-registry-credentials"
    KIND: ClassVar[Kind] = Kind(
        "image.credentials_block",
        RegistryAuthError,
        {REGISTRY_USERNAME: "username", REGISTRY_PASSWORD: "password"},
        f"{REGISTRY_USERNAME} and {REGISTRY_PASSWORD}",
    )  # neither: an open registry
    username: str
    password: SecretStr

    def auth_config(self, registry: str) -> DockerAuth:
        return DockerAuth(
            username=self.username,
            password=self.password.get_secret_value(),
            serveraddress=registry,
        )


class MlflowCredentials(_Credentials, Block):
    """Credentials of a remote MLflow registry, kept as a Prefect block (secrets as SecretStr):
    a user and password, or a token.

    Example:
        >>> MlflowCredentials(username="ci", password="...").save("team-mlflow")  # doctest: +SKIP
        and in the spec: `source: {mlflow: {model: ..., credentials_block: team-mlflow}}`
    """

    _block_type_name = "hf2triton MLflow Credentials"
    _block_type_slug = "hf2triton-mlflow-credentials"
    # MLflow takes these from `environment()` (a child process's) only.
    # None from the environment: MLflow may still find ~/.mlflow/credentials itself.
    KIND: ClassVar[Kind] = Kind(
        "source.mlflow.credentials_block",
        SpecError,
        {MLFLOW_USERNAME: "username", MLFLOW_PASSWORD: "password", MLFLOW_TOKEN: "token"},
        f"{MLFLOW_USERNAME} and {MLFLOW_PASSWORD} (or {MLFLOW_TOKEN})",
    )
    username: str | None = None
    password: SecretStr | None = None
    token: SecretStr | None = None


class S3Credentials(_Credentials, Block):
    """Access key of an S3-compatible store, kept as a Prefect block; the secret is a SecretStr.

    Example:
        >>> S3Credentials(access_key_id="AKIA...", secret_access_key="...").save("models-s3")  #
        doctest: +SKIP and in the spec: `deploy: {model_store: {kind: s3, ..., credentials_block:
        models-s3}}`
    """

    _block_type_name = "hf2triton S3 Credentials"
    _block_type_slug = "hf2triton-s3-credentials"
    # boto3 takes `client_kwargs()`; a tritonserver reading s3:// `environment()`.
    KIND: ClassVar[Kind] = Kind(
        "deploy.model_store.credentials_block",
        ModelStoreError,
        {
            S3_ACCESS_KEY: "access_key_id",
            S3_SECRET_KEY: "secret_access_key",
            S3_SESSION_TOKEN: "session_token",
        },
        f"{S3_ACCESS_KEY} and {S3_SECRET_KEY}",
        needed_by="deploy.model_store is s3",
    )
    access_key_id: str
    secret_access_key: SecretStr
    session_token: SecretStr | None = None

    def client_kwargs(self) -> dict[str, str | None]:
        """boto3.client(...)'s credential arguments."""
        return {
            "aws_access_key_id": self.access_key_id,
            "aws_secret_access_key": self.secret_access_key.get_secret_value(),
            "aws_session_token": _secret(self.session_token),
        }


class ApiKeys(_Credentials, Block):
    """The bearer keys the OpenAI-compatible API accepts (comma-separated), kept as a Prefect
    block; the keys are a SecretStr. Only their sha256 hashes leave this process (to the API
    server, which compares a request's key's hash with each in constant time).

    Example:
        >>> ApiKeys(keys="sk-team-a,sk-team-b").save("serving-keys")  # doctest: +SKIP
        and in the spec: `deploy: {openai: {credentials_block: serving-keys}}`
    """

    _block_type_name = "hf2triton API Keys"
    _block_type_slug = "hf2triton-api-keys"
    KIND: ClassVar[Kind] = Kind(  # neither: the API takes requests without a key
        "deploy.openai.credentials_block", SpecError, {OPENAI_API_KEYS: "keys"}, OPENAI_API_KEYS
    )
    keys: SecretStr

    def hashes(self) -> list[str]:
        """sha256 (hex) of each key: what the API server is given."""
        return sorted(
            {
                hashlib.sha256(k.strip().encode()).hexdigest()
                for k in self.keys.get_secret_value().split(",")
                if k.strip()
            }
        )


Credentials = TypeVar("Credentials", RegistryCredentials, MlflowCredentials, S3Credentials, ApiKeys)


def resolve(
    kind: type[Credentials], block_name: str | None, env: Mapping[str, str] | None = None
) -> Credentials | None:
    """The saved `kind` block named `block_name` (the spec's credentials_block), else `kind` from
    the environment (`env`, default os.environ, only read), else None.

    Raises `kind.KIND.error` when the block is not saved, or the environment's are
    incomplete."""
    if block_name:
        try:
            # Prefect's load answers a coroutine only inside an event loop; this is sync code.
            return cast(Credentials, kind.load(block_name))
        except ValueError:
            key = kind.KIND.spec_key
            raise kind.KIND.error(
                f"{key} {block_name!r}: no saved {kind.get_block_type_slug()} block of that name: "
                f"save one ({kind.__name__}(...).save({block_name!r})), or remove {key} and set "
                f"{kind.KIND.env_hint}"
            ) from None
    return kind.from_env(os.environ if env is None else env)


def child_environment(
    credentials: MlflowCredentials | S3Credentials | None,
    kind: type[MlflowCredentials] | type[S3Credentials],
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment for a child process that is to use `credentials`: `base` (default this
    process's) with every variable of `kind` replaced by the credentials' own, so another
    account's password never goes along with this one's token."""
    env = {
        k: v for k, v in (os.environ if base is None else base).items() if k not in kind.KIND.env
    }
    return {**env, **(credentials.environment() if credentials is not None else {})}
