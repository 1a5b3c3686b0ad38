"""Where Triton's model repository lives: a local directory, or a bucket of an S3-compatible store.

The deploy step works on one model's directory of the repository (`ModelDir`): put a version in
(every file's sha256 checked against the release's record), pin the version policy in
`config.pbtxt`, remove a version, list versions. `LocalModelDir` does that on a filesystem path;
`S3ModelDir` on `s3://<bucket>/<prefix>/<model>/`, which Triton reads itself when started with
`--model-repository=s3://<endpoint>/<bucket>/<prefix>` and the store's credentials in its
environment.

Credentials come from hf2triton.credentials (an `S3Credentials` block named in the spec, or
`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`); they are never logged, written to the server's
state file or recorded in MLflow.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any, Protocol

from hf2triton.credentials import S3Credentials, resolve
from hf2triton.errors import ArtifactError, ModelStoreError, ServiceUnavailableError
from hf2triton.spec import ModelStoreSpec
from hf2triton.workspace import atomic_write_text, hash_files

RETRYABLE_CODES = ("SlowDown", "RequestTimeout", "RequestTimeTooSkewed", "Throttling",
                   "ThrottlingException", "ServiceUnavailable", "InternalError")


class ModelDir(Protocol):
    """One model's directory of a Triton model repository."""

    name: str

    def version_files(self, version: str) -> dict[str, str] | None:
        """sha256 of each file of `version` as stored ('1/<file>' keys), None if absent."""

    def put_version(self, src_model: Path, version: str, expected: dict[str, str]) -> None:
        """Write `src_model`'s version 1 as `version` (replacing what is stored under it), its
        warmup/ and config.pbtxt; every file of the version checked against `expected`
        ('1/<file>' keys) as stored."""

    def read_config(self) -> str: ...

    def write_config(self, text: str) -> None: ...

    def remove_version(self, version: str) -> None: ...

    def versions(self) -> list[str]: ...


def _mismatch(got: dict[str, str] | None, want: dict[str, str]) -> list[str]:
    got = got or {}
    return sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))


def _refuse(bad: list[str]) -> ArtifactError:
    return ArtifactError(
        f"model files {bad} do not match the sha256 recorded for this release: refusing to "
        "deploy them; re-run the release to rebuild the repository"
    )


