"""ONNX export with optimum-onnx (dynamic batch and sequence axes), then a check of the graph
against PyTorch on real validation inputs (not dummy ones); a mismatch fails the step. What the
check compares is the model kind's (token states, logits, encoder states and greedy output).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any, TypedDict

from hf2triton.errors import ExportError, UnsupportedModelError
from hf2triton.kinds.base import Data, ModelKind, to_json
from hf2triton.kinds.config import KindConfig
from hf2triton.sources import FetchResult
from hf2triton.spec import ExportSpec
from hf2triton.util import quiet
from hf2triton.util.isolated import run_isolated
from hf2triton.util.workspace import (
    SpaceEstimate,
    StepOutput,
    cached_step,
    digest,
    fp32_weights,
    sha256_module,
)


class ExportResult(TypedDict):
    onnx_path: str  # the exported model: a file, or for seq2seq the directory of its files
    export_dir: str
    opset: int
    max_abs_diff: float
    checked: int
    seconds: float
    reused: bool


class Exported(ExportResult):
    """Step `export`'s result: the checked ONNX export and the kind's config resolved from the
    model's own files (its `to_dict()`, as the cached step stores it)."""

    config: dict[str, Any]


def candidate_path(kind: ModelKind[KindConfig], directory: str | Path) -> str:
    """What a variant of this kind is: its one ONNX file, or (seq2seq) its directory."""
    return str(Path(directory) / "model.onnx") if kind.main_file == "model.onnx" else str(directory)


# How many fp32 copies of the weights an export writes, by optimum task (others: one graph): a
# seq2seq export with past writes the encoder, the decoder and the decoder with past again.
WEIGHT_COPIES = {
    "text2text-generation-with-past": 2.0,
    "automatic-speech-recognition-with-past": 2.0,
}


def export_space(kind: ModelKind[KindConfig], model_dir: str) -> SpaceEstimate:
    """About what an export of `model_dir` writes: its weights as fp32, once per graph."""
    size, basis = fp32_weights(model_dir)
    basis = f"{basis} ONNX"
    copies = WEIGHT_COPIES.get(kind.onnx_task, 1.0)
    if copies != 1.0:
        return SpaceEstimate(
            int(size * copies), f"{basis}, {copies:g} times for its {kind.onnx_task} graphs"
        )
    return SpaceEstimate(size, basis)


def optimum_export(model_dir: str, out: Path, onnx_task: str, opset: int, main_file: str) -> None:
    import torch
    from optimum.exporters.onnx import main_export

    # optimum-onnx 0.1.0 loads the model with `torch_dtype=float32`, which transformers 4.57
    # renamed to `dtype` and warns about; float32 is what we export either way.
    for source in ("transformers.modeling_utils", "transformers.configuration_utils"):
        quiet.drop_log_message(source, "`torch_dtype` is deprecated")
    try:
        # Tracing turns Python values computed from the example input into constants and warns
        # each time. A trace that froze a shape would disagree with PyTorch on the real inputs of
        # other lengths and batch sizes that every export is checked on.
        with quiet.ignored_warnings(torch.jit.TracerWarning):
            main_export(
                model_dir,
                output=out,
                task=onnx_task,
                opset=opset,
                device="cpu",
                # Token states out, not sentence-transformers' pooled output: serving pools.
                library_name="transformers",
                do_validation=False,  # replaced by the check on real inputs
            )
    except (ValueError, KeyError, NotImplementedError) as exc:
        text = str(exc)
        unsupported = ("not supported", "unsupported", "only supports the tasks")
        if any(u in text.lower() for u in unsupported) or isinstance(exc, KeyError):
            raise UnsupportedModelError(
                f"optimum-onnx cannot export this model for {onnx_task}: {text.splitlines()[0]}"
            ) from None
        raise ExportError(f"ONNX export of {model_dir} failed: {text}") from exc
    if not (out / main_file).is_file():
        raise ExportError(f"ONNX export of {model_dir} produced no {main_file} in {out}")


