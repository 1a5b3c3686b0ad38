"""Model store `s3`: the served repository in a bucket of an S3-compatible store, which Triton
reads itself (`--model-repository=s3://...`)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import Field, field_validator

from hf2triton.clients.credentials import S3Credentials, resolve
from hf2triton.errors import ModelStoreError, ServiceUnavailableError
from hf2triton.stores.base import STORES, ModelDir, ModelStore, _refuse
from hf2triton.util.specbase import matching, without_login
from hf2triton.util.workspace import hash_files, hash_mismatch

BUCKET_PATTERN = re.compile(r"^(?!.*\.\.)[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
# Triton parses s3://[http(s)://]host:port/bucket/path itself: the port is not optional, and
# path parts may hold only [0-9A-Za-z._-].
S3_ENDPOINT_PATTERN = re.compile(r"^https?://[A-Za-z0-9.-]+:[0-9]{1,5}$")
S3_PATH_PART = re.compile(r"^[0-9A-Za-z._-]+$")
RETRYABLE_CODES = (
    "SlowDown",
    "RequestTimeout",
    "RequestTimeTooSkewed",
    "Throttling",
    "ThrottlingException",
    "ServiceUnavailable",
    "InternalError",
)


@STORES.register
class S3Store(ModelStore):
    """A bucket of an S3-compatible store that Triton reads itself (`--model-repository=s3://`);
    every replica of a `triton-replicas` target reads the same bucket."""

    kind: Literal["s3"]
    shared: ClassVar[bool] = True
    endpoint: (
        Annotated[
            str,
            without_login("AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or a credentials_block"),
            matching(
                S3_ENDPOINT_PATTERN,
                (
                    "an endpoint URL such as 'http://127.0.0.1:9000' (scheme, host and port, "
                    "which Triton needs even for 80/443)"
                ),
            ),
        ]
        | None
    ) = Field(
        None, description="the store's URL, e.g. 'http://minio.internal:9000'; leave out for AWS S3"
    )
    bucket: Annotated[
        str,
        matching(
            BUCKET_PATTERN, "an S3 bucket name: 3 to 63 lower-case letters, digits, '.' and '-'"
        ),
    ] = Field(description="the bucket (it must exist)")
    prefix: str = Field("triton", description="the repository's folder in the bucket")
    region: str = Field("us-east-1", description="the bucket's region")
    credentials_block: str | None = Field(
        None,
        description="name of a saved hf2triton S3 Credentials Prefect block; without it "
        "$AWS_ACCESS_KEY_ID and $AWS_SECRET_ACCESS_KEY are used",
    )

    @field_validator("prefix")
    @classmethod
    def _check_prefix(cls, v: str) -> str:
        parts = v.strip("/").split("/")
        if v.strip("/") and any(p in (".", "..") or not S3_PATH_PART.match(p) for p in parts):
            raise ValueError(
                f"{v!r} is not a folder path in a bucket such as 'triton/prod': "
                "parts of letters, digits, '.', '_' and '-' (what Triton reads)"
            )
        return v.strip("/")

    def prepare(self) -> None:
        prepare_s3_repository(self)

    def triton_uri(self) -> str:
        """s3://[<endpoint>/]<bucket>/<prefix>, as Triton parses it."""
        path = "/".join(p for p in (self.bucket, self.prefix.strip("/")) if p)
        return f"s3://{self.endpoint}/{path}" if self.endpoint else f"s3://{path}"

    def storage_uri(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}".rstrip("/")

    def server_env(self) -> dict[str, str]:
        return {**s3_credentials(self).environment(), "AWS_DEFAULT_REGION": self.region}

    def model_dir(self, model_name: str, repository: str | None = None) -> ModelDir:
        return S3ModelDir(self, model_name)


def s3_credentials(store: S3Store) -> S3Credentials:
    """The store's key pair: the spec's Prefect block, else the environment (else an error)."""
    found = resolve(S3Credentials, store.credentials_block)
    assert found is not None  # S3Credentials.from_env raises rather than find none
    return found


def s3_client(store: S3Store) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3",
        endpoint_url=store.endpoint,
        region_name=store.region,
        **s3_credentials(store).client_kwargs(),
        config=Config(
            retries={"max_attempts": 3, "mode": "standard"}, connect_timeout=10, read_timeout=120
        ),
    )


