"""OpenVINO GenAI on the CPU, for text generation and speech recognition. Text generation:
continuous batching over a paged KV cache that stays inside the runtime (hf2triton/serving/
genai.py drives it). Speech: the WhisperPipeline (hf2triton/serving/speech.py drives it), its
own log-mel, long-form decoding and timestamps. Each reads the OpenVINO IR that optimum-intel
exports from the Hugging Face model (f32 weights, the decoder stateful), and its weight-
compressed variants built with NNCF (int8, and for generators int4 in groups); each is tried at
f32 and, where the CPU has it, bf16, with the KV cache at the inference precision and quantized
to u8; under the latency objective a generator's compressed weights also with their activations
quantized in groups of 32. What differs by kind is one row of `LAYOUTS`."""

from __future__ import annotations

import contextlib
import io
import logging
import shutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hf2triton.runtimes.base import (
    PLUGINS,
    STATEFUL_IR,
    WHISPER_IR,
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
from hf2triton.serving.speech import pipeline_unfaithful
from hf2triton.util.isolated import run_isolated
from hf2triton.util.workspace import fp32_weights, hash_files, sha256_file

if TYPE_CHECKING:
    from hf2triton.kinds.base import ModelKind

IR = "openvino_model.xml"


@dataclass(frozen=True)
class Layout:
    """How one kind's model is exported for OpenVINO GenAI: optimum-intel's task, the graph
    format and its IR files (the first is the variant's graph), whether the pipeline cannot
    run without the tokenizer as IRs, whether int4 weights are offered and symmetric int8
    ones searched, and why its pipeline would not serve a model as released (`why_not` of the
    kind's resolved config; "" when it would)."""

    task: str
    graph: str
    irs: tuple[str, ...]
    why_not: Callable[[dict[str, Any]], str]
    needs_tokenizer_ir: bool = False
    int4: bool = True
    int8_sym: bool = True

    @property
    def main(self) -> str:
        return self.irs[0]


LAYOUTS = {
    "text_generation": Layout(
        "text-generation-with-past",
        STATEFUL_IR,
        (IR,),
        lambda cfg: unfaithful(DecodeSettings.from_dict(cfg["processors"])),
    ),
    # WhisperPipeline reads the tokenizer and detokenizer IRs; int4 weights are not tried (a
    # speech model's few layers of a few hundred wide lose words at 4 bits).
    "speech_recognition": Layout(
        "automatic-speech-recognition-with-past",
        WHISPER_IR,
        ("openvino_encoder_model.xml", "openvino_decoder_model.xml"),
        lambda cfg: pipeline_unfaithful(cfg["decode"], cfg["language"]),
        needs_tokenizer_ir=True,
        int4=False,
        int8_sym=False,  # unmeasured on Whisper
    ),
}


@PLUGINS.register
class OpenVinoGenAI(RuntimePlugin):
    serving = serving_runtimes.OpenVinoGenAI
    device = "cpu"
    kinds = frozenset(LAYOUTS)
    # The KV cache at the inference precision, then quantized to u8 (a quarter of f32's reads).
    auto = ("fp32", "bf16", ("fp32", {"kv_cache": "u8"}), ("bf16", {"kv_cache": "u8"}))
    # One request alone reads every weight each token: with int8 or int4 weights, activations
    # quantized in groups of 32 let a layer multiply int8 by int8 (SmolLM2-1.7B's shape at one
    # stream on a 2-core AVX512_BF16 EPYC: int8 weights 15.9 tokens/s against 14.2, int4 19.1
    # against 11.3; llama.cpp's server on Q8_0 15.7). Judged by the gate: it changes numerics.
    latency = tuple((p, {"kv_cache": "u8", "dynamic_quantization": 32}) for p in ("fp32", "bf16"))
    reads = {
        "fp32": frozenset({STATEFUL_IR, WHISPER_IR}),
        "bf16": frozenset({STATEFUL_IR, WHISPER_IR}),
    }
    plain_weights = frozenset({"openvino-ir"})  # the IR with the export's f32 weights

    @classmethod
    def refuses(cls, kind: ModelKind, model_dir: str) -> str:
        return LAYOUTS[kind.name].why_not(kind.resolve(model_dir).to_dict())

    @classmethod
    def runs(
        cls, variant: Variant, precision: str, options: Mapping[str, Any] | None = None
    ) -> bool:
        """As every runtime, but activations are quantized only beside a generator's compressed
        weights (the IR's int8 or int4 variants): on the f32 IR the setting changes nothing."""
        if (options or {}).get("dynamic_quantization") and (
            variant["method"] in cls.plain_weights or variant["graph"] != STATEFUL_IR
        ):
            return False  # measured on generators only: Whisper's IRs are left without it
        return super().runs(variant, precision, options)

    @staticmethod
    def computes(runtime: Mapping[str, Any]) -> str:
        group = runtime.get("dynamic_quantization")
        return str(runtime.get("precision", "fp32")) + (f" dq{group}" if group else "")

    @staticmethod
    def label(runtime: dict[str, Any]) -> str:
        kv, group = runtime.get("kv_cache"), runtime.get("dynamic_quantization")
        return (
            f"{runtime['name']} {runtime['precision']}"
            + (f" kv-{kv}" if kv else "")
            + (f" dq{group}" if group else "")
        )

    @classmethod
    def recipes(cls, ctx: VariantContext) -> list[Recipe]:
        layout = LAYOUTS[ctx.kind.name]
        found = [Recipe("openvino-ir", layout.graph, lambda: stateful_ir(ctx))]
        spec = ctx.quantization
        if layout.int8_sym and spec.search:
            # Symmetric int8 (no zero points) decompresses faster at bf16: a decode step of
            # SmolLM2-135M's shape took 8.5 ms against 9.5 (2-core AVX512_BF16 EPYC); at f32 or
            # with dq32 it was no faster. Its coarser numerics are the gate's to judge, and which
            # runs fastest the search's: tried beside the asymmetric, and first of the
            # compressed weights, so that at one stream it is what times each family
            # (`Search.leading`): with the asymmetric first, bf16's family was timed on its
            # slower int8 (84 tokens/s against fp32 dq32's 98.5) and its int8-sym, the fastest
            # at one stream in-process, was never timed (the engine alone, median of three
            # processes: int8-sym at bf16 112.2 tokens/s, the asymmetric 100.3, at fp32 dq32
            # 93.3; llama.cpp's server on Q8_0 124.6; docs/data/
            # generation-one-stream-processes-135m-20261206.json).
            found.append(
                Recipe("openvino-ir/int8-sym", layout.graph, lambda: compressed(ctx, "INT8_SYM", 0))
            )
        if spec.method != "none" or spec.search:
            found.append(
                Recipe("openvino-ir/int8", layout.graph, lambda: compressed(ctx, "INT8_ASYM", 0))
            )
        if layout.int4 and (spec.method == "int4-blockwise" or spec.search):
            found.append(
                Recipe(
                    f"openvino-ir/int4-g{spec.block_size}",
                    layout.graph,
                    lambda: compressed(ctx, "INT4_ASYM", spec.block_size),
                )
            )
        return found


def stateful_ir(ctx: VariantContext) -> Variant:
    """The model as OpenVINO IRs, the decoder stateful (the KV cache as the model's state, what
    OpenVINO GenAI pages), exported by optimum-intel with f32 weights: no compression of its
    own (it compresses a large model to int8 unless told)."""
    src = Path(ctx.model_dir)
    layout = LAYOUTS[ctx.kind.name]

    def build(out: Path) -> dict:
        # In a process of its own for a large model (hf2triton.util.isolated): the conversion
        # holds 1.7x the fp32 weights (SmolLM2-360M: 2.3 GB), returned to the system when it ends.
        size = fp32_weights(src).size
        run_isolated("OpenVINO conversion", size, convert_stateful, str(src), out, layout.task)
        why = tokenizer_ir(src, out)
        if why and layout.needs_tokenizer_ir:
            raise RuntimeError(f"OpenVINO GenAI needs the tokenizer as IRs, which failed: {why}")
        return {"tokenizer_ir": why}

    return build_variant(
        ctx.work,
        "openvino-ir" if layout.graph == STATEFUL_IR else f"openvino-ir-{ctx.kind.name}",
        [hash_files(src), layout.task],
        build,
        VariantId("openvino-ir", layout.graph, src / "config.json", layout.main, layout.irs[1:]),
    )


def compress(src: Path, out: Path, mode: str, group_size: int) -> None:
    """NNCF's data-free weight compression of the IR `src` into `out`, under its own name (see
    `compressed`)."""
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
    ov.save_model(model, str(out / src.name), compress_to_fp16=False)


def convert_stateful(src: str, out: Path, task: str = "text-generation-with-past") -> None:
    """optimum-intel's conversion of the model in `src` for `task` to IRs in `out`, the decoder
    stateful."""
    from optimum.exporters.openvino import main_export
    from optimum.intel import OVConfig

    with contextlib.redirect_stdout(io.StringIO()):  # stdout carries the release's line
        main_export(
            src,
            out,
            task=task,
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
    """The IRs with their weights compressed by NNCF (data-free): `mode` INT8_ASYM or INT8_SYM
    (per channel) or INT4_ASYM in groups of `group_size` (a group size a layer's width does
    not divide is adjusted for that layer); each IR of the kind's layout in turn."""
    layout = LAYOUTS[ctx.kind.name]
    base = stateful_ir(ctx)
    src = Path(base["onnx_path"])
    irs = [src.parent / name for name in layout.irs]
    name = {
        "INT8_ASYM": "openvino-ir/int8",
        "INT8_SYM": "openvino-ir/int8-sym",
        "INT4_ASYM": f"openvino-ir/int4-g{group_size}",
    }[mode]

    def build(out: Path) -> dict:
        for ir in irs:
            size = ir.with_suffix(".bin").stat().st_size  # the IR's f32 weights
            run_isolated("weight compression", size, compress, ir, out, mode, group_size)
        stems = {ir.stem for ir in irs}
        for p in src.parent.iterdir():  # the configs and tokenizer files beside them
            if p.is_file() and p.stem not in stems:
                shutil.copyfile(p, out / p.name)
        return {}

    return build_variant(
        ctx.work,
        "openvino-ir-compressed",
        [*(sha256_file(f) for ir in irs for f in (ir, ir.with_suffix(".bin"))), mode, group_size],
        build,
        VariantId(name, layout.graph, src, layout.main, layout.irs[1:]),
    )
