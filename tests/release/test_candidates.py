"""What the gate is asked to decide (hf2triton.release.candidates) and which items a served model is
warmed up and searched with (hf2triton.release.traffic). The gate itself on real models:
tests/release/test_gate.py and tests/release/test_variants.py."""

from __future__ import annotations

import pytest

from hf2triton.release.candidates import gate_candidates, selection
from hf2triton.release.traffic import search_items, warmup_items
from hf2triton.spec import QuantizationSpec, kind_for

EXPORT = {"method": "fp32", "onnx_path": "/x/model.onnx", "graph": "onnx"}
VARIANTS = [
    {"method": "dynamic-int8/qint8/per-channel", "onnx_path": "/x/pc.onnx", "graph": "onnx-ort"},
    {"method": "dynamic-int8/qint8/per-tensor", "onnx_path": "/x/pt.onnx", "graph": "onnx-ort"},
    EXPORT,
]


@pytest.mark.parametrize(
    ("section", "names", "select"),
    [
        # The spec's variant, then fp32 should it miss the gate: the first that passes ships.
        ({}, ["dynamic-int8/qint8/per-channel", "dynamic-int8/qint8/per-tensor", "fp32"], "first"),
        # No fallback: a variant that misses stops the release.
        (
            {"fallback_to_fp32": False},
            ["dynamic-int8/qint8/per-channel", "dynamic-int8/qint8/per-tensor"],
            "first",
        ),
        # A search gates fp32 too, fallback or not, and ships the fastest that passes.
        (
            {"fallback_to_fp32": False, "search": True},
            ["dynamic-int8/qint8/per-channel", "dynamic-int8/qint8/per-tensor", "fp32"],
            "fastest",
        ),
    ],
)
def test_candidates_are_the_variants_in_order_then_fp32(section, names, select):
    quantization = QuantizationSpec(**section)
    found = gate_candidates(VARIANTS, quantization)
    assert [c.name for c in found] == names
    assert found[-1].onnx_path == ("/x/model.onnx" if names[-1] == "fp32" else "/x/pt.onnx")
    assert selection(quantization) == select


def test_without_quantization_the_export_is_the_only_candidate():
    quantization = QuantizationSpec(method="none")
    found = gate_candidates([EXPORT], quantization)
    assert [(c.name, c.onnx_path) for c in found] == [("fp32", "/x/model.onnx")]


def test_a_variant_that_could_not_be_built_is_a_candidate_the_gate_refuses():
    broken = {
        "method": "int4-blockwise/b32/acc4",
        "onnx_path": "",
        "graph": "onnx-ort",
        "error": "building it failed: ValueError: no MatMul",
    }
    found = gate_candidates([broken, EXPORT], QuantizationSpec())
    assert [(c.name, c.error) for c in found] == [
        ("int4-blockwise/b32/acc4", broken["error"]),
        ("fp32", None),
    ]


def test_warmup_is_the_longest_items_and_never_a_blank_one():
    items = [
        "short",
        "",
        "a much longer sentence than the rest",
        "   ",
        "medium one",
        "the longest sentence of all the items given here",
    ]
    assert warmup_items(items) == [
        "a much longer sentence than the rest",
        "the longest sentence of all the items given here",
    ]
    assert warmup_items(["", " "]) == []


def test_the_search_sends_the_first_items_that_make_a_request():
    items = ["", *(f"item {i}" for i in range(300))]
    sent = search_items(items)
    assert len(sent) == 256 and sent[0] == "item 0" and "" not in sent


# ---------------------------------------------------------------------------------------------
# Runtimes: the candidates span graph x runtime


def _spec(**overrides):
    import yaml

    from hf2triton.spec import parse_spec
    from tests.conftest import write_spec

    path = write_spec(__import__("pathlib").Path("/tmp") / "candidates-spec.yaml", **overrides)
    return parse_spec(yaml.safe_load(path.read_text()))


def test_auto_runtimes_run_the_plain_graph_everywhere_and_int8_on_onnxruntime():
    from hf2triton.runtimes import runtime_choices
    from hf2triton.serving.runtimes import runtime_info

    spec = _spec()
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
    found = gate_candidates(VARIANTS, spec.quantization, runtimes)
    bf16 = "bf16" in runtime_info()["openvino"]["cpu"]["precisions"]
    assert [c.name for c in found] == [
        "dynamic-int8/qint8/per-channel",
        "dynamic-int8/qint8/per-tensor",
        "fp32",
        "fp32 on openvino fp32",
        *(["fp32 on openvino bf16"] if bf16 else []),
    ]
    # What serving.json will name: the precision always pinned, OpenVINO's settings written out.
    ov = found[3].runtime
    assert ov["name"] == "openvino" and ov["precision"] == "fp32" and ov["device"] == "cpu"
    assert {"streams", "hint"} <= set(ov) and found[0].runtime["name"] == "onnxruntime"
    assert all(c.gate_runtime is None for c in found)  # the gate runs what serves
    assert selection(spec.quantization, runtimes) == "fastest"
    assert (runtimes.not_offered == {}) == bf16


