"""The building blocks every spec section is made of: the strict pydantic base, paths relative
to the spec file, names valid everywhere a release name goes, and the small value types.

Plug-ins (kinds, deploy targets, model stores) define their own sections from these, in their
own modules; `hf2triton.spec` assembles the release spec from the plug-in registries.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Annotated, TypeVar

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo

# One name serves as MLflow model name, Docker tag part and Triton model directory, so it must be
# valid for all three: lower case, no path separators, no spaces, no "..".
NAME_PATTERN = re.compile(r"^[a-z0-9](?:[a-z0-9_-]|\.(?!\.)){0,62}$")

Probability = Annotated[float, Field(ge=-1.0, le=1.0)]


class Strict(BaseModel):
    """A spec section: unknown keys are refused, values are frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def check_name(value: str) -> str:
    if not NAME_PATTERN.match(value):
        raise ValueError(
            f"{value!r} is not a valid name: use 1-63 characters of lower-case letters, digits, "
            "'-', '_' and '.', starting with a letter or digit, without '..' "
            "(it becomes the MLflow model name, a Docker tag and a Triton model directory)"
        )
    return value


def resolve_path(path: str, info: ValidationInfo) -> str:
    """`path` relative to the spec file's folder (the validation context's `base_dir`)."""
    base = (info.context or {}).get("base_dir")
    p = Path(path).expanduser()
    if not p.is_absolute() and base is not None:
        p = Path(base) / p
    return os.path.normpath(p)


def matching(pattern: re.Pattern[str], what: str) -> AfterValidator:
    """A validator refusing values that do not match `pattern`, saying what they should be."""

    def check(value: str | None) -> str | None:
        if value is not None and not pattern.match(value):
            raise ValueError(f"{value!r} is not {what}")
        return value

    return AfterValidator(check)


def without_login(where: str) -> BeforeValidator:
    """A validator refusing a URI with a user or password in it (the spec is recorded with
    the release), saying to give the credentials in `where` instead."""
    from hf2triton.util.workspace import has_login

    def check(value: object) -> object:
        if isinstance(value, str) and has_login(value):
            raise ValueError(
                "a user or password in the URI would be recorded with the spec: give the URI "
                f"without it, and the credentials in {where}"
            )
        return value

    return BeforeValidator(check)


V = TypeVar("V")


def unless(problem: bool, value: V, message: str) -> V:
    """`value` when there is no problem; a validation error with `message` when there is."""
    if problem:
        raise ValueError(message)
    return value


def first_line(doc: str | None) -> str:
    """A model's docstring as one line, for a field description."""
    return " ".join((doc or "").strip().split("\n\n")[0].split())


# A file or folder named in a spec: relative paths are relative to the spec file.
SpecPath = Annotated[str, AfterValidator(resolve_path)]
# A truncation length in tokens; None: the model's own.
MaxLength = Annotated[int | None, Field(ge=1, le=8192)]
Name = Annotated[str, AfterValidator(check_name)]
