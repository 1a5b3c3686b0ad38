"""The candidate the gate chose, as one object: what the configuration search measures and the
repository serves, as the gate judged it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hf2triton.kinds.base import ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.release.export import Exported
from hf2triton.release.gate import GateResult


@dataclass(frozen=True)
class Shipped:
    """The candidate the gate chose, as one object: what was built and where it lives (`path`:
    a graph file, or a directory of them, beside the export's tokenizer and config in
    `export_dir`), how it is served (its kind, the kind's resolved `config` and the gate's
    `runtime`, serving.json's), and what the gate measured (`metrics`, and the reference's
    `info` the repository needs, such as an embedder's dimension)."""

    kind: ModelKind[KindConfig]
    name: str
    path: str
    export_dir: str
    config: KindConfig
    runtime: dict[str, Any] | None
    info: dict[str, Any]
    metrics: dict[str, float]

    @classmethod
    def judged(cls, kind: ModelKind[KindConfig], exp: Exported, val: GateResult) -> Shipped:
        """The candidate `val` (the gate's result) chose among the variants of `exp`."""
        return cls(
            kind=kind,
            name=val["chosen"],
            path=val["onnx_path"],
            export_dir=exp["export_dir"],
            config=kind.config_from_dict(exp["config"]),
            runtime=val.get("runtime"),
            info=val["info"],
            metrics=val["metrics"],
        )