def test_a_precision_the_cpu_lacks_is_left_out_and_said(monkeypatch):
    """A CPU without bf16 cannot be had here: the runtime table's answer for this machine is
    replaced by what OpenVINO says on such a CPU."""
    from hf2triton.runtimes import runtime_choices
    from hf2triton.serving import runtimes as serving_runtimes

    real = serving_runtimes.runtime_info()
    fake = {
        **real,
        "openvino": {
            "cpu": {
                "precisions": ["fp32"],
                "available": True,
                "why": "OPTIMIZATION_CAPABILITIES: FP32 INT8",
            }
        },
    }
    monkeypatch.setattr(serving_runtimes, "runtime_info", lambda: fake)
    spec = _spec()
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
    assert [r["precision"] for r in runtimes.served if r["name"] == "openvino"] == ["fp32"]
    assert runtimes.not_offered == {"openvino bf16": "OPTIMIZATION_CAPABILITIES: FP32 INT8"}


def test_a_gpu_release_gated_on_cpu_numerics_runs_the_gpu_graph_on_the_cpu():
    """The GPU's graphs in the CUDA runtime's order (fused fp16, plain fp16, fp32), each gated
    on ONNX Runtime's CPU provider at its precision, and the first that passes ships: timed on
    the CPU they would rank as the CPU runs them, not the GPU."""
    from hf2triton.runtimes import runtime_choices

    spec = _spec(deploy__device="gpu", deploy__gpu_gate="cpu-numerics")
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
    variants = [
        {"method": "fp16/fused", "onnx_path": "/x/fused.onnx", "graph": "onnx-fp16-ort"},
        {"method": "fp16", "onnx_path": "/x/fp16.onnx", "graph": "onnx-fp16"},
        EXPORT,
    ]
    found = gate_candidates(variants, QuantizationSpec(), runtimes)
    assert [(c.name, c.runtime["name"], c.runtime["precision"]) for c in found] == [
        ("fp16/fused on onnxruntime-cuda fp16", "onnxruntime-cuda", "fp16"),
        ("fp16 on onnxruntime-cuda fp16", "onnxruntime-cuda", "fp16"),
        ("fp32 on onnxruntime-cuda fp32", "onnxruntime-cuda", "fp32"),
    ]
    assert [c.gate_runtime for c in found] == [
        {"name": "onnxruntime", "device": "cpu", "precision": "fp16"},
        {"name": "onnxruntime", "device": "cpu", "precision": "fp16"},
        {"name": "onnxruntime", "device": "cpu", "precision": "fp32"},
    ]
    assert selection(spec.quantization, runtimes) == "first"
    # TensorRT reads the plain fp16 graph only: it has no kernels for the fused operators.
    trt = runtime_choices(
        spec.deploy,
        _spec(runtime__candidates=[{"name": "onnxruntime-tensorrt", "precision": "fp16"}]).runtime,
    )
    assert [c.name for c in gate_candidates(variants, QuantizationSpec(), trt)] == [
        "fp16 on onnxruntime-tensorrt fp16"
    ]


def test_a_listed_runtime_is_the_only_one_tried():
    from hf2triton.runtimes import runtime_choices

    spec = _spec(
        runtime__candidates=[
            {
                "name": "openvino",
                "precision": "fp32",
                "options": {"streams": 2, "hint": "THROUGHPUT"},
            }
        ]
    )
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
    found = gate_candidates(VARIANTS, spec.quantization, runtimes)
    assert [c.name for c in found] == ["fp32 on openvino fp32"]
    assert found[0].runtime["streams"] == 2 and found[0].runtime["hint"] == "THROUGHPUT"
    assert selection(spec.quantization, runtimes) == "first"


def test_auto_leaves_a_generator_to_openvino_genai_and_exports_no_onnx_graph(monkeypatch):
    """Under `auto` a generator's candidates are OpenVINO GenAI's alone where it is offered
    (ONNX Runtime and plain OpenVINO are said not tried, with why), so the release needs no ONNX
    export; without GenAI here, or with ONNX Runtime listed, they are tried and it does."""
    from hf2triton.runtimes import runtime_choices
    from hf2triton.serving import runtimes as serving_runtimes

    spec = _spec(task="text-generation", embedding=None)
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
    assert {r["name"] for r in runtimes.served} == {"openvino-genai"}
    assert "OpenVINO GenAI serves generators here" in runtimes.not_offered["onnxruntime fp32"]
    assert "openvino fp32" in runtimes.not_offered
    assert not runtimes.read_export()

    listed = _spec(
        task="text-generation",
        embedding=None,
        runtime__candidates=[
            {"name": "onnxruntime", "precision": "fp32"},
            {"name": "openvino-genai", "precision": "fp32"},
        ],
    )
    both = runtime_choices(listed.deploy, listed.runtime, kind_for(listed))
    assert [r["name"] for r in both.served] == ["onnxruntime", "openvino-genai"]
    assert both.read_export()

    real = serving_runtimes.runtime_info()
    without = {**real, "openvino-genai": {"cpu": {"precisions": [], "why": "not installed"}}}
    monkeypatch.setattr(serving_runtimes, "runtime_info", lambda: without)
    alone = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
    assert {r["name"] for r in alone.served} == {"onnxruntime", "openvino"}
    assert alone.read_export()