def export_checked(
    kind: ModelKind[KindConfig],
    model_dir: str,
    out: Path,
    settings: ExportSpec,
    cfg: KindConfig,
    inputs: list[Any],
) -> dict[str, Any]:
    """Export into `out` at `settings.opset` and check the graph against PyTorch on `inputs`
    (ExportError when it disagrees by more than `settings.atol`): the export step's work, in
    whichever process runs it."""
    opset, atol = settings.opset, settings.atol
    if not kind.export_graph(model_dir, out, opset):
        optimum_export(model_dir, out, kind.onnx_task, opset, kind.main_file)
    kind.prepare_export(model_dir, out, cfg)
    found = kind.check_export(model_dir, out, cfg, inputs)
    if not found["max_abs_diff"] <= atol:
        raise ExportError(
            f"the ONNX export disagrees with PyTorch: largest difference "
            f"{found['max_abs_diff']:.2e} > export.atol {atol:.0e} on {len(inputs)} real "
            f"{kind.item_word}; try another export.opset or report the model"
        )
    return {"max_abs_diff": found["max_abs_diff"], "checked": len(inputs)}


def export_key(
    kind: ModelKind[KindConfig],
    src: FetchResult,
    cfg: KindConfig,
    inputs: list[Any],
    what: list[str | int | float],
) -> str:
    """The export step's cache key: the source, the kind, what is made (task, opset and atol,
    or no graph), the resolved config, the export inputs and this code."""
    modules = (sys.modules[__name__], sys.modules[type(kind).__module__])
    return digest(
        [
            src["content_hash"],
            kind.name,
            *what,
            to_json(cfg.to_dict()),
            to_json(inputs),
            [sha256_module(m) for m in modules],
        ]
    )


def step_result(done: StepOutput, onnx_path: str, opset: int, started: float) -> ExportResult:
    """The export step's result from its cached step's output."""
    return ExportResult(
        onnx_path=onnx_path,
        export_dir=str(done.path),
        opset=opset,
        max_abs_diff=done.result["max_abs_diff"],
        checked=done.result["checked"],
        seconds=round(time.perf_counter() - started, 3),
        reused=done.reused,
    )


def export_model(
    kind: ModelKind[KindConfig],
    src: FetchResult,
    settings: ExportSpec,
    cfg: KindConfig,
    data: Data,
    work_root: str,
) -> ExportResult:
    """Export the fetched model (`src`) for `kind` at `settings.opset`, and prove it matches
    PyTorch within `settings.atol` on `data`'s export inputs."""
    model_dir, opset, atol = src["model_dir"], settings.opset, settings.atol
    inputs = kind.export_inputs(data)
    key = export_key(kind, src, cfg, inputs, [kind.onnx_task, opset, atol])
    started = time.perf_counter()

    def build(out: Path) -> dict[str, Any]:
        # In a process of its own for a large model: the export's copies of the weights are
        # returned to the system when it ends (hf2triton.util.isolated).
        size = export_space(kind, model_dir).size
        return run_isolated(
            "ONNX export", size, export_checked, kind, model_dir, out, settings, cfg, inputs
        )

    done = cached_step(work_root, "export", key, build, needs=lambda: export_space(kind, model_dir))
    return step_result(done, candidate_path(kind, done.path), opset, started)


def export_without_graph(
    kind: ModelKind[KindConfig], src: FetchResult, cfg: KindConfig, data: Data, work_root: str
) -> ExportResult:
    """The export step where no runtime tried reads an ONNX graph (each makes its own from the
    source model, hf2triton.runtimes.base.FROM_SOURCE): the files the kind serves beside a graph
    (its tokenizer) and the kind's checks of them on `data`'s export inputs; `onnx_path` is
    empty and `opset` 0."""
    model_dir, inputs = src["model_dir"], kind.export_inputs(data)
    key = export_key(kind, src, cfg, inputs, ["no graph"])
    started = time.perf_counter()

    def build(out: Path) -> dict[str, Any]:
        kind.prepare_export(model_dir, out, cfg)
        return {"checked": len(inputs), **kind.check_export(model_dir, out, cfg, inputs)}

    done = cached_step(work_root, "export", key, build)
    return step_result(done, "", 0, started)
