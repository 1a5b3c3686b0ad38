"""OpenVINO GenAI's pipelines: the runtime opens the IR's directory with every numerics
setting pinned; for text generation genai.py's engine drives its ContinuousBatchingPipeline, for
speech speech.py drives its WhisperPipeline.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from .base import Runtime, RuntimeSettings, RuntimeUnavailable, register
from .openvino import OV_PRECISIONS, OpenVino

GENAI_KV = ("", "f32", "bf16", "u8")  # "": the inference precision's own
# The graph file each pipeline's directory is named by: a generator's stateful IR, Whisper's
# encoder (its stateful decoder beside it).
GENAI_GRAPHS = ("openvino_model.xml", "openvino_encoder_model.xml")


@register
class OpenVinoGenAI(Runtime):
    """OpenVINO GenAI on the CPU: for text generation its ContinuousBatchingPipeline on a
    stateful OpenVINO IR (openvino_model.xml, exported by optimum-intel) whose paged KV cache
    stays inside the runtime between steps; for speech its WhisperPipeline on Whisper's IRs
    (openvino_encoder_model.xml and the stateful decoder beside it). Every setting that changes
    numerics is pinned: the inference precision, the KV cache's (`kv_cache`; "" is the
    inference precision's own, "u8" quantizes it) and the dynamic quantization of activations
    (`dynamic_quantization`: 0, the default, none; else the group size, e.g. 32: the activations
    of layers with int8 or int4 weights are quantized in groups that size as they run, so the
    layer multiplies int8 by int8; at one stream SmolLM2-1.7B's shape with int8 weights ran 15.9
    tokens/s against 14.2 without, and with int4 19.1 against 11.3, on a 2-core AVX512_BF16
    EPYC; it changes numerics, so the gate judges it as a candidate of its own).
    The ContinuousBatchingPipeline's own: `cache_gb` 0 lets the cache grow as sequences need it
    (a fixed size too small for what runs makes OpenVINO GenAI drop every running request);
    `split_prompts` false (the default) prefills a joining prompt whole in a step of its own,
    before decoding goes on (measured at 32 streams: time to first token p50 64 ms against
    87-95 ms when prompts are split over steps fused with decoding, tokens/s within 4%). The
    engines that drive it are hf2triton_serving/genai.py's and speech.py's `WhisperEngine`."""

    name = "openvino-genai"
    devices = ("cpu",)
    precisions = ("fp32", "bf16")
    options = {
        "threads": 0,
        "kv_cache": "",
        "cache_gb": 0,
        "split_prompts": False,
        "dynamic_quantization": 0,
    }
    at_least = {**Runtime.at_least, "cache_gb": 0, "dynamic_quantization": 0}
    flags = ("split_prompts",)
    choices = {"kv_cache": GENAI_KV}
    tasks_of = {"dynamic_quantization": ("text-generation",)}  # Whisper's IRs: unmeasured

    @classmethod
    def offered(cls, device):
        import openvino_genai  # noqa: F401 - not installed: not offered

        found = OpenVino.offered(device)
        return {**found, "precisions": [p for p in found["precisions"] if p in cls.precisions]}

    @classmethod
    def needs_compressed_weights(cls, options):
        return "dynamic_quantization" if options.get("dynamic_quantization") else ""

    @classmethod
    def properties(cls, settings: RuntimeSettings) -> dict[str, str]:
        """The pipeline's properties: precisions pinned, never the library's defaults."""
        precision = OV_PRECISIONS[settings.precision]
        kv = settings.options["kv_cache"] or precision
        if precision == "bf16" and kv == "f32":
            raise RuntimeUnavailable(
                f"runtime {cls.name}: bf16 inference needs a bf16 or u8 "
                "KV cache, not f32: set kv_cache to bf16 or u8"
            )
        props = {
            "INFERENCE_PRECISION_HINT": precision,
            "KV_CACHE_PRECISION": kv,
            "DYNAMIC_QUANTIZATION_GROUP_SIZE": str(settings.options["dynamic_quantization"]),
        }
        if settings.options["threads"]:
            props["INFERENCE_NUM_THREADS"] = str(settings.options["threads"])
        return props

    @classmethod
    def open(cls, path, settings, shapes=None):
        cls.require_offered(settings)
        if os.path.basename(path) not in GENAI_GRAPHS:
            raise RuntimeUnavailable(
                f"runtime {cls.name} serves OpenVINO IRs exported for OpenVINO GenAI "
                f"({' or '.join(GENAI_GRAPHS)}), not {os.path.basename(path)}"
            )
        return GenAIModelFiles(os.path.dirname(path) or ".", settings, cls.properties(settings))


@dataclass(frozen=True)
class GenAIModelFiles:
    """An OpenVINO GenAI model as the runtime opened it: its directory and pinned properties.
    The engine (hf2triton_serving/genai.py) builds the pipeline with the batching it serves."""

    directory: str
    settings: RuntimeSettings
    properties: dict[str, str]

    @property
    def in_use(self) -> str:
        group = self.properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"]
        return (
            f"OpenVINO GenAI CPU {self.properties['INFERENCE_PRECISION_HINT']} "
            f"(KV cache {self.properties['KV_CACHE_PRECISION']}"
            + (f", activations quantized in groups of {group})" if group != "0" else ")")
        )
