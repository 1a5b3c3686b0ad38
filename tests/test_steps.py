"""The model steps on a tiny real BERT: export to ONNX (checked against PyTorch), quantize, and the
accuracy gate that picks the candidate to ship. Library functions are called directly; the gate
runs each candidate through the serving core, as Triton does."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from hf2triton import errors
from hf2triton.errors import (
    AccuracyGateError,
    ExportError,
    QuantizationError,
    SpecError,
    UnsupportedModelError,
)
from hf2triton.export import export_model
from hf2triton.gate import run_gate as gate
from hf2triton.kinds import Candidate, Data, kind_for
from hf2triton.kinds.embedding import (
    EmbeddingConfig,
    TorchEmbedder,
    cosine_rows,
    resolve_embedding_config,
)
from hf2triton.runtimes.quantizers import quantize_onnx
from hf2triton.sources import fetch_model, parse_source
from hf2triton.kinds.embedding import EmbeddingThresholds as Thresholds
from hf2triton.spec import QuantizationSpec, parse_spec
from tests.tiny_models import CORPUS

ODD = [
    "",  # nothing but [CLS] [SEP]
    "a",
    "🙂🙂 emoji only 🙂",
    "日本語のテキストです",
    "tabs\tand   spaces",
    "ÄÖÜ ß straße",
    " ".join(["word"] * 120),  # longer than the model's 64 positions: truncated
]
SENTENCES = list(dict.fromkeys(CORPUS)) + ODD
LENIENT = Thresholds(min_cosine=0.5, mean_cosine=0.5, spearman=0.5)
IMPOSSIBLE = Thresholds(min_cosine=1.0, mean_cosine=1.0, spearman=1.0)
# On tiny_bert, dynamic int8 reaches min cosine ~0.99996 and fp32 ~0.9999999: this sits between.
INT8_MISSES_FP32_MEETS = Thresholds(min_cosine=0.99999, mean_cosine=0.99999, spearman=0.5)


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def embedding_kind(model_dir: Path | str, sentences: Path | str = "unused.txt",
                   thresholds: Thresholds = Thresholds(), smoke: int = 8):
    return kind_for(parse_spec({
        "name": "tiny", "source": {"path": str(model_dir)}, "registry": {"model_name": "tiny"},
        "embedding": {"thresholds": thresholds.model_dump()},
        "validation": {"sentences": str(sentences), "smoke_sentences": smoke}}))


def do_export(model_dir: Path, work: Path, atol: float = 1e-3, cfg: EmbeddingConfig | None = None):
    src = fetch_model(parse_source(dict(path=str(model_dir))))
    return export_model(
        embedding_kind(model_dir), src["model_dir"], src["content_hash"], 18, atol,
        cfg or resolve_embedding_config(model_dir), Data(SENTENCES), str(work),
    )


def served(model_dir, exported, onnx_path, cfg):
    """The serving core's embedder on `onnx_path`, with the export's tokenizer.json."""
    kind = embedding_kind(model_dir)
    return kind.open_candidate(str(onnx_path), exported["export_dir"],
                          kind.serving_json(cfg, exported["export_dir"]))


def compare_with_torch(model_dir, onnx_path, cfg, texts) -> float:
    return embedding_kind(model_dir).check_export(str(model_dir), Path(onnx_path).parent, cfg,
                                                  texts)["max_abs_diff"]


@pytest.fixture(scope="module")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="module")
def cfg(tiny_bert) -> EmbeddingConfig:
    return resolve_embedding_config(tiny_bert)


@pytest.fixture(scope="module")
def exported(tiny_bert, work):
    return do_export(tiny_bert, work)


@pytest.fixture(scope="module")
def int8(exported, work):
    return quantize_onnx(exported["onnx_path"], QuantizationSpec(), str(work))


@pytest.fixture(scope="module")
def sentences_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "validation.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")  # "" becomes a blank line
    return path


def run_gate(tiny_bert, exported, cfg, sentences_file, candidates, thresholds, work, smoke=8):
    kind = embedding_kind(tiny_bert, sentences_file, thresholds, smoke)
    return gate(kind, str(tiny_bert), exported["export_dir"], candidates, cfg, kind.read_data(),
                8, 0, str(work))


def leftovers(step_dir: Path) -> list[str]:
    return sorted(p.name for p in step_dir.iterdir() if p.name.endswith(".tmp"))


# ---------------------------------------------------------------------------------------------
# Export


def test_export_has_dynamic_batch_and_sequence_axes(exported):
    import onnx

    path = Path(exported["onnx_path"])
    assert path.is_file() and path.name == "model.onnx"
    graph = onnx.load(str(path)).graph
    inputs = {i.name: i.type.tensor_type.shape.dim for i in graph.input}
    assert {"input_ids", "attention_mask"} <= set(inputs)
    for name, dims in inputs.items():
        assert len(dims) == 2, name
        for d in dims:  # batch and sequence are named, not fixed
            assert d.dim_param, f"{name} has a fixed dimension {d.dim_value}"
            assert not d.HasField("dim_value")
    out = graph.output[0].type.tensor_type.shape.dim
    assert out[0].dim_param and out[1].dim_param
    assert out[2].dim_value == 32  # hidden size is fixed


def test_export_runs_with_any_batch_and_length(exported, tiny_bert, cfg):
    from transformers import AutoTokenizer

    from hf2triton.kinds.embedding import onnx_hidden_states

    tok = AutoTokenizer.from_pretrained(exported["export_dir"])
    for texts in (["a"], SENTENCES[:3], SENTENCES):
        enc = tok(texts, padding=True, truncation=True, max_length=cfg.max_length,
                  return_tensors="np")
        states = onnx_hidden_states(exported["onnx_path"], dict(enc))
        assert states.shape == (len(texts), enc["input_ids"].shape[1], 32)
    assert served(tiny_bert, exported, exported["onnx_path"], cfg).embed(SENTENCES).shape == \
        (len(SENTENCES), 32)


def test_export_matches_pytorch_within_atol(exported, tiny_bert, cfg):
    assert exported["max_abs_diff"] <= 1e-3
    assert exported["checked"] >= 20
    assert exported["opset"] == 18
    # Pooled sentence embeddings of the serving core agree too, including the odd inputs.
    ref = TorchEmbedder(tiny_bert, cfg)
    onnx_emb = served(tiny_bert, exported, exported["onnx_path"], cfg)
    cos = cosine_rows(ref.embed(SENTENCES), onnx_emb.embed(SENTENCES))
    assert cos.min() > 0.9999


def test_export_has_a_matching_fast_tokenizer_beside_it(exported, tiny_bert):
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    tokenizer_json = Path(exported["export_dir"]) / "tokenizer.json"
    assert tokenizer_json.is_file()
    served = Tokenizer.from_file(str(tokenizer_json))
    original = AutoTokenizer.from_pretrained(tiny_bert)
    for text in SENTENCES[:-1]:
        assert served.encode(text).ids == original(text)["input_ids"], text


def test_export_is_reused_on_the_second_call(exported, tiny_bert, work):
    again = do_export(tiny_bert, work)
    assert exported["reused"] is False
    assert again["reused"] is True
    assert again["onnx_path"] == exported["onnx_path"]
    assert again["max_abs_diff"] == exported["max_abs_diff"]
    assert sha256(again["onnx_path"]) == sha256(exported["onnx_path"])


def test_changed_weights_are_exported_again(exported, tiny_bert, other_tiny_bert, work):
    other = do_export(other_tiny_bert, work)
    assert other["reused"] is False
    assert other["export_dir"] != exported["export_dir"]
    assert other["max_abs_diff"] <= 1e-3


def test_the_pytorch_check_catches_a_graph_from_other_weights(
    exported, tiny_bert, other_tiny_bert, work, cfg
):
    other = do_export(other_tiny_bert, work)
    same = compare_with_torch(tiny_bert, exported["onnx_path"], cfg, SENTENCES)
    wrong = compare_with_torch(tiny_bert, other["onnx_path"], cfg, SENTENCES)
    assert same <= 1e-3
    assert wrong > 1e-2


def test_an_export_outside_atol_fails_and_leaves_nothing(tiny_bert, exported, tmp_path):
    with pytest.raises(ExportError) as info:
        do_export(tiny_bert, tmp_path, atol=1e-12)
    msg = str(info.value)
    assert "atol" in msg
    assert "1e-12" in msg
    assert "disagrees with PyTorch" in msg
    assert not errors.is_retryable(info.value)
    step_dir = tmp_path / "export"
    assert [p for p in step_dir.iterdir()] == []  # nothing finished, no temporary left


@pytest.fixture(scope="module")
def ernie_dir(tiny_bert, tmp_path_factory) -> Path:
    """A tiny ERNIE encoder: transformers builds it, optimum-onnx has no ONNX config for it."""
    from optimum.exporters.onnx import model_configs  # noqa: F401 - registers the configs
    from optimum.exporters.tasks import TasksManager
    from transformers import ErnieConfig, ErnieModel

    with pytest.raises(KeyError):  # the premise: optimum does not know this model type
        TasksManager.get_supported_tasks_for_model_type(
            "ernie", exporter="onnx", library_name="transformers"
        )
    out = tmp_path_factory.mktemp("models") / "tiny-ernie"
    config = ErnieConfig(vocab_size=200, hidden_size=16, num_hidden_layers=1,
                         num_attention_heads=2, intermediate_size=32, max_position_embeddings=64)
    ErnieModel(config).eval().save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copyfile(tiny_bert / name, out / name)
    return out


def test_an_unsupported_architecture_is_refused(ernie_dir, tmp_path):
    with pytest.raises(UnsupportedModelError) as info:
        do_export(ernie_dir, tmp_path)
    msg = str(info.value)
    assert "ernie" in msg
    assert "feature-extraction" in msg
    assert not errors.is_retryable(info.value)
    assert [p for p in (tmp_path / "export").iterdir()] == []


# ---------------------------------------------------------------------------------------------
# Quantize


QUANT_CASES = [
    (QuantizationSpec(), "dynamic-int8/qint8/per-channel"),
    (QuantizationSpec(per_channel=False), "dynamic-int8/qint8/per-tensor"),
    (QuantizationSpec(reduce_range=True), "dynamic-int8/qint8/per-channel/reduce-range"),
    (QuantizationSpec(weight_type="quint8", per_channel=False),
     "dynamic-int8/quint8/per-tensor"),
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


@pytest.mark.parametrize("spec, method, op", [
    (QuantizationSpec(method="int8-blockwise"), "int8-blockwise/b32/acc4", "MatMulNBits"),
    (QuantizationSpec(method="int8-blockwise", block_size=128, accuracy_level=0, fuse=True),
     "int8-blockwise/b128/acc0/fused", "MatMulNBits"),
    (QuantizationSpec(method="none", fuse=True), "fp32/fused", "SkipLayerNormalization"),
])
def test_blockwise_int8_and_the_fused_graph_serve_nearly_fp32(exported, work, tiny_bert, cfg,
                                                               spec, method, op):
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


# ---------------------------------------------------------------------------------------------
# Validate: the accuracy gate


def test_fp32_passes_a_lenient_gate_and_writes_its_evidence(
    tiny_bert, exported, cfg, sentences_file, work
):
    fp32 = Candidate(name="fp32", onnx_path=exported["onnx_path"])
    result = run_gate(tiny_bert, exported, cfg, sentences_file, [fp32], LENIENT, work)
    kept = [s for s in SENTENCES if s.strip()]

    assert result["chosen"] == "fp32"
    assert result["onnx_path"] == exported["onnx_path"]
    assert result["items"] == len(kept)
    assert result["info"]["embedding_dim"] == 32
    assert result["metrics"]["min_cosine"] > 0.9999
    assert result["candidates"] == {"fp32": result["metrics"]}

    report = json.loads(Path(result["report_path"]).read_text(encoding="utf-8"))
    assert report["chosen"] == "fp32"
    assert report["items"] == len(kept)
    assert report["thresholds"] == LENIENT.model_dump()
    assert [c["name"] for c in report["candidates"]] == ["fp32"]
    assert report["candidates"][0]["misses"] == {}
    assert report["config"] == cfg.to_dict()

    # The smoke reference: 8 texts spread over the length range, with PyTorch's embeddings.
    ref = json.loads(Path(result["reference_path"]).read_text(encoding="utf-8"))
    smoke = ref["items"]
    assert len(smoke) == 8
    assert min(kept, key=len) in smoke and max(kept, key=len) in smoke
    expected = TorchEmbedder(tiny_bert, cfg).embed(smoke)
    np.testing.assert_allclose(np.array(ref["reference"]), expected, atol=1e-5)

    again = run_gate(tiny_bert, exported, cfg, sentences_file, [fp32], LENIENT, work)
    assert again["reused"] is True
    assert again["chosen"] == "fp32"


def test_impossible_thresholds_stop_the_release_with_figures(
    tiny_bert, exported, int8, cfg, sentences_file, tmp_path
):
    cand = Candidate(name=int8["method"], onnx_path=int8["onnx_path"])
    with pytest.raises(AccuracyGateError) as info:
        run_gate(tiny_bert, exported, cfg, sentences_file, [cand], IMPOSSIBLE, tmp_path)
    msg = str(info.value)
    assert not errors.is_retryable(info.value)

    failed = list((tmp_path / "validate").glob("failed-*.json"))
    assert len(failed) == 1
    assert str(failed[0]) in msg
    report = json.loads(failed[0].read_text(encoding="utf-8"))
    assert report["chosen"] is None
    metrics = report["candidates"][0]["metrics"]
    assert "dynamic-int8/qint8/per-channel" in msg
    for metric in ("min_cosine", "mean_cosine", "spearman"):
        figure = metrics[metric]
        assert figure < 1.0
        assert f"{metric} {figure:.4f} < 1.0 (short by {1.0 - figure:.4f})" in msg
    assert "Nothing was registered or deployed" in msg
    # Nothing that looks like a finished validation was left behind.
    assert [p.name for p in (tmp_path / "validate").iterdir()] == [failed[0].name]


def test_when_int8_misses_the_fp32_fallback_is_chosen(
    tiny_bert, exported, int8, cfg, sentences_file, work
):
    candidates = [
        Candidate(name=int8["method"], onnx_path=int8["onnx_path"]),
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
    ]
    result = run_gate(tiny_bert, exported, cfg, sentences_file, candidates,
                      INT8_MISSES_FP32_MEETS, work)
    assert result["chosen"] == "fp32"
    assert result["onnx_path"] == exported["onnx_path"]
    assert set(result["candidates"]) == {int8["method"], "fp32"}
    assert result["metrics"] == result["candidates"]["fp32"]
    assert result["candidates"][int8["method"]]["min_cosine"] < 0.99999

    report = json.loads(Path(result["report_path"]).read_text(encoding="utf-8"))
    assert [c["name"] for c in report["candidates"]] == [int8["method"], "fp32"]
    int8_entry, fp32_entry = report["candidates"]
    assert "min_cosine" in int8_entry["misses"]
    assert int8_entry["misses"]["min_cosine"] == pytest.approx(
        0.99999 - int8_entry["metrics"]["min_cosine"]
    )
    assert fp32_entry["misses"] == {}
    assert len(int8_entry["worst"]) == 10
    assert report["chosen"] == "fp32"


def test_a_passing_int8_is_shipped_without_trying_fp32(
    tiny_bert, exported, int8, cfg, sentences_file, work
):
    candidates = [
        Candidate(name=int8["method"], onnx_path=int8["onnx_path"]),
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
    ]
    result = run_gate(tiny_bert, exported, cfg, sentences_file, candidates, LENIENT, work)
    assert result["chosen"] == int8["method"]
    assert result["onnx_path"] == int8["onnx_path"]
    assert list(result["candidates"]) == [int8["method"]]


@pytest.fixture(scope="module")
def nan_onnx(exported, tmp_path_factory) -> Path:
    """The fp32 graph with one LayerNorm weight set to NaN: every embedding becomes NaN."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(exported["onnx_path"])
    for init in model.graph.initializer:
        if init.name == "embeddings.LayerNorm.weight":
            arr = numpy_helper.to_array(init).copy()
            arr[:] = np.nan
            init.CopyFrom(numpy_helper.from_array(arr, init.name))
            break
    else:
        pytest.fail("embeddings.LayerNorm.weight not found in the exported graph")
    path = tmp_path_factory.mktemp("nan") / "model.onnx"
    onnx.save(model, str(path))
    return path


