"""The data between the release's steps, named and typed: what the flow settles once before any
step (`ReleaseContext`), what each step returns (`Exported`, `GateResult`, `TuneResult`,
`RepositoryResult`, `RegisterResult`, ...), the candidate the gate chose as one object
(`Shipped`), and the steps up to the Triton repository together (`Built`) and the served
release (`Served`). A step takes these and the spec section it needs, never an untyped bag.

Example:
    >>> ctx = ReleaseContext(kind, data, runtimes, work)   # chosen once, in the flow
    >>> shipped = Shipped.judged(kind, exp, val)           # the gate's choice, as one object
    >>> shipped.path, shipped.runtime
    ('.../quantize/.../model.onnx', {'name': 'onnxruntime', 'device': 'cpu', ...})
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, NamedTuple, TypedDict

from hf2triton.kinds.base import Data, ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.release.export import Exported
from hf2triton.release.gate import GateResult
from hf2triton.release.repository import RepositoryResult
from hf2triton.release.shipped import Shipped
from hf2triton.release.tuning import TuneResult
from hf2triton.runtimes import RuntimeChoices, Variant
from hf2triton.sources import FetchResult
from hf2triton.targets import Deployment


class RegisterResult(TypedDict):
    """Step `register`'s result: the MLflow version that carries the release record."""

    tracking_uri: str
    model_name: str
    version: str
    run_id: str
    experiment_id: str
    reused: bool


@dataclass(frozen=True)
class ReleaseContext:
    """What the flow settles once, before any step: the model kind (from the spec's `task`),
    its validation data (read first: bad data fails before any work), the runtimes this machine
    can try, and the release's work directory."""

    kind: ModelKind[KindConfig]
    data: Data
    runtimes: RuntimeChoices
    work: str


class Built(NamedTuple):
    """What the steps up to the Triton repository return (`release-model` and `render-release`
    share them)."""

    src: FetchResult
    exp: Exported
    variants: list[Variant]
    val: GateResult
    tuned: TuneResult | None
    repo: RepositoryResult


class Served(NamedTuple):
    """What the steps after the repository return: the registered version, its image, where it
    serves and what the smoke test measured there."""

    reg: RegisterResult
    image: dict[str, Any]
    deployment: Deployment
    endpoint: dict[str, Any]  # the target's own summary of where it serves
    smoke: dict[str, float]


__all__ = [
    "Built",
    "Exported",
    "GateResult",
    "RegisterResult",
    "ReleaseContext",
    "RepositoryResult",
    "Served",
    "Shipped",
    "TuneResult",
]
