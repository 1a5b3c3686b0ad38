"""hf2triton/serving/runtimes/onnxruntime_tensorrt.py: ONNX Runtime's TensorRT provider in fp16. On
this CPU host it must say that it cannot run and why (never run on the CPU instead); what it
would hand TensorRT (fp16, the engine cache, one shape profile over the graph's own inputs, rows
capped) is checked without a GPU."""

from __future__ import annotations

import pytest

from hf2triton.serving.runtimes import (
    RuntimeSettings,
    RuntimeUnavailable,
    open_model,
    runtime_class,
    runtime_info,
)
from tests.serving.graphs import sums_graph


def settings(cache_dir: str, **options) -> RuntimeSettings:
    return RuntimeSettings(
        "onnxruntime-tensorrt", "cuda", "fp16", {"cache_dir": cache_dir, **options}
    )


def test_on_a_cpu_host_it_is_unavailable_and_says_why(tmp_path):
    import onnxruntime as ort

    found = runtime_info()["onnxruntime-tensorrt"]["cuda"]
    has_trt = "TensorrtExecutionProvider" in ort.get_available_providers()
    assert found["available"] == has_trt
    if not has_trt:
        assert found["precisions"] == []
        assert "has no TensorrtExecutionProvider" in found["why"]
        graph = str(sums_graph(tmp_path / "model.onnx"))
        with pytest.raises(RuntimeUnavailable) as caught:
            open_model(graph, settings(str(tmp_path / "engines")))
        message = str(caught.value)
        assert "TensorrtExecutionProvider is not in use for model.onnx" in message
        assert "fell back to CPUExecutionProvider" in message
        assert "run it on a machine with a GPU" in message


def test_it_runs_fp16_only_and_an_unwritable_engine_cache_is_refused(tmp_path):
    with pytest.raises(ValueError, match=r"precision 'fp32' is not offered \(it runs fp16\)"):
        RuntimeSettings("onnxruntime-tensorrt", "cuda", "fp32")
    with pytest.raises(ValueError, match="max_rows must be a whole number >= 1, got 0"):
        settings(str(tmp_path), max_rows=0)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    graph = str(sums_graph(tmp_path / "model.onnx"))
    with pytest.raises(
        RuntimeUnavailable, match="engine cache .*a-file/engines is not writable.*set cache_dir"
    ):
        open_model(graph, settings(str(blocker / "engines")))


def test_what_tensorrt_is_given_fp16_the_cache_and_a_profile_over_the_graphs_inputs(tmp_path):
    trt = runtime_class("onnxruntime-tensorrt")
    graph = str(sums_graph(tmp_path / "model.onnx"))
    s = settings(str(tmp_path / "engines"), max_rows=16, device_id=1)
    wanted = {n: ((1, 1), (1 << 16, 64)) for n in ("input_ids", "attention_mask", "token_type_ids")}
    shapes = trt.engine_shapes(graph, s, wanted)
    assert shapes == {n: ((1, 1), (16, 64)) for n in ("input_ids", "attention_mask")}
    (name, options), cuda, cpu = trt.providers(s, shapes)
    assert (name, cuda, cpu) == (
        "TensorrtExecutionProvider",
        ("CUDAExecutionProvider", {"device_id": 1}),
        "CPUExecutionProvider",
    )
    assert options["trt_fp16_enable"] and options["trt_engine_cache_enable"]
    assert (
        options["trt_engine_cache_path"] == str(tmp_path / "engines") and options["device_id"] == 1
    )
    assert options["trt_profile_min_shapes"] == "input_ids:1x1,attention_mask:1x1"
    assert (
        options["trt_profile_max_shapes"]
        == options["trt_profile_opt_shapes"]
        == ("input_ids:16x64,attention_mask:16x64")
    )
