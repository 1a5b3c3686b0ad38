"""hf2triton/serving/runtimes/base.py: the runtime settings serving.json names, validated against
the runtime's own table entry (a bad one refused naming the setting and what it may be), the
default a serving.json without a runtime runs, and what this machine offers."""

from __future__ import annotations

import pytest

from hf2triton.serving.runtimes import (
    DEFAULT_RUNTIME,
    RuntimeSettings,
    open_model,
    runtime_class,
    runtime_info,
    settings_of,
)


def test_settings_pin_the_precision_spell_it_one_way_and_write_every_default():
    s = RuntimeSettings("openvino", "CPU", "f32", {"streams": 2})
    assert s.to_dict() == {
        "name": "openvino",
        "device": "cpu",
        "precision": "fp32",
        "threads": 0,
        "streams": 2,
        "hint": "THROUGHPUT",
    }
    assert RuntimeSettings.from_dict(s.to_dict()) == s
    assert RuntimeSettings("onnxruntime", precision="float16").precision == "fp16"


def test_a_serving_json_without_a_runtime_runs_onnxruntime_cpu_fp32_with_its_threads():
    s = settings_of({"intra_op_threads": 3})
    assert s.to_dict() == {**DEFAULT_RUNTIME, "threads": 3}
    named = settings_of(
        {"intra_op_threads": 2, "runtime": {"name": "onnxruntime", "precision": "fp32"}}
    )
    assert named.options["threads"] == 2  # the older key still reaches a runtime with threads
    own = settings_of(
        {
            "intra_op_threads": 2,
            "runtime": {"name": "onnxruntime", "precision": "fp32", "threads": 1},
        }
    )
    assert own.options["threads"] == 1


@pytest.mark.parametrize(
    "serving, says",
    [
        ({"runtime": "openvino"}, "serving.json runtime must be an object such as"),
        ({"runtime": {"precision": "fp32"}}, 'names no runtime: add "name", one of onnxruntime'),
        (
            {"runtime": {"name": "onnxruntime"}},
            "onnxruntime names no precision: pin one of fp32, fp16",
        ),
        ({"runtime": {"name": "tvm", "precision": "fp32"}}, "runtime 'tvm' is unknown: use one of"),
        (
            {"runtime": {"name": "onnxruntime", "precision": "int4"}},
            "precision 'int4' is not offered (it runs fp32, fp16)",
        ),
        (
            {"runtime": {"name": "onnxruntime", "precision": "fp32", "device": "tpu"}},
            "device 'tpu' is not one of cpu",
        ),
        (
            {"runtime": {"name": "onnxruntime", "precision": "fp32", "streams": 1}},
            "has no setting streams (its settings: threads)",
        ),
        (
            {"runtime": {"name": "openvino", "precision": "fp32", "threads": -1}},
            "threads must be a whole number >= 0, got -1",
        ),
        (
            {"runtime": {"name": "openvino", "precision": "fp32", "hint": "FAST"}},
            "hint 'FAST' is not one of LATENCY",
        ),
        (
            {"runtime": {"name": "openvino-genai", "precision": "fp32", "split_prompts": 1}},
            "split_prompts must be true or false, got 1",
        ),
    ],
)
def test_bad_settings_are_refused_naming_the_setting(serving, says):
    with pytest.raises(ValueError) as caught:
        settings_of(serving)
    assert says in str(caught.value)


def test_runtime_info_says_per_device_what_runs_here_and_why_not():
    info = runtime_info()
    assert set(info) >= {
        "onnxruntime",
        "onnxruntime-cuda",
        "onnxruntime-tensorrt",
        "openvino",
        "openvino-genai",
    }
    for name, devices in info.items():
        assert set(devices) == set(runtime_class(name).devices)
        for found in devices.values():
            assert set(found) == {"precisions", "available", "why"}
            assert found["available"] or found["why"]  # what is not offered says why
    assert info["onnxruntime"]["cpu"] == {
        "precisions": ["fp32", "fp16"],
        "available": True,
        "why": "",
    }


def test_a_model_opens_on_the_runtime_its_settings_name(tmp_path):
    from tests.serving.graphs import sums_graph

    path = str(sums_graph(tmp_path / "model.onnx"))
    for settings, in_use in (
        (RuntimeSettings(), "CPUExecutionProvider"),
        (RuntimeSettings("openvino", precision="fp32"), "OpenVINO CPU f32"),
    ):
        session = open_model(path, settings)
        assert session.in_use == in_use and session.settings == settings
        assert list(session.inputs) == ["input_ids", "attention_mask"]