class S3ModelDir:
    """A model directory at s3://<bucket>/<prefix>/<model>/ of an S3-compatible store.

    S3 has no rename: a version's files are uploaded, then read back and hashed; Triton loads only
    the versions the version policy in config.pbtxt lists, and the policy names the new version
    only after that check, so a half-uploaded version is never loaded.
    """

    def __init__(self, store: S3Store, model_name: str, client: Any = None):
        self.store = store
        self.name = model_name
        self.client = client or s3_client(store)
        parts = [p for p in (store.prefix.strip("/"), model_name) if p]
        self.root = "".join(f"{p}/" for p in parts)  # "" or "a/b/"

    def _call(self, what: str, fn, *args, **kwargs):
        """Run one S3 operation; its failure becomes a ModelStoreError (fix the store or the
        spec) or, for what a second try can fix, a ServiceUnavailableError (retried)."""
        from boto3.exceptions import S3UploadFailedError
        from botocore.exceptions import BotoCoreError, ClientError, EndpointConnectionError

        try:
            return fn(*args, **kwargs)
        except EndpointConnectionError as exc:
            raise ServiceUnavailableError(
                f"the model store {self.store.endpoint or 'AWS S3'} did not answer ({what}): {exc}"
            ) from None
        except S3UploadFailedError as exc:  # upload_file wraps the ClientError it met
            cause = exc.__cause__ or exc.__context__
            if isinstance(cause, ClientError):
                raise self._client_error(what, cause) from None
            raise ServiceUnavailableError(f"the model store failed {what}: {exc}") from None
        except ClientError as exc:
            raise self._client_error(what, exc) from None
        except BotoCoreError as exc:  # timeouts, dropped connections, broken streams
            raise ServiceUnavailableError(f"the model store failed {what}: {exc}") from None

    def _client_error(self, what: str, exc: Any) -> Exception:
        code = str(exc.response.get("Error", {}).get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code == "NoSuchBucket":
            return ModelStoreError(
                f"the model store has no bucket {self.store.bucket!r}: "
                "create it, or fix deploy.model_store.bucket"
            )
        if (
            code
            in (
                "AccessDenied",
                "InvalidAccessKeyId",
                "SignatureDoesNotMatch",
                "ExpiredToken",
                "InvalidToken",
                "403",
            )
            or status == 403
        ):
            return ModelStoreError(
                f"the model store refused the credentials ({code}) for "
                f"{what}: check the key pair of deploy.model_store"
            )
        if status >= 500 or code in RETRYABLE_CODES:
            return ServiceUnavailableError(f"the model store failed {what}: {code} {exc}")
        return ModelStoreError(f"the model store refused {what}: {code} {exc}")

    def _keys(self, prefix: str) -> list[str]:
        keys: list[str] = []
        token = None
        while True:
            kw = {"Bucket": self.store.bucket, "Prefix": prefix}
            if token:
                kw["ContinuationToken"] = token
            page = self._call(f"listing {prefix}", self.client.list_objects_v2, **kw)
            keys += [o["Key"] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return keys
            token = page["NextContinuationToken"]

    def _sha256(self, key: str) -> str:
        def read() -> str:
            body = self.client.get_object(Bucket=self.store.bucket, Key=key)["Body"]
            h = hashlib.sha256()
            for chunk in iter(lambda: body.read(1 << 20), b""):
                h.update(chunk)
            return h.hexdigest()

        return self._call(f"reading {key}", read)

    def _upload_tree(self, src: Path, prefix: str) -> None:
        for path in sorted(p for p in src.rglob("*") if p.is_file()):
            if "__pycache__" in path.parts:
                continue
            key = prefix + path.relative_to(src).as_posix()
            self._call(f"writing {key}", self.client.upload_file, str(path), self.store.bucket, key)

    def version_files(self, version: str) -> dict[str, str] | None:
        prefix = f"{self.root}{version}/"
        keys = [k for k in self._keys(prefix) if "/__pycache__/" not in k]
        if not keys:
            return None
        return {"1/" + k.removeprefix(prefix): self._sha256(k) for k in keys}

    def put_version(self, src_model: Path, version: str, expected: dict[str, str]) -> None:
        want = {k: v for k, v in expected.items() if k.startswith("1/")}
        local = {f"1/{k}": v for k, v in hash_files(src_model / "1").items()}
        if local != want:
            raise _refuse(hash_mismatch(local, want))
        self.remove_version(version)
        self._upload_tree(src_model / "1", f"{self.root}{version}/")
        stored = self.version_files(version)
        if stored != want:
            self.remove_version(version)
            raise _refuse(hash_mismatch(stored, want))
        for key in self._keys(f"{self.root}warmup/"):
            self._call(
                f"deleting {key}", self.client.delete_object, Bucket=self.store.bucket, Key=key
            )
        self._upload_tree(src_model / "warmup", f"{self.root}warmup/")
        self.write_config((src_model / "config.pbtxt").read_text())

    def read_config(self) -> str:
        key = f"{self.root}config.pbtxt"
        return self._call(
            f"reading {key}",
            lambda: (
                self.client.get_object(Bucket=self.store.bucket, Key=key)["Body"].read().decode()
            ),
        )

    def write_config(self, text: str) -> None:
        key = f"{self.root}config.pbtxt"
        self._call(
            f"writing {key}",
            self.client.put_object,
            Bucket=self.store.bucket,
            Key=key,
            Body=text.encode(),
        )

    def remove_version(self, version: str) -> None:
        for key in self._keys(f"{self.root}{version}/"):
            self._call(
                f"deleting {key}", self.client.delete_object, Bucket=self.store.bucket, Key=key
            )

    def versions(self) -> list[str]:
        page = self._call(
            f"listing {self.root}",
            self.client.list_objects_v2,
            Bucket=self.store.bucket,
            Prefix=self.root,
            Delimiter="/",
        )
        names = [
            p["Prefix"].removeprefix(self.root).strip("/") for p in page.get("CommonPrefixes", [])
        ]
        return sorted((n for n in names if n.isdigit()), key=int)


MARKER = ".hf2triton-repository"


def prepare_s3_repository(store: S3Store) -> None:
    """Check the bucket and credentials, and make the repository's folder exist: Triton refuses
    an s3:// repository path under which no object exists ("not a valid directory")."""
    models = S3ModelDir(store, "")
    root = models.root.rstrip("/")
    key = f"{root}/{MARKER}" if root else MARKER
    page = models._call(
        f"listing {root or 'the bucket'}",
        models.client.list_objects_v2,
        Bucket=store.bucket,
        Prefix=f"{root}/" if root else "",
        MaxKeys=1,
    )
    if not page.get("Contents"):
        models._call(
            f"writing {key}",
            models.client.put_object,
            Bucket=store.bucket,
            Key=key,
            Body=b"hf2triton model repository\n",
        )
