"""OpenVINO on the CPU (f32, and bf16 where the CPU has it): it reads the plain ONNX export
directly and its own IR, and builds NNCF's post-training int8 graph, calibrated on the kind's
validation items as the serving core feeds them."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import Any

from hf2triton.runtimes.base import (
    GENERATORS_TO_GENAI,
    OPENVINO_IR,
    PLAIN,
    PLUGINS,
    Recipe,
    RuntimePlugin,
    Variant,
    VariantContext,
    VariantId,
    build_variant,
)
from hf2triton.serving import runtimes as serving_runtimes
from hf2triton.util.workspace import sha256_file


@PLUGINS.register
class OpenVinoCpu(RuntimePlugin):
    serving = serving_runtimes.OpenVino
    device = "cpu"
    auto = ("fp32", "bf16")
    reads = {p: frozenset({PLAIN, OPENVINO_IR}) for p in ("fp32", "bf16", "fp16")}
    yields_to = {"text_generation": GENERATORS_TO_GENAI}

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        # Its int8 graph is calibrated on what the kind feeds one graph (texts, pairs); a kind
        # of several graphs (seq2seq) or none to calibrate on gets the plain graph only.
        calibration = ctx.calibration
        if ctx.quantization.method == "none" or not calibration or not ctx.single_file:
            return []
        return [Recipe("openvino-int8", OPENVINO_IR, lambda: openvino_int8(ctx, calibration))]


def after_activation(onnx_path: str) -> list[str]:
    """The MatMuls that read an activation's output (GELU, as one op or as erf and multiplies):
    the feed-forward blocks' second projection, whose inputs carry the outliers int8 loses most
    on (all-MiniLM-L6-v2: min cosine 0.963 with them in int8, 0.993 without, on its
    validation set)."""
    import onnx

    graph = onnx.load(onnx_path, load_external_data=False).graph
    made_by = {out: node for node in graph.node for out in node.output}

    def activated(name: str, depth: int = 4) -> bool:
        """Whether `name` is an activation's output: through at most `depth` multiplies and
        adds (GELU decomposed is x * 0.5 * (1 + erf(x / sqrt 2)))."""
        node = made_by.get(name)
        if node is None:
            return False
        if node.op_type in ("Gelu", "FastGelu", "BiasGelu", "Erf", "Tanh", "Relu"):
            return True
        return (
            depth > 0
            and node.op_type in ("Mul", "Add")
            and any(activated(i, depth - 1) for i in node.input)
        )

    return [
        n.name for n in graph.node if n.op_type == "MatMul" and n.input and activated(n.input[0])
    ]


def openvino_int8(ctx: VariantContext, items: list[Any]) -> Variant:
    """NNCF post-training int8 of the graph as OpenVINO IR (model.xml + model.bin), calibrated
    on the kind's `items` (the validation texts, images) fed as the serving core feeds them
    (`ModelKind.calibration_feeds`), the MatMuls after an activation kept in higher precision
    (`after_activation`). OpenVINO runs it; the gate decides whether it is accurate enough."""
    # Its telemetry is off: importing hf2triton made openvino_telemetry unimportable
    # (hf2triton.serving.openvino_telemetry_off), so NNCF uses its no-op stub.
    import nncf
    import openvino as ov

    src = Path(ctx.onnx_path)
    keep = after_activation(ctx.onnx_path)
    max_length = ctx.max_length or 512
    # What the feeds are made with beside the items: the tokenizer, the image processor.
    reads = [Path(ctx.export_dir) / name for name in ctx.kind.input_files]

    def build(out: Path) -> dict:
        feeds = ctx.kind.calibration_feeds(items, ctx.onnx_path, ctx.export_dir, max_length)
        model = ov.Core().read_model(str(src))
        # NNCF logs each node it leaves out at INFO and draws progress bars on stdout: noise in
        # a release's log (and stdout carries the release's one JSON line).
        nncf.set_log_level(logging.WARNING)
        with contextlib.redirect_stdout(io.StringIO()):
            quantized = nncf.quantize(
                model,
                nncf.Dataset(feeds),
                model_type=nncf.ModelType.TRANSFORMER,
                subset_size=len(feeds),
                ignored_scope=nncf.IgnoredScope(names=keep, validate=False),
            )
        ov.save_model(quantized, str(out / "model.xml"), compress_to_fp16=False)
        return {}

    return build_variant(
        ctx.work,
        "openvino-int8",
        [
            sha256_file(src),
            *(sha256_file(f) for f in reads),
            max_length,
            items,
            keep,
            nncf.__version__,
            ov.__version__,
        ],
        build,
        VariantId("openvino-int8", OPENVINO_IR, src, "model.xml"),
    )
