"""Source `repo_id`: a Hugging Face Hub repository at a pinned revision, downloaded (or found in
the local hub cache) with only the files a release reads."""

from __future__ import annotations

import re
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from hf2triton.errors import ServiceUnavailableError, SourceError
from hf2triton.sources.base import SOURCES, Source

# Hub repos often carry the same weights for other frameworks; we only read these.
HUB_PATTERNS = ["*.json", "*.safetensors", "*.bin", "*.txt", "*.model", "*.spm", "1_Pooling/*"]
HUB_IGNORE = [
    "onnx/*",
    "openvino/*",
    "*.onnx",
    "tf_model*",
    "flax_model*",
    "rust_model*",
    "*.msgpack",
    "*.h5",
    "coreml/*",
    "training_args.bin",
    "optimizer*",
    "*.pt",
]


@SOURCES.register
class HubSource(Source):
    """A Hugging Face hub repository at a pinned revision."""

    key = "repo_id"
    name = "hub"

    repo_id: str = Field(description="Hugging Face hub id, e.g. org/model")
    revision: str | None = Field(
        None,
        description="hub branch, tag or commit to pin (so the release is reproducible); required",
    )

    @field_validator("repo_id")
    @classmethod
    def _check_repo_id(cls, v: str) -> str:
        if not re.match(r"^[\w.-]+(/[\w.-]+)?$", v):
            raise ValueError(f"{v!r} is not a Hugging Face hub id such as 'org/model'")
        return v

    @model_validator(mode="after")
    def _pinned(self) -> HubSource:
        if not self.revision:
            raise ValueError(
                f"repo_id {self.repo_id!r} needs a revision (a commit, tag or "
                "branch) so the release is reproducible"
            )
        return self

    def locate(self) -> tuple[Path, str | None]:
        model_dir = snapshot(self.repo_id, str(self.revision))
        # snapshot_download returns .../snapshots/<commit>: the revision it resolved to.
        return model_dir, model_dir.name


def snapshot(repo_id: str, revision: str) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        # The token, if any, comes from HF_TOKEN or the huggingface_hub login; never logged.
        return Path(
            snapshot_download(
                repo_id, revision=revision, allow_patterns=HUB_PATTERNS, ignore_patterns=HUB_IGNORE
            )
        )
    except RevisionNotFoundError:
        raise SourceError(f"hub repo {repo_id!r} has no revision {revision!r}") from None
    except GatedRepoError:
        raise SourceError(
            f"hub repo {repo_id!r} is gated: accept its terms and set HF_TOKEN"
        ) from None
    except RepositoryNotFoundError:
        raise SourceError(
            f"hub repo {repo_id!r} does not exist or is private (set HF_TOKEN if it is yours)"
        ) from None
    except LocalEntryNotFoundError:
        raise ServiceUnavailableError(
            f"cannot reach the Hugging Face hub for {repo_id}@{revision} and it is not in the "
            "local cache: check the network (or HF_HUB_OFFLINE) and run again"
        ) from None
