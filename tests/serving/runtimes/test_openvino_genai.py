"""hf2triton/serving/runtimes/openvino_genai.py: OpenVINO GenAI serves a stateful OpenVINO IR with
every numerics setting pinned (inference and KV cache precision, dynamic quantization off unless
asked); what
it cannot serve faithfully is refused naming the setting to change."""

from __future__ import annotations

import pytest

from hf2triton.serving.runtimes import (
    RuntimeSettings,
    RuntimeUnavailable,
    open_model,
    runtime_class,
)

IR = "openvino_model.xml"


def settings(precision: str = "fp32", **options) -> RuntimeSettings:
    return RuntimeSettings("openvino-genai", "cpu", precision, options)


def test_the_ir_directory_opens_with_its_properties_pinned(tmp_path):
    files = open_model(str(tmp_path / IR), settings(threads=2))
    assert files.directory == str(tmp_path)
    assert files.properties == {
        "INFERENCE_PRECISION_HINT": "f32",
        "KV_CACHE_PRECISION": "f32",
        "DYNAMIC_QUANTIZATION_GROUP_SIZE": "0",
        "INFERENCE_NUM_THREADS": "2",
    }
    assert files.in_use == "OpenVINO GenAI CPU f32 (KV cache f32)"
    quantized = open_model(str(tmp_path / IR), settings(kv_cache="u8"))
    assert quantized.in_use == "OpenVINO GenAI CPU f32 (KV cache u8)"
    grouped = open_model(str(tmp_path / IR), settings(dynamic_quantization=32))
    assert grouped.properties["DYNAMIC_QUANTIZATION_GROUP_SIZE"] == "32"
    assert grouped.in_use == (
        "OpenVINO GenAI CPU f32 (KV cache f32, activations quantized in groups of 32)"
    )


def test_what_it_cannot_serve_is_refused_naming_what_to_change(tmp_path):
    with pytest.raises(
        RuntimeUnavailable,
        match=r"serves OpenVINO IRs exported for OpenVINO GenAI .*, not model.onnx",
    ):
        open_model(str(tmp_path / "model.onnx"), settings())
    with pytest.raises(ValueError, match="kv_cache 'f8' is not one of"):
        settings(kv_cache="f8")
    with pytest.raises(ValueError, match="dynamic_quantization must be a whole number >= 0"):
        settings(dynamic_quantization=-32)
    with pytest.raises(ValueError, match=r"precision 'fp16' is not offered \(it runs fp32, bf16\)"):
        settings("fp16")
    genai = runtime_class("openvino-genai")
    if "bf16" in genai.offered("cpu")["precisions"]:
        with pytest.raises(RuntimeUnavailable, match="bf16 inference needs a bf16 or u8 KV cache"):
            open_model(str(tmp_path / IR), settings("bf16", kv_cache="f32"))
    else:
        with pytest.raises(RuntimeUnavailable, match="does not offer bf16"):
            open_model(str(tmp_path / IR), settings("bf16"))


def test_it_offers_what_openvino_offers_on_this_cpu_within_its_own_precisions():
    genai, openvino = runtime_class("openvino-genai"), runtime_class("openvino")
    mine, plain = genai.offered("cpu"), openvino.offered("cpu")
    assert mine["available"] and "fp32" in mine["precisions"]
    assert mine["precisions"] == [p for p in plain["precisions"] if p in ("fp32", "bf16")]
