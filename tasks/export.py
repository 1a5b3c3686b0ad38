"""Step `export`: the kind's config resolved from the model's own files, then the optimum-onnx
export checked against PyTorch on real validation inputs (hf2triton.release.export)."""

from __future__ import annotations

from typing import Any

from prefect import task

from hf2triton.kinds import Data, ModelKind
from hf2triton.release.export import ExportResult, export_model
from hf2triton.sources import FetchResult
from hf2triton.spec import ExportSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse


class Exported(ExportResult):
    config: dict[str, Any]  # the kind's resolved config (to_dict())


@task(name="export", task_run_name="export {kind.name}", **NO_PREFECT_CACHE)
def export(kind: ModelKind, src: FetchResult, spec: ExportSpec, data: Data, work: str) -> Exported:
    """Export the fetched model for `kind`; fails when the graph disagrees with PyTorch."""
    cfg = kind.resolve(src["model_dir"])
    result = export_model(
        kind, src["model_dir"], src["content_hash"], spec.opset, spec.atol, cfg, data, work
    )
    note_reuse("export", result)
    return Exported(**result, config=cfg.to_dict())