def test_an_embedder_under_auto_still_exports_its_graph():
    from hf2triton.runtimes import runtime_choices

    spec = _spec()
    assert runtime_choices(spec.deploy, spec.runtime, kind_for(spec)).read_export()


def test_a_generator_openvino_genai_would_not_honour_gets_the_others_back(tmp_path):
    """A generation config with no_repeat_ngram_size (which OpenVINO GenAI ignores outside beam
    search): the runtimes that yielded to it are tried after all, and the export is made."""
    import json

    from hf2triton.runtimes import runtime_choices
    from tests.tiny_models import build_tiny_llama

    model = build_tiny_llama(tmp_path / "llama")
    spec = _spec(task="text-generation", embedding=None)
    kind = kind_for(spec)
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind)
    assert runtimes.for_model(kind, str(model)) is runtimes  # GenAI serves it faithfully

    gen = json.loads((model / "generation_config.json").read_text())
    (model / "generation_config.json").write_text(json.dumps({**gen, "no_repeat_ngram_size": 3}))
    back = runtimes.for_model(kind, str(model))
    assert [r["name"] for r in back.served][:2] == ["onnxruntime", "openvino"]
    # OpenVINO GenAI stays: the gate refuses its candidates, saying why.
    assert "openvino-genai" in {r["name"] for r in back.served}
    assert "onnxruntime fp32" not in back.not_offered and back.read_export()


def test_the_latency_objective_also_tries_quantized_activations_beside_compressed_weights():
    """Under `runtime.objective: latency` OpenVINO GenAI's candidates gain activations quantized
    in groups of 32 (dynamic quantization), on the IR's int8 and int4 weights only: on the f32
    IR the setting changes nothing. The throughput objective does not try them."""
    from hf2triton.runtimes import runtime_choices
    from hf2triton.runtimes.base import STATEFUL_IR
    from hf2triton.serving.runtimes import runtime_info

    ir = {"graph": STATEFUL_IR, "onnx_path": "/x/openvino_model.xml"}
    variants = [
        {**ir, "method": "openvino-ir"},
        {**ir, "method": "openvino-ir/int8"},
        {**ir, "method": "openvino-ir/int4-g32"},
    ]
    names = {}
    for objective in ("throughput", "latency"):
        spec = _spec(task="text-generation", embedding=None, runtime__objective=objective)
        runtimes = runtime_choices(spec.deploy, spec.runtime, kind_for(spec))
        found = gate_candidates(variants, QuantizationSpec(search=True), runtimes)
        names[objective] = [c.name for c in found]
    bf16 = "bf16" in runtime_info()["openvino-genai"]["cpu"]["precisions"]
    added = [n for n in names["latency"] if n not in names["throughput"]]
    assert added == [
        f"openvino-ir/{w} on openvino-genai {p} kv-u8 dq32"
        for p in ("fp32", *(["bf16"] if bf16 else []))
        for w in ("int8", "int4-g32")
    ]
    assert not any("dq" in n for n in names["throughput"])


def test_runtimes_that_read_none_of_the_graphs_built_are_refused_by_name():
    from hf2triton.errors import SpecError
    from hf2triton.runtimes import RuntimeChoices

    genai = {"name": "openvino-genai", "device": "cpu", "precision": "fp32"}
    with pytest.raises(
        SpecError,
        match=r"none of the runtimes tried \(openvino-genai fp32\) runs any graph this release "
        r"built \(dynamic-int8/qint8/per-channel, dynamic-int8/qint8/per-tensor, fp32\)",
    ):
        gate_candidates(VARIANTS, QuantizationSpec(), RuntimeChoices([genai]))


def test_the_next_candidate_is_pinned_with_the_settings_it_ran():
    from hf2triton.release.verdict import next_candidate

    runtime = {
        "name": "openvino-genai",
        "device": "cpu",
        "precision": "bf16",
        "kv_cache": "u8",
        "cache_gb": 0,
        "split_prompts": False,
        "dynamic_quantization": 32,
    }
    report = {
        "candidates": [
            {"name": "shipped", "misses": {}},
            {
                "name": "openvino-ir/int8 on openvino-genai bf16 kv-u8 dq32",
                "misses": {},
                "runtime": runtime,
            },
        ]
    }
    assert next_candidate("shipped", report).endswith(
        "pin runtime.candidates: [{name: openvino-genai, precision: bf16, options: "
        "{kv_cache: u8, dynamic_quantization: 32}}] and run the release again"
    )
