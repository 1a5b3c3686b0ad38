"""ONNX Runtime's shared quantizers (hf2triton/runtimes/quantizers.py) on a tiny real BERT:
dynamic int8, block-wise int8 and the fused graph are smaller (or faster) and serve nearly fp32;
a graph that cannot be quantized fails clearly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hf2triton.errors import QuantizationError
from hf2triton.kinds.embedding import cosine_rows
from hf2triton.runtimes.quantizers import quantize_onnx
from hf2triton.spec import QuantizationSpec
from tests.tiny_bert_steps import SENTENCES, leftovers, served, sha256

QUANT_CASES = [
    (QuantizationSpec(), "dynamic-int8/qint8/per-channel"),
    (QuantizationSpec(per_channel=False), "dynamic-int8/qint8/per-tensor"),
    (QuantizationSpec(reduce_range=True), "dynamic-int8/qint8/per-channel/reduce-range"),
    (QuantizationSpec(weight_type="quint8", per_channel=False), "dynamic-int8/quint8/per-tensor"),
    (QuantizationSpec(op_types=["MatMul"]), "dynamic-int8/qint8/per-channel/MatMul"),
]


@pytest.mark.parametrize("spec, method", QUANT_CASES, ids=[m for _, m in QUANT_CASES])
def test_dynamic_int8_is_smaller_and_runs(exported, work, tiny_bert, cfg, spec, method):
    import onnx

    result = quantize_onnx(exported["onnx_path"], spec, str(work))
    path = Path(result["onnx_path"])
    assert result["method"] == method
    assert result["fp32_bytes"] == Path(exported["onnx_path"]).stat().st_size
    assert result["size_bytes"] == path.stat().st_size < result["fp32_bytes"]
    assert result["sha256"] == sha256(path)
    ops = {n.op_type for n in onnx.load(str(path)).graph.node}
    assert ops & {"DynamicQuantizeLinear", "MatMulInteger", "DequantizeLinear"}
    # It loads in ONNX Runtime and still gives (nearly) the same sentence embeddings.
    quant = served(tiny_bert, exported, path, cfg).embed(SENTENCES)
    fp32 = served(tiny_bert, exported, exported["onnx_path"], cfg).embed(SENTENCES)
    assert quant.shape == fp32.shape == (len(SENTENCES), 32)
    assert np.isfinite(quant).all()
    assert cosine_rows(quant, fp32).min() > 0.99
    assert not np.array_equal(quant, fp32)


@pytest.mark.parametrize(
    "spec, method, op",
    [
        (QuantizationSpec(method="int8-blockwise"), "int8-blockwise/b32/acc4", "MatMulNBits"),
        (
            QuantizationSpec(method="int8-blockwise", block_size=128, accuracy_level=0, fuse=True),
            "int8-blockwise/b128/acc0/fused",
            "MatMulNBits",
        ),
        (QuantizationSpec(method="none", fuse=True), "fp32/fused", "SkipLayerNormalization"),
    ],
)
def test_blockwise_int8_and_the_fused_graph_serve_nearly_fp32(
    exported, work, tiny_bert, cfg, spec, method, op
):
    import onnx

    result = quantize_onnx(exported["onnx_path"], spec, str(work))
    assert result["method"] == method
    ops = {n.op_type for n in onnx.load(result["onnx_path"]).graph.node}
    assert op in ops, sorted(ops)
    variant = served(tiny_bert, exported, result["onnx_path"], cfg).embed(SENTENCES)
    fp32 = served(tiny_bert, exported, exported["onnx_path"], cfg).embed(SENTENCES)
    assert cosine_rows(variant, fp32).min() > (0.9999 if method == "fp32/fused" else 0.999)


def test_default_quantization_is_per_channel_and_reused(int8, exported, work):
    assert int8["method"] == "dynamic-int8/qint8/per-channel"
    again = quantize_onnx(exported["onnx_path"], QuantizationSpec(), str(work))
    assert again["reused"] is True
    assert again["onnx_path"] == int8["onnx_path"]
    assert again["sha256"] == int8["sha256"]


def test_method_none_ships_an_identical_copy(exported, work):
    result = quantize_onnx(exported["onnx_path"], QuantizationSpec(method="none"), str(work))
    assert result["method"] == "none"
    assert result["onnx_path"] != exported["onnx_path"]
    assert sha256(result["onnx_path"]) == sha256(exported["onnx_path"]) == result["sha256"]
    assert result["size_bytes"] == result["fp32_bytes"]


def test_a_graph_that_cannot_be_quantized_fails_clearly(tmp_path):
    bad = tmp_path / "model.onnx"
    bad.write_bytes(b"this is not an onnx protobuf" * 4)
    with pytest.raises(QuantizationError) as info:
        quantize_onnx(str(bad), QuantizationSpec(), str(tmp_path / "work"))
    msg = str(info.value)
    assert str(bad) in msg
    assert "quantization.method: none" in msg
    assert leftovers(tmp_path / "work" / "quantize") == []


@pytest.mark.parametrize("ops", [None, ["MatMul"]], ids=["all-ops", "matmul-only"])
@pytest.mark.parametrize("apart", [False, True], ids=["weights-inside", "weights-apart"])
def test_a_large_graphs_int8_is_built_apart_and_byte_for_byte_onnx_runtimes(
    exported, tmp_path, monkeypatch, apart, ops
):
    """Over HF2TRITON_ISOLATE_ABOVE_MB (0 here) dynamic int8 runs in a process of its own that
    holds the fp32 graph once, or reads each weight from its file (dynamic_int8_lean): what it
    writes is exactly what ONNX Runtime's quantize_dynamic writes, graph and weights file, with
    large fp32 weights left unquantized too (MatMul only: the embeddings' Gather stays fp32). An
    ONNX Runtime whose quantizer changed would fail here, not ship a different graph."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from hf2triton.util.isolated import ENV
    from tests.tiny_bert_steps import saved_apart

    src = Path(exported["onnx_path"])
    if apart:
        src = saved_apart(str(src), tmp_path / "fp32" / "model.onnx")
    expected = tmp_path / "expected"
    expected.mkdir()
    quantize_dynamic(
        src,
        expected / "model.onnx",
        weight_type=QuantType.QInt8,
        per_channel=True,
        op_types_to_quantize=ops,
        use_external_data_format=apart,
    )

    def not_here(*args, **kwargs):
        raise AssertionError("quantize_dynamic ran in the release's own process")

    monkeypatch.setenv(ENV, "0")
    monkeypatch.setattr("onnxruntime.quantization.quantize_dynamic", not_here)
    spec = QuantizationSpec(op_types=ops)
    built = Path(quantize_onnx(str(src), spec, str(tmp_path / "work"))["onnx_path"])
    names = sorted(p.name for p in expected.iterdir())
    assert names == (["model.onnx", "model.onnx.data"] if apart else ["model.onnx"])
    assert sorted(p.name for p in built.parent.iterdir() if p.suffix != ".json") == names
    for name in names:
        assert sha256(built.parent / name) == sha256(expected / name), name