def test_nan_embeddings_fail_the_gate(tiny_bert, exported, nan_onnx, cfg, sentences_file,
                                      tmp_path):
    cand = Candidate(name="broken", onnx_path=str(nan_onnx))
    with pytest.raises(AccuracyGateError):
        run_gate(tiny_bert, exported, cfg, sentences_file, [cand], Thresholds(), tmp_path)


def test_the_pytorch_check_reports_nan_output_as_a_mismatch(tiny_bert, nan_onnx, cfg):
    worst = compare_with_torch(tiny_bert, nan_onnx, cfg, SENTENCES)
    assert not worst <= 1e-3


SENTENCE_FILES = [
    ("empty", b"", "holds no sentences"),
    ("blank-lines-only", b"\n  \n\t\n", "holds no sentences"),
    ("latin-1", "caf\xe9 au lait\nna\xefve\n".encode("latin-1"), "is not UTF-8"),
    ("utf-16", "hello world\n".encode("utf-16"), "is not UTF-8"),
    ("missing", None, "does not exist"),
]


@pytest.mark.parametrize("content, fragment", [c[1:] for c in SENTENCE_FILES],
                         ids=[c[0] for c in SENTENCE_FILES])
def test_bad_validation_sentence_files_are_spec_errors(
    tiny_bert, exported, cfg, tmp_path, content, fragment
):
    path = tmp_path / "sentences.txt"
    if content is not None:
        path.write_bytes(content)
    fp32 = Candidate(name="fp32", onnx_path=exported["onnx_path"])
    with pytest.raises(SpecError) as info:
        run_gate(tiny_bert, exported, cfg, path, [fp32], LENIENT, tmp_path / "work")
    assert not (tmp_path / "work").exists()
    msg = str(info.value)
    assert str(path) in msg
    assert "validation.sentences" in msg
    assert fragment in msg


