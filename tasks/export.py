"""Step `export`: the kind's config resolved from the model's own files, then the optimum-onnx
export checked against PyTorch on real validation inputs (hf2triton.release.export)."""

from __future__ import annotations

from prefect import task

from hf2triton.release.export import export_model, export_without_graph
from hf2triton.release.results import Exported, ReleaseContext
from hf2triton.sources import FetchResult
from hf2triton.spec import ExportSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse

__all__ = ["Exported", "export"]


@task(name="export", task_run_name="export {ctx.kind.name}", **NO_PREFECT_CACHE)
def export(ctx: ReleaseContext, src: FetchResult, spec: ExportSpec) -> Exported:
    """Export the fetched model for the release's kind; fails when the graph disagrees with
    PyTorch. Where no runtime tried reads an ONNX graph, none is exported: the kind's files
    beside it (its tokenizer) are written and checked."""
    cfg = ctx.kind.resolve(src["model_dir"])
    if ctx.runtimes.read_export():
        result = export_model(ctx.kind, src, spec, cfg, ctx.data, ctx.work)
    else:
        result = export_without_graph(ctx.kind, src, cfg, ctx.data, ctx.work)
    note_reuse("export", result)
    return Exported(**result, config=cfg.to_dict())
