"""Step `export` (hf2triton/release/export.py) on a tiny real BERT: the ONNX graph has dynamic
axes, runs any batch and length, matches PyTorch within atol on real sentences, is reused, and a
graph that
disagrees or an architecture optimum cannot export is refused, leaving nothing behind."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hf2triton import errors
from hf2triton.errors import ExportError, UnsupportedModelError
from hf2triton.kinds.embedding import TorchEmbedder, cosine_rows
from tests.tiny_bert_steps import SENTENCES, compare_with_torch, do_export, served, sha256


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

    from hf2triton.kinds.torch_reference import onnx_output

    tok = AutoTokenizer.from_pretrained(exported["export_dir"])
    for texts in (["a"], SENTENCES[:3], SENTENCES):
        enc = tok(
            texts, padding=True, truncation=True, max_length=cfg.max_length, return_tensors="np"
        )
        states = onnx_output(exported["onnx_path"], dict(enc))
        assert states.shape == (len(texts), enc["input_ids"].shape[1], 32)
    assert served(tiny_bert, exported, exported["onnx_path"], cfg).embed(SENTENCES).shape == (
        len(SENTENCES),
        32,
    )


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


def test_a_large_models_export_runs_in_a_child_process_and_writes_the_same_graph(
    exported, tiny_bert, tmp_path, monkeypatch
):
    """Over HF2TRITON_ISOLATE_ABOVE_MB (256 MB of weights by default; 0 here) the export and its
    check run in a process of their own: the same graph, the same check; and an export that
    disagrees is refused from the child as from here, leaving nothing behind."""
    from hf2triton.util.isolated import ENV

    def not_here(*args, **kwargs):
        raise AssertionError("the export ran in the release's own process")

    monkeypatch.setenv(ENV, "0")
    # The child imports its own modules: this patch reaches only this process.
    monkeypatch.setattr("hf2triton.release.export.optimum_export", not_here)
    child = do_export(tiny_bert, tmp_path / "work")
    assert child["reused"] is False
    assert sha256(child["onnx_path"]) == sha256(exported["onnx_path"])
    assert child["max_abs_diff"] == exported["max_abs_diff"]
    with pytest.raises(ExportError, match="disagrees with PyTorch"):
        do_export(tiny_bert, tmp_path / "strict", atol=1e-12)
    assert list((tmp_path / "strict" / "export").iterdir()) == []


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
    config = ErnieConfig(
        vocab_size=200,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=64,
    )
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


def test_the_export_check_lets_pytorch_go_before_onnx_runtime_loads_the_graph(
    exported, tiny_bert, cfg, monkeypatch
):
    """The check holds the weights once: PyTorch's model is freed before ONNX Runtime's one
    session opens the graph (a 2.1 GB embedder's check held both, and a session per 8 rows)."""
    import weakref

    from hf2triton.kinds import torch_reference

    sessions, models, real = [], [], torch_reference.onnx_outputs

    def opened(onnx_path, encs, name=None):
        sessions.append(models[0]())
        return real(onnx_path, encs, name)

    def reference():  # handed over as the kinds hand it, no name kept here
        made = TorchEmbedder(tiny_bert, cfg)
        models.append(weakref.ref(made.model))
        return made

    monkeypatch.setattr(torch_reference, "onnx_outputs", opened)
    rows = SENTENCES * 3
    worst = torch_reference.largest_difference(
        reference(), exported["onnx_path"], rows, "last_hidden_state", None, masked=True
    )
    assert sessions == [None]  # one session, opened after the model was gone
    assert 0 < worst <= 1e-3


def test_a_task_the_architecture_cannot_do_is_refused_as_unsupported(tiny_bert, tmp_path):
    """A BERT checkpoint released as a text generator: optimum answers that it 'only supports
    the tasks ...' for bert. That is the model's, not a failed export: UNSUPPORTED_MODEL,
    naming the tasks it can do."""
    from hf2triton.release.export import optimum_export

    with pytest.raises(UnsupportedModelError) as info:
        optimum_export(str(tiny_bert), tmp_path / "out", "text-generation-with-past", 17, "m.onnx")
    msg = str(info.value)
    assert "text-generation-with-past" in msg and "feature-extraction" in msg, msg
    assert not errors.is_retryable(info.value)
