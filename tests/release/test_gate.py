"""The accuracy gate (hf2triton/release/gate.py) on a tiny real BERT: each candidate through the
serving core, against PyTorch; the first (or fastest) that passes ships with its evidence, none
passing stops the release with figures, and a candidate that raises is refused while the others are
still judged."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from hf2triton import errors
from hf2triton.errors import AccuracyGateError, SpecError
from hf2triton.kinds import Candidate
from hf2triton.kinds.embedding import TorchEmbedder
from tests.tiny_bert_steps import (
    IMPOSSIBLE,
    INT8_MISSES_FP32_MEETS,
    LENIENT,
    SENTENCES,
    Thresholds,
    compare_with_torch,
    do_export,
    run_gate,
)


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


def test_a_work_directory_copied_elsewhere_reuses_its_gate_naming_the_copys_files(
    tiny_bert, cfg, sentences_file, tmp_path
):
    """The validate step names the candidates' files relative to the work root (in its key and
    its result): a work directory copied whole (into another hf2triton home) reuses its finished
    gate, whose result points at the copy's files; the same bytes elsewhere are gated anew."""
    first = tmp_path / "home-a" / "work"
    exported = do_export(tiny_bert, first)
    one = run_gate(
        tiny_bert,
        exported,
        cfg,
        sentences_file,
        [Candidate(name="fp32", onnx_path=exported["onnx_path"])],
        LENIENT,
        first,
    )
    assert not one["reused"] and one["onnx_path"] == exported["onnx_path"]

    copy = tmp_path / "home-b" / "work"
    shutil.copytree(first, copy, copy_function=os.link)
    moved = do_export(tiny_bert, copy)
    assert moved["reused"]
    assert moved["onnx_path"] == str(copy / Path(exported["onnx_path"]).relative_to(first))
    two = run_gate(
        tiny_bert,
        moved,
        cfg,
        sentences_file,
        [Candidate(name="fp32", onnx_path=moved["onnx_path"])],
        LENIENT,
        copy,
    )
    assert two["reused"] and two["onnx_path"] == moved["onnx_path"]
    assert Path(two["reference_path"]).parent.parent == copy / "validate"
    assert two["metrics"] == one["metrics"]

    elsewhere = tmp_path / "elsewhere" / "model.onnx"
    elsewhere.parent.mkdir()
    shutil.copyfile(moved["onnx_path"], elsewhere)
    three = run_gate(
        tiny_bert,
        moved,
        cfg,
        sentences_file,
        [Candidate(name="fp32", onnx_path=str(elsewhere))],
        LENIENT,
        copy,
    )
    assert not three["reused"] and three["onnx_path"] == str(elsewhere)


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
    result = run_gate(
        tiny_bert, exported, cfg, sentences_file, candidates, INT8_MISSES_FP32_MEETS, work
    )
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
    # int8 missed in Triton's batches: its slower run one request at a time was left out.
    assert int8_entry["runs"] == ["in batches"] and int8_entry["batch_invariance"] == {}
    assert fp32_entry["runs"] == ["in batches", "one at a time"]
    assert fp32_entry["batch_invariance"]
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


def test_nan_embeddings_fail_the_gate(tiny_bert, exported, nan_onnx, cfg, sentences_file, tmp_path):
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


@pytest.mark.parametrize(
    "content, fragment", [c[1:] for c in SENTENCE_FILES], ids=[c[0] for c in SENTENCE_FILES]
)
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


def test_candidates_that_raise_are_refused_and_the_gate_goes_on(
    tiny_bert, exported, cfg, sentences_file, tmp_path
):
    """A graph that cannot be opened and a variant whose build failed: each refused with its
    error in the report, and the next candidate is still judged and ships."""
    unreadable = tmp_path / "bad" / "model.onnx"
    unreadable.parent.mkdir()
    unreadable.write_bytes(b"not an onnx graph")
    candidates = [
        Candidate(name="unreadable", onnx_path=str(unreadable)),
        Candidate(name="unbuilt", onnx_path="", error="building it failed: ValueError: planted"),
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
    ]
    result = run_gate(
        tiny_bert, exported, cfg, sentences_file, candidates, LENIENT, tmp_path / "work"
    )
    assert result["chosen"] == "fp32"
    report = json.loads(Path(result["report_path"]).read_text(encoding="utf-8"))
    by_name = {c["name"]: c for c in report["candidates"]}
    assert (
        "InvalidProtobuf" in by_name["unreadable"]["error"]
        or "protobuf" in by_name["unreadable"]["error"].lower()
    )
    assert by_name["unbuilt"]["error"] == "building it failed: ValueError: planted"
    assert "error" not in by_name["fp32"]


def test_when_every_candidate_raises_the_gate_names_each_reason(
    tiny_bert, exported, cfg, sentences_file, tmp_path
):
    candidates = [
        Candidate(name="a", onnx_path="", error="building it failed: A"),
        Candidate(name="b", onnx_path="", error="building it failed: B"),
    ]
    with pytest.raises(AccuracyGateError) as info:
        run_gate(tiny_bert, exported, cfg, sentences_file, candidates, LENIENT, tmp_path / "work")
    assert "a: refused, it raised building it failed: A" in str(info.value)
    assert "b: refused, it raised building it failed: B" in str(info.value)


def test_a_large_models_reference_runs_in_a_child_process_and_scores_the_same(
    tiny_bert, exported, cfg, sentences_file, tmp_path, monkeypatch
):
    """Over HF2TRITON_ISOLATE_ABOVE_MB (0 here) PyTorch's answers are computed in a process of
    their own (its memory returned when it ends): the gate scores the same figures."""
    from hf2triton.util.isolated import ENV

    fp32 = Candidate(name="fp32", onnx_path=exported["onnx_path"])
    here = run_gate(tiny_bert, exported, cfg, sentences_file, [fp32], LENIENT, tmp_path / "a")

    def not_here(*args, **kwargs):
        raise AssertionError("PyTorch ran in the release's own process")

    monkeypatch.setenv(ENV, "0")
    # The child imports its own modules: this patch reaches only this process.
    monkeypatch.setattr("hf2triton.kinds.embedding.EmbeddingKind.reference", not_here)
    child = run_gate(tiny_bert, exported, cfg, sentences_file, [fp32], LENIENT, tmp_path / "b")
    assert child["metrics"] == here["metrics"]


def test_a_gate_run_again_with_other_limits_reads_pytorchs_answers_back(
    tiny_bert, exported, cfg, sentences_file, tmp_path, monkeypatch
):
    """A threshold relaxed after a refusal: the gate runs again (its key changed), PyTorch does
    not: its answers are read back from the work folder, and score the same."""
    fp32 = Candidate(name="fp32", onnx_path=exported["onnx_path"])
    work = tmp_path / "work"
    first = run_gate(tiny_bert, exported, cfg, sentences_file, [fp32], LENIENT, work)

    def no_pytorch(*args, **kwargs):
        raise AssertionError("PyTorch ran again")

    monkeypatch.setattr("hf2triton.kinds.embedding.EmbeddingKind.reference", no_pytorch)
    looser = Thresholds(min_cosine=0.6, mean_cosine=0.6, spearman=0.6)
    again = run_gate(tiny_bert, exported, cfg, sentences_file, [fp32], looser, work)
    assert again["reused"] is False  # the gate itself ran again
    assert again["metrics"] == first["metrics"]
    assert len(list((work / "reference").iterdir())) == 1