# ---------------------------------------------------------------------------------------------
# Embedding configuration


def _st_dir(tmp_path: Path, cls: bool, normalize: bool, max_seq: int | None) -> Path:
    d = tmp_path / "st"
    (d / "1_Pooling").mkdir(parents=True)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling",
         "type": "sentence_transformers.models.Pooling"},
    ]
    if normalize:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    (d / "modules.json").write_text(json.dumps(modules))
    (d / "1_Pooling" / "config.json").write_text(json.dumps(
        {"pooling_mode_cls_token": cls, "pooling_mode_mean_tokens": not cls}))
    if max_seq is not None:
        (d / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq}))
    (d / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 384}))
    (d / "config.json").write_text(json.dumps({"max_position_embeddings": 512}))
    return d


def test_minilm_embedding_config_is_the_models_own(minilm_dir):
    assert resolve_embedding_config(minilm_dir) == EmbeddingConfig(
        pooling="mean", normalize=True, max_length=256
    )


def test_tiny_bert_without_sentence_transformers_files(tiny_bert):
    # No modules.json: mean pooling, no normalisation, the smaller of tokenizer/model limits.
    assert resolve_embedding_config(tiny_bert) == EmbeddingConfig("mean", False, 64)


@pytest.mark.parametrize("cls, normalize, max_seq, expected", [
    (True, False, 128, EmbeddingConfig("cls", False, 128)),
    (False, True, None, EmbeddingConfig("mean", True, 384)),
    (True, True, 200, EmbeddingConfig("cls", True, 200)),
])
def test_sentence_transformers_files_decide_auto(tmp_path, cls, normalize, max_seq, expected):
    assert resolve_embedding_config(_st_dir(tmp_path, cls, normalize, max_seq)) == expected


def test_explicit_settings_override_the_model(minilm_dir):
    assert resolve_embedding_config(
        minilm_dir, pooling="cls", normalize=False, max_length=128
    ) == EmbeddingConfig("cls", False, 128)
