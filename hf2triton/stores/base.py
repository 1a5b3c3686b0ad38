"""What every model store offers the deploy targets: a model's directory in the served
repository (`ModelDir`), and the store itself as a spec section with behaviour (`ModelStore`):
prepare it, the URI Triton loads it from, the environment a server reading it needs."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar, Protocol

from hf2triton.errors import ArtifactError
from hf2triton.util import plugins
from hf2triton.util.specbase import Strict


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


def _refuse(bad: list[str]) -> ArtifactError:
    return ArtifactError(
        f"model files {bad} do not match the sha256 recorded for this release: refusing to "
        "deploy them; re-run the release to rebuild the repository"
    )


class ModelStore(Strict):
    """A `deploy.model_store` section, chosen once from the spec by its `kind`; the targets ask
    it, never its kind."""

    kind: str
    # Replicas read this one store (a bucket), not each its own folder on this machine.
    shared: ClassVar[bool] = False

    def prepare(self) -> None:
        """Make the store ready for a server to read (it exists, the credentials work)."""

    def triton_uri(self) -> str | None:
        """What a server's --model-repository names to read the store; None: the server's own
        local folder."""
        return None

    def storage_uri(self) -> str | None:
        """Where a cluster (KServe's storage initializer) downloads the repository from."""
        return None

    def server_env(self) -> dict[str, str]:
        """What a tritonserver reading the store needs in its environment."""
        return {}

    def model_dir(self, model_name: str, repository: str | None = None) -> ModelDir:
        """The model's directory; `repository` is a server's local folder where the store has
        none of its own."""
        raise NotImplementedError

    def put_version(
        self,
        src_repository: str,
        model_name: str,
        version: str,
        expected: dict[str, str],
        repository: str | None = None,
    ) -> None:
        self.model_dir(model_name, repository).put_version(
            Path(src_repository) / model_name, version, expected
        )

    def describe(self) -> dict[str, Any]:
        """The section as a deployment's state keeps it (no credentials)."""
        return self.model_dump()


# deploy.model_store `kind:` -> the store's class; each store's module registers it where it is
# defined (`@STORES.register`), and hf2triton.stores imports the modules.
STORES = plugins.Registry(lambda cls: plugins.tag_of(cls, "kind"), default="local")
