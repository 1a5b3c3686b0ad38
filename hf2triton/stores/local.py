"""Model store `local`: the served repository is a folder on this machine (the local server's,
or a replica's mount)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Literal

from hf2triton.errors import ModelStoreError
from hf2triton.stores.base import STORES, ModelDir, ModelStore, _refuse
from hf2triton.util.workspace import atomic_write_text, hash_files, hash_mismatch


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
            raise _refuse(hash_mismatch(got, want))
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
        return sorted(
            (p.name for p in self.path.iterdir() if p.name.isdigit() and p.is_dir()), key=int
        )


@STORES.register
class LocalStore(ModelStore):
    """The local server's own directory, or each replica's `model_repository`."""

    kind: Literal["local"] = "local"

    def model_dir(self, model_name: str, repository: str | None = None) -> ModelDir:
        if repository is None or repository.startswith("s3://"):
            raise ModelStoreError(
                f"the model repository {repository} is not a folder on this machine, but "
                "deploy.model_store is local: set deploy.model_store kind s3 to describe it"
            )
        return LocalModelDir(Path(repository) / model_name)
