"""OpenVINO GenAI on the CPU, for text generation: continuous batching over a paged KV cache
that stays inside the runtime (hf2triton/serving/genai.py drives it). It reads the stateful
OpenVINO IR that optimum-intel exports from the Hugging Face model (f32 weights), and builds its
weight-compressed variants with NNCF (int8, and int4 in groups); each is tried at f32 and, where
the CPU has it, bf16, with the KV cache at the inference precision and quantized to u8."""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf2triton.runtimes.base import (
    PLUGINS,
    STATEFUL_IR,
    Recipe,
    RuntimePlugin,
    Variant,
    VariantContext,
    VariantId,
    build_variant,
)
from hf2triton.serving import runtimes as serving_runtimes
from hf2triton.serving.decoding import DecodeSettings
from hf2triton.serving.genai import TOKENIZER_IRS, unfaithful
from hf2triton.util.isolated import run_isolated
from hf2triton.util.workspace import fp32_weights, hash_files, sha256_file

if TYPE_CHECKING:
    from hf2triton.kinds.base import ModelKind

IR = "openvino_model.xml"


@PLUGINS.register
class OpenVinoGenAI(RuntimePlugin):
    serving = serving_runtimes.OpenVinoGenAI
    device = "cpu"
    kinds = frozenset({"text_generation"})
    # The KV cache at the inference precision, then quantized to u8 (a quarter of f32's reads).
    auto = ("fp32", "bf16", ("fp32", {"kv_cache": "u8"}), ("bf16", {"kv_cache": "u8"}))
    reads = {"fp32": frozenset({STATEFUL_IR}), "bf16": frozenset({STATEFUL_IR})}

    @classmethod
    def refuses(cls, kind: ModelKind, model_dir: str) -> str:
        processors = kind.resolve(model_dir).to_dict()["processors"]
        return unfaithful(DecodeSettings.from_dict(processors))

    @staticmethod
    def label(runtime: dict[str, Any]) -> str:
        kv = runtime.get("kv_cache")
        return f"{runtime['name']} {runtime['precision']}" + (f" kv-{kv}" if kv else "")

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        found = [Recipe("openvino-ir", STATEFUL_IR, lambda: stateful_ir(ctx))]
        spec = ctx.quantization
        if spec.method != "none" or spec.search:
            found.append(
                Recipe("openvino-ir/int8", STATEFUL_IR, lambda: compressed(ctx, "INT8_ASYM", 0))
            )
        if spec.method == "int4-blockwise" or spec.search:
            found.append(
                Recipe(
                    f"openvino-ir/int4-g{spec.block_size}",
                    STATEFUL_IR,
                    lambda: compressed(ctx, "INT4_ASYM", spec.block_size),
                )
            )
        return found


def stateful_ir(ctx: VariantContext) -> Variant:
    """The model as a stateful OpenVINO IR (the KV cache as the model's state, what OpenVINO
    GenAI's scheduler pages), exported by optimum-intel with f32 weights: no compression of its
    own (it compresses a large model to int8 unless told)."""
    src = Path(ctx.model_dir)

    def build(out: Path) -> dict:
        # In a process of its own for a large model (hf2triton.util.isolated): the conversion
        # holds 1.7x the fp32 weights (SmolLM2-360M: 2.3 GB), returned to the system when it ends.
        size = fp32_weights(src).size
        run_isolated("OpenVINO conversion", size, convert_stateful, str(src), out)
        return {"tokenizer_ir": tokenizer_ir(src, out)}

    return build_variant(
        ctx.work,
        "openvino-ir",
        [hash_files(src)],
        build,
        VariantId("openvino-ir", STATEFUL_IR, src / "config.json", IR),
    )


def compress(src: Path, out: Path, mode: str, group_size: int) -> None:
    """NNCF's data-free weight compression of the IR `src` into `out` (see `compressed`)."""
    import nncf
    import openvino as ov

    nncf.set_log_level(logging.WARNING)
    options: dict[str, Any] = {"mode": getattr(nncf.CompressWeightsMode, mode)}
    if group_size:
        options.update(
            group_size=group_size,
            ratio=1.0,
            advanced_parameters=(
                nncf.AdvancedCompressionParameters(
                    group_size_fallback_mode=nncf.GroupSizeFallbackMode.ADJUST
                )
            ),
        )
    with contextlib.redirect_stdout(io.StringIO()):
        model = nncf.compress_weights(ov.Core().read_model(str(src)), **options)
    ov.save_model(model, str(out / IR), compress_to_fp16=False)


def convert_stateful(src: str, out: Path) -> None:
    """optimum-intel's conversion of the model in `src` to a stateful IR in `out`."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    with contextlib.redirect_stdout(io.StringIO()):  # stdout carries the release's line
        main_export(
            src,
            out,
            task="text-generation-with-past",
            stateful=True,
            ov_config=OVConfig(dtype="fp32"),
            convert_tokenizer=False,
            local_files_only=True,
            library_name="transformers",
        )


def tokenizer_ir(src: Path, out: Path) -> str:
    """The model's tokenizer converted to OpenVINO IRs in `out` (openvino_tokenizers); "" when
    it converted, else why not (the release then refuses constrained requests, saying so)."""
    try:
        import openvino as ov
        from openvino_tokenizers import convert_tokenizer
        from transformers import AutoTokenizer

        tokenizer, detokenizer = convert_tokenizer(
            AutoTokenizer.from_pretrained(str(src)), with_detokenizer=True
        )
        ov.save_model(tokenizer, str(out / "openvino_tokenizer.xml"))
        ov.save_model(detokenizer, str(out / "openvino_detokenizer.xml"))
        return ""
    except Exception as exc:  # noqa: BLE001 - structured output is then not offered, the rest is
        for name in TOKENIZER_IRS:
            (out / name).unlink(missing_ok=True)
        return f"{type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"


def compressed(ctx: VariantContext, mode: str, group_size: int) -> Variant:
    """The stateful IR with its weights compressed by NNCF (data-free): `mode` INT8_ASYM (per
    channel) or INT4_ASYM in groups of `group_size` (a group size a layer's width does not
    divide is adjusted for that layer)."""
    base = stateful_ir(ctx)
    src = Path(base["onnx_path"])
    name = "openvino-ir/int8" if mode.startswith("INT8") else f"openvino-ir/int4-g{group_size}"

    def build(out: Path) -> dict:
        import shutil

        size = src.with_suffix(".bin").stat().st_size  # the IR's f32 weights
        run_isolated("weight compression", size, compress, src, out, mode, group_size)
        for p in src.parent.iterdir():  # the configs and tokenizer files beside it
            if p.is_file() and not p.name.startswith("openvino_model."):
                shutil.copyfile(p, out / p.name)
        return {}

    return build_variant(
        ctx.work,
        "openvino-ir-compressed",
        [sha256_file(src), sha256_file(src.with_suffix(".bin")), mode, group_size],
        build,
        VariantId(name, STATEFUL_IR, src, IR),
    )
