"""hf2triton/release/far.py: weights that miss by far where other weights on the same runtime
settings do not are not judged again on other settings; where the settings quantize
activations (OpenVINO GenAI's dynamic_quantization), only on settings that do. The gate's own
use of it on a real model: tests/release/test_search.py."""

from __future__ import annotations

from hf2triton.kinds.base import Candidate
from hf2triton.release.far import FarWeights

LIMITS = {"next_token_agreement": (">=", 0.95)}


def genai(precision: str, **options) -> dict:
    return {"name": "openvino-genai", "device": "cpu", "precision": precision, "kv_cache": "u8"} | {
        "dynamic_quantization": 0,
        **options,
    }


def cand(weights: str, runtime: dict) -> Candidate:
    return Candidate(
        name=f"{weights} on {runtime}", onnx_path="/x", runtime=runtime, weights=weights
    )


def seen(far: FarWeights, weights: str, runtime: dict, agreement: float) -> None:
    far.saw(cand(weights, runtime), {"metrics": {"next_token_agreement": agreement}})


def test_weights_far_off_with_exact_activations_are_ruled_out_everywhere():
    far = FarWeights(LIMITS)
    seen(far, "openvino-ir/int8", genai("fp32"), 0.80)
    seen(far, "openvino-ir/int4-g32", genai("fp32"), 0.10)
    assert far.why_not(cand("openvino-ir/int4-g32", genai("bf16"))).startswith(
        "not judged: its weights (openvino-ir/int4-g32) miss next_token_agreement by far"
    )
    assert far.why_not(cand("openvino-ir/int4-g32", genai("fp32", dynamic_quantization=32)))
    assert not far.why_not(cand("openvino-ir/int8", genai("bf16")))


def test_weights_far_off_beside_quantized_activations_are_ruled_out_only_there():
    far = FarWeights(LIMITS)
    dq = genai("fp32", dynamic_quantization=32)
    seen(far, "openvino-ir/int8", dq, 0.80)
    seen(far, "openvino-ir/int4-g32", dq, 0.10)
    assert far.why_not(cand("openvino-ir/int4-g32", dq)).endswith(
        "reached 0.8000: ruled out where the runtime computes fp32 dq32 only (set "
        "validation.judge_all: true to judge every candidate)"
    )
    # the activations may be what costs them: the same weights are judged without it
    assert not far.why_not(cand("openvino-ir/int4-g32", genai("fp32")))
    assert not far.why_not(cand("openvino-ir/int4-g32", genai("bf16", dynamic_quantization=32)))
    # then learned with exact activations, they are ruled out everywhere
    seen(far, "openvino-ir/int8", genai("bf16"), 0.85)
    seen(far, "openvino-ir/int4-g32", genai("bf16"), 0.20)
    assert far.why_not(cand("openvino-ir/int4-g32", genai("fp32")))