class LocalModelDir:
    """A model directory on this machine's filesystem (the local server's, or a replica's mount)."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.name = self.path.name

    def version_files(self, version: str) -> dict[str, str] | None:
        vdir = self.path / version
        if not vdir.is_dir():
            return None
        return {f"1/{k}": v for k, v in hash_files(vdir).items()}

    def put_version(self, src_model: Path, version: str, expected: dict[str, str]) -> None:
        self.path.mkdir(parents=True, exist_ok=True)
        tmp = self.path / f".{version}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.copytree(src_model / "1", tmp)
        got = {f"1/{k}": v for k, v in hash_files(tmp).items()}
        want = {k: v for k, v in expected.items() if k.startswith("1/")}
        if got != want:
            shutil.rmtree(tmp, ignore_errors=True)
            raise _refuse(_mismatch(got, want))
        shutil.rmtree(self.path / version, ignore_errors=True)
        os.rename(tmp, self.path / version)
        staged = self.path / ".warmup.new"
        shutil.rmtree(staged, ignore_errors=True)
        shutil.copytree(src_model / "warmup", staged)
        shutil.rmtree(self.path / "warmup", ignore_errors=True)
        os.rename(staged, self.path / "warmup")
        shutil.copyfile(src_model / "config.pbtxt", self.path / ".config.pbtxt.new")
        os.replace(self.path / ".config.pbtxt.new", self.path / "config.pbtxt")

    def read_config(self) -> str:
        return (self.path / "config.pbtxt").read_text()

    def write_config(self, text: str) -> None:
        atomic_write_text(self.path / "config.pbtxt", text)

    def remove_version(self, version: str) -> None:
        shutil.rmtree(self.path / version, ignore_errors=True)

    def versions(self) -> list[str]:
        if not self.path.is_dir():
            return []
        return sorted((p.name for p in self.path.iterdir() if p.name.isdigit() and p.is_dir()),
                      key=int)


def s3_credentials(store: ModelStoreSpec) -> S3Credentials:
    """The store's key pair: the spec's Prefect block, else the environment (else an error)."""
    found = resolve(S3Credentials, store.credentials_block)
    assert found is not None  # S3Credentials.from_env raises rather than find none
    return found


def server_env(store: ModelStoreSpec) -> dict[str, str]:
    """What a tritonserver reading the store needs in its environment (credentials included)."""
    if store.kind != "s3":
        return {}
    return {**s3_credentials(store).environment(), "AWS_DEFAULT_REGION": store.region}


def s3_client(store: ModelStoreSpec) -> Any:
    import boto3
    from botocore.config import Config

    return boto3.client(
        "s3", endpoint_url=store.endpoint, region_name=store.region,
        **s3_credentials(store).client_kwargs(),
        config=Config(retries={"max_attempts": 3, "mode": "standard"},
                      connect_timeout=10, read_timeout=120),
    )


class S3ModelDir:
    """A model directory at s3://<bucket>/<prefix>/<model>/ of an S3-compatible store.

    S3 has no rename: a version's files are uploaded, then read back and hashed; Triton loads only
    the versions the version policy in config.pbtxt lists, and the policy names the new version
    only after that check, so a half-uploaded version is never loaded.
    """

    def __init__(self, store: ModelStoreSpec, model_name: str, client: Any = None):
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
                f"the model store {self.store.endpoint or 'AWS S3'} did not answer ({what}): "
                f"{exc}"
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
            return ModelStoreError(f"the model store has no bucket {self.store.bucket!r}: "
                                   "create it, or fix deploy.model_store.bucket")
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch",
                    "ExpiredToken", "InvalidToken", "403") or status == 403:
            return ModelStoreError(f"the model store refused the credentials ({code}) for "
                                   f"{what}: check the key pair of deploy.model_store")
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
            self._call(f"writing {key}", self.client.upload_file, str(path), self.store.bucket,
                       key)

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
            raise _refuse(_mismatch(local, want))
        self.remove_version(version)
        self._upload_tree(src_model / "1", f"{self.root}{version}/")
        stored = self.version_files(version)
        if stored != want:
            self.remove_version(version)
            raise _refuse(_mismatch(stored, want))
        for key in self._keys(f"{self.root}warmup/"):
            self._call(f"deleting {key}", self.client.delete_object, Bucket=self.store.bucket,
                       Key=key)
        self._upload_tree(src_model / "warmup", f"{self.root}warmup/")
        self.write_config((src_model / "config.pbtxt").read_text())

    def read_config(self) -> str:
        key = f"{self.root}config.pbtxt"
        return self._call(f"reading {key}", lambda: self.client.get_object(
            Bucket=self.store.bucket, Key=key)["Body"].read().decode())

    def write_config(self, text: str) -> None:
        key = f"{self.root}config.pbtxt"
        self._call(f"writing {key}", self.client.put_object, Bucket=self.store.bucket, Key=key,
                   Body=text.encode())

    def remove_version(self, version: str) -> None:
        for key in self._keys(f"{self.root}{version}/"):
            self._call(f"deleting {key}", self.client.delete_object, Bucket=self.store.bucket,
                       Key=key)

    def versions(self) -> list[str]:
        page = self._call(f"listing {self.root}", self.client.list_objects_v2,
                          Bucket=self.store.bucket, Prefix=self.root, Delimiter="/")
        names = [p["Prefix"].removeprefix(self.root).strip("/")
                 for p in page.get("CommonPrefixes", [])]
        return sorted((n for n in names if n.isdigit()), key=int)


MARKER = ".hf2triton-repository"


def prepare_s3_repository(store: ModelStoreSpec) -> None:
    """Check the bucket and credentials, and make the repository's folder exist: Triton refuses
    an s3:// repository path under which no object exists ("not a valid directory")."""
    models = S3ModelDir(store, "")
    root = models.root.rstrip("/")
    key = f"{root}/{MARKER}" if root else MARKER
    page = models._call(f"listing {root or 'the bucket'}", models.client.list_objects_v2,
                        Bucket=store.bucket, Prefix=f"{root}/" if root else "", MaxKeys=1)
    if not page.get("Contents"):
        models._call(f"writing {key}", models.client.put_object, Bucket=store.bucket, Key=key,
                     Body=b"hf2triton model repository\n")


def triton_uri(store: ModelStoreSpec) -> str:
    """The --model-repository Triton reads the store from: s3://[<endpoint>/]<bucket>/<prefix>."""
    path = "/".join(p for p in (store.bucket, store.prefix.strip("/")) if p)
    return f"s3://{store.endpoint}/{path}" if store.endpoint else f"s3://{path}"


def model_dir(repository: str, model_name: str, store: ModelStoreSpec | None = None) -> ModelDir:
    """The model's directory in `repository`: the store's bucket when the repository is s3://."""
    if repository.startswith("s3://"):
        if store is None or store.kind != "s3":
            raise ModelStoreError(f"the model repository {repository} is in S3, but no "
                              "deploy.model_store of kind s3 describes it")
        return S3ModelDir(store, model_name)
    return LocalModelDir(Path(repository) / model_name)
