"""The gate's candidate search (hf2triton/release/search.py) on a tiny real BERT, its candidates
opened and judged through the serving core: pruned by runtime, only the fastest runtime's
candidates are built, timed and judged, the others reported as never timed; when none of the
fastest runtime's passes, or the one that does is slower than another runtime's first, that
runtime's are too; the latency objective times one request alone.

The speeds are planted (a stand-in for the kind's timing, keyed by runtime): on a tiny model
which runtime is faster is noise, and this is a test of what the search does with the figures,
not of the figures. Everything else is real: graphs opened on ONNX Runtime and OpenVINO, scored
against PyTorch, the planned graphs built by their own callables."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hf2triton.kinds import Candidate
from hf2triton.kinds.embedding import EmbeddingKind
from hf2triton.release.gate import run_gate
from hf2triton.release.plan import Gate, GateSettings
from tests.tiny_bert_steps import LENIENT, embedding_kind

OPENVINO = {"name": "openvino", "device": "cpu", "precision": "fp32"}
OPENVINO_BF16 = {**OPENVINO, "precision": "bf16"}


@pytest.fixture()
def planted(monkeypatch):
    """Speeds by runtime name, or by graph path and runtime name where that is planted; records
    the streams each timing asked for."""
    speeds: dict = {"onnxruntime": 50.0, "openvino": 100.0}
    seen: dict[str, list] = {"streams": [], "opened": []}
    real_open = EmbeddingKind.open_candidate

    def open_candidate(self, candidate, export_dir, settings):
        runtime = (settings.get("runtime") or {}).get("name", "onnxruntime")
        seen["opened"].append((str(candidate), runtime))
        return real_open(self, candidate, export_dir, settings)

    def speed(self, model, items, streams):
        seen["streams"].append(streams)
        graph, runtime = seen["opened"][-1]
        return {"speed": speeds.get((graph, runtime), speeds[runtime]), "streams": streams}

    monkeypatch.setattr(EmbeddingKind, "open_candidate", open_candidate)
    monkeypatch.setattr(EmbeddingKind, "speed", speed)
    return speeds, seen


class Planned:
    """A planned candidate's build: the graph at `path`, counted when built."""

    def __init__(self, path: str | Path) -> None:
        self.path, self.calls = str(path), 0

    def __call__(self) -> dict:
        self.calls += 1
        return {"onnx_path": self.path}


def gate_on(
    tiny_bert, exported, cfg, sentences_file, candidates, work, thresholds=LENIENT, **settings
):
    kind = embedding_kind(tiny_bert, sentences_file, thresholds)
    gate = Gate.of(
        kind,
        cfg,
        kind.read_data(),
        exported["export_dir"],
        GateSettings(batch=8, select="fastest", **settings),
    )
    result = run_gate(gate, candidates, model_dir=str(tiny_bert), work_root=str(work))
    report = json.loads(Path(result["report_path"]).read_text(encoding="utf-8"))
    return result, {c["name"]: c for c in report["candidates"]}


def nan_copy(exported, out: Path) -> Path:
    """The fp32 graph with one LayerNorm weight set to NaN: it opens and runs, and misses."""
    return changed_copy(exported, out, {"embeddings.LayerNorm.weight": lambda w: w * np.nan})


def negated_copy(exported, out: Path) -> Path:
    """The fp32 graph with its output negated (a Neg node after the last)."""
    import onnx
    from onnx import helper

    model = onnx.load(exported["onnx_path"])
    name = model.graph.output[0].name
    for node in model.graph.node:
        node.output[:] = [f"{o}_pre" if o == name else o for o in node.output]
    model.graph.node.append(helper.make_node("Neg", [f"{name}_pre"], [name]))
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def changed_copy(exported, out: Path, changes: dict) -> Path:
    """The fp32 graph with the initializers `changes` names replaced by what their function
    returns from them."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(exported["onnx_path"])
    for init in model.graph.initializer:
        if init.name in changes:
            new = changes[init.name](numpy_helper.to_array(init)).astype(np.float32)
            init.CopyFrom(numpy_helper.from_array(new, init.name))
    out.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(out))
    return out


def test_only_the_fastest_runtimes_candidates_are_built_and_judged(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    fp32 = exported["onnx_path"]
    ort_later, ov_later = Planned(fp32), Planned(fp32)
    candidates = [
        Candidate(name="fp32", onnx_path=fp32),
        Candidate(name="int8 (planned)", onnx_path="", build=ort_later),
        Candidate(name="fp32 on openvino fp32", onnx_path=fp32, runtime=OPENVINO),
        Candidate(name="ir on openvino fp32", onnx_path="", runtime=OPENVINO, build=ov_later),
    ]
    result, by_name = gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path)

    assert result["chosen"].endswith("on openvino fp32")
    assert ov_later.calls == 1 and ort_later.calls == 0  # ONNX Runtime's planned graph: never built
    assert by_name["ir on openvino fp32"]["throughput"]["speed"] == 100.0
    # ONNX Runtime's first candidate was timed, slower, and not judged; its second never timed.
    assert by_name["fp32"]["judged"] is False and "slower than" in by_name["fp32"]["status"]
    untimed = by_name["int8 (planned)"]
    assert untimed["timed"] is False and untimed["judged"] is False
    assert (
        "not timed: onnxruntime fp32's first candidate ran at 50 against 100" in untimed["status"]
    )
    assert "quantization.prune: false" in untimed["status"]
    assert set(planted[1]["streams"]) == {8}  # throughput: the serving batch at once


def test_when_none_of_the_fastest_runtime_passes_the_next_runtimes_are_judged(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    nan = str(nan_copy(exported, tmp_path / "nan" / "model.onnx"))
    ov_later = Planned(nan)
    ort_later = Planned(exported["onnx_path"])
    candidates = [
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
        Candidate(name="int8 (planned)", onnx_path="", build=ort_later),
        Candidate(name="nan on openvino fp32", onnx_path=nan, runtime=OPENVINO),
        Candidate(name="nan2 on openvino fp32", onnx_path="", runtime=OPENVINO, build=ov_later),
    ]
    result, by_name = gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path)

    assert result["chosen"] in ("fp32", "int8 (planned)")
    assert ov_later.calls == 1 and ort_later.calls == 1
    for name in ("nan on openvino fp32", "nan2 on openvino fp32"):
        assert by_name[name]["misses"], by_name[name]
    assert all(e.get("timed", True) for e in by_name.values())


def missing_first(exported, tmp_path) -> tuple[str, list[Candidate], Planned]:
    """ONNX Runtime's first candidate (a graph that answers NaN: it misses) and its fp32, then
    OpenVINO's fp32 and an IR built only when OpenVINO's candidates are timed: the NaN graph's
    path (to plant its speed), the candidates and the IR's build."""
    fp32 = exported["onnx_path"]
    nan = str(nan_copy(exported, tmp_path / "nan" / "model.onnx"))
    ov_later = Planned(fp32)
    return (
        nan,
        [
            Candidate(name="nan", onnx_path=nan),
            Candidate(name="fp32", onnx_path=fp32),
            Candidate(name="fp32 on openvino fp32", onnx_path=fp32, runtime=OPENVINO),
            Candidate(name="ir on openvino fp32", onnx_path="", runtime=OPENVINO, build=ov_later),
        ],
        ov_later,
    )


def test_a_runtime_whose_first_ran_faster_than_what_passed_is_judged_too(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    """ONNX Runtime's first candidate is the fastest of all and misses; its other passes but is
    slower than OpenVINO's first: OpenVINO's candidates are timed and judged too, and its
    faster one ships (a ViT on an AVX512_BF16 EPYC shipped ONNX Runtime's fp32 at 5 images/s
    with OpenVINO's fp32 on bf16, timed at 10.6, never judged). Its second, no faster than what
    passed, is timed and not judged."""
    nan, candidates, ov_later = missing_first(exported, tmp_path)
    planted[0][(nan, "onnxruntime")] = 200.0
    result, by_name = gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path)

    assert by_name["nan"]["misses"]
    assert not by_name["fp32"]["misses"] and by_name["fp32"].get("judged", True)
    assert result["chosen"] == "fp32 on openvino fp32"
    assert ov_later.calls == 1
    later = by_name["ir on openvino fp32"]
    assert later["judged"] is False and "slower than fp32 on openvino fp32" in later["status"]


def test_a_runtime_whose_first_ran_no_faster_than_what_passed_is_not_timed(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    """The same, with OpenVINO's first slower than ONNX Runtime's candidate that passed: none
    of OpenVINO's is built beyond its first, and the report says against what."""
    nan, candidates, ov_later = missing_first(exported, tmp_path)
    planted[0].update({(nan, "onnxruntime"): 200.0, "onnxruntime": 150.0})
    result, by_name = gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path)

    assert result["chosen"] == "fp32"
    assert ov_later.calls == 0
    untimed = by_name["ir on openvino fp32"]
    assert untimed["timed"] is False
    assert "ran at 100 against 150, the speed of fp32, which passes" in untimed["status"]


def test_a_runtimes_bf16_is_timed_though_its_fp32_ran_slower_than_what_passed(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    """OpenVINO's fp32 candidates run slower than ONNX Runtime's that passes, its bf16 ones
    faster: a precision is searched as a runtime of its own, so bf16 is timed, judged and ships
    (CLIP's image tower on a 2-core AVX512_BF16 EPYC: OpenVINO f32 34 images/s, bf16 80, ONNX
    Runtime's int8 40, which shipped while bf16 went untimed). CI's CPU may lack bf16: the bf16
    candidates are opened and judged at fp32 (their `gate_runtime`), on a copy of the graph
    whose speed is planted; the search keys on the precision they serve at."""
    fp32 = exported["onnx_path"]
    bf16_graph = str(changed_copy(exported, tmp_path / "bf16" / "model.onnx", {}))
    ov_fp32_later, ov_bf16_later = Planned(fp32), Planned(bf16_graph)
    bf16 = {"runtime": OPENVINO_BF16, "gate_runtime": OPENVINO}
    candidates = [
        Candidate(name="fp32", onnx_path=fp32),
        Candidate(name="fp32 on openvino fp32", onnx_path=fp32, runtime=OPENVINO),
        Candidate(name="ir on openvino fp32", onnx_path="", runtime=OPENVINO, build=ov_fp32_later),
        Candidate(name="fp32 on openvino bf16", onnx_path=bf16_graph, **bf16),
        Candidate(name="ir on openvino bf16", onnx_path="", build=ov_bf16_later, **bf16),
    ]
    planted[0].update({"openvino": 30.0, (bf16_graph, "openvino"): 80.0})
    result, by_name = gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path)

    assert result["chosen"].endswith("on openvino bf16")
    assert ov_bf16_later.calls == 1 and ov_fp32_later.calls == 0
    untimed = by_name["ir on openvino fp32"]
    assert untimed["timed"] is False
    assert "openvino fp32's first candidate ran at 30 against 80" in untimed["status"]
    assert "(the first timed: fp32 on openvino fp32;" in untimed["status"]


def test_without_pruning_every_candidate_is_built_and_timed(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    ort_later = Planned(exported["onnx_path"])
    candidates = [
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
        Candidate(name="int8 (planned)", onnx_path="", build=ort_later),
        Candidate(name="fp32 on openvino fp32", onnx_path=exported["onnx_path"], runtime=OPENVINO),
    ]
    _, by_name = gate_on(
        tiny_bert, exported, cfg, sentences_file, candidates, tmp_path, prune=False
    )
    assert ort_later.calls == 1
    assert all("throughput" in e for e in by_name.values())


def test_the_latency_objective_times_one_request_alone(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    candidates = [
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
        Candidate(name="fp32 on openvino fp32", onnx_path=exported["onnx_path"], runtime=OPENVINO),
    ]
    gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path, objective="latency")
    assert set(planted[1]["streams"]) == {1}


@pytest.mark.parametrize("objective", ["throughput", "latency"])
def test_at_one_stream_a_family_is_first_timed_on_its_compressed_weights(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted, objective
):
    """OpenVINO's candidates: its plain export first as planned (30), its int8 (a planned
    graph, 120) after; ONNX Runtime's passes at 50. At many streams the family's first speaks
    for it and int8 is never built; at one stream (the latency objective), where a token reads
    every weight, the family is first timed on the compressed weights, and they ship (the
    gate's one-stream timings of SmolLM2-135M's shape on OpenVINO GenAI bf16: 64.6 tokens/s on
    f32 weights, 84 on int8)."""
    int8_graph = str(changed_copy(exported, tmp_path / "int8" / "model.onnx", {}))
    int8 = Planned(int8_graph)
    candidates = [
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
        Candidate(name="fp32 on openvino fp32", onnx_path=exported["onnx_path"], runtime=OPENVINO),
        Candidate(name="int8 on openvino fp32", onnx_path="", runtime=OPENVINO, build=int8),
    ]
    planted[0].update({"openvino": 30.0, (int8_graph, "openvino"): 120.0})
    result, by_name = gate_on(
        tiny_bert, exported, cfg, sentences_file, candidates, tmp_path, objective=objective
    )
    if objective == "throughput":
        assert result["chosen"] == "fp32" and int8.calls == 0
        assert by_name["int8 on openvino fp32"]["timed"] is False
    else:
        assert result["chosen"] == "int8 on openvino fp32" and int8.calls == 1


def test_a_planned_candidate_whose_build_fails_is_refused_with_why(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    def broken() -> dict:
        return {"onnx_path": "", "error": "building it failed: ValueError: planted"}

    def raises() -> dict:
        raise ValueError("planted: the quantizer does not know the graph")

    candidates = [
        Candidate(name="fp32", onnx_path=exported["onnx_path"]),
        Candidate(name="broken (planned)", onnx_path="", build=broken),
        Candidate(name="raises (planned)", onnx_path="", build=raises),
    ]
    result, by_name = gate_on(tiny_bert, exported, cfg, sentences_file, candidates, tmp_path)
    assert result["chosen"] == "fp32"
    assert by_name["broken (planned)"]["error"] == "building it failed: ValueError: planted"
    assert by_name["raises (planned)"]["error"] == (
        "building it failed: ValueError: planted: the quantizer does not know the graph"
    )


def test_weights_that_miss_by_far_are_not_judged_on_other_settings(
    tiny_bert, exported, cfg, sentences_file, tmp_path, planted
):
    """NaN weights miss by far on ONNX Runtime where other weights on ONNX Runtime (the output
    negated: every embedding points the other way, cosine -1) miss by less: the NaN weights'
    candidate on OpenVINO is not judged, and says why; the export ships."""
    negated = str(negated_copy(exported, tmp_path / "neg" / "model.onnx"))
    nan = str(nan_copy(exported, tmp_path / "nan" / "model.onnx"))
    planted[0].update(onnxruntime=100.0, openvino=50.0)
    fp32 = exported["onnx_path"]
    candidates = [
        Candidate(name="negated", onnx_path=negated, weights="negated"),
        Candidate(name="nan", onnx_path=nan, weights="nan"),
        Candidate(name="nan on openvino fp32", onnx_path=nan, runtime=OPENVINO, weights="nan"),
        Candidate(name="fp32 on openvino fp32", onnx_path=fp32, runtime=OPENVINO, weights="fp32"),
    ]
    result, by_name = gate_on(
        tiny_bert, exported, cfg, sentences_file, candidates, tmp_path, prune=False
    )
    assert by_name["negated"]["metrics"]["min_cosine"] < 0.5  # misses, not by far
    assert by_name["nan"]["misses"] and by_name["nan"].get("judged", True)
    skipped = by_name["nan on openvino fp32"]
    assert skipped["judged"] is False and not skipped["metrics"]
    assert "its weights (nan) miss" in skipped["status"] and "where negated" in skipped["status"]
    assert "validation.judge_all: true" in skipped["status"]
    assert result["chosen"] == "fp32 on openvino fp32"

    # Judging every candidate judges them anyway.
    _, every = gate_on(
        tiny_bert, exported, cfg, sentences_file, candidates, tmp_path / "all", judge_all=True
    )
    assert every["nan on openvino fp32"]["misses"]


@pytest.mark.parametrize(
    ("runtime", "plain", "compressed"),
    [
        ("openvino-genai", "openvino-ir", ["openvino-ir/int8-sym", "openvino-ir/int8"]),
        ("onnxruntime", "fp32/ort-all", ["int8-blockwise/b32/acc4", "dynamic-int8/qint8"]),
    ],
)
def test_at_one_stream_each_plug_ins_plain_weights_go_last(runtime, plain, compressed):
    """The order a family's first timing is tried in, by the plug-ins' own names for their
    uncompressed weights (OpenVINO GenAI's f32 IR; ONNX Runtime's export and its
    graph-optimized copies): last at one stream, as planned at many streams."""
    from types import SimpleNamespace

    from hf2triton.release.search import Search

    on = {"name": runtime, "device": "cpu", "precision": "fp32"}
    planned = [
        Candidate(name=f"{w} on {runtime}", onnx_path="/x", runtime=on, weights=w)
        for w in (plain, *compressed)
    ]
    for objective, first in (("throughput", plain), ("latency", compressed[0])):
        search = Search(gate=SimpleNamespace(objective=objective), candidates=planned)
        order = [c.weights for c in search.leading(planned)]
        assert order[0] == first and sorted(order) == sorted([plain, *compressed])


def test_quantized_activations_are_a_family_of_their_own():
    """Under the latency objective OpenVINO GenAI's dq32 candidates are searched as families of
    their own: quantized activations change how every compressed layer computes, so one
    family's timing says nothing of the other's."""
    from hf2triton.release.search import family

    base = {"name": "openvino-genai", "device": "cpu", "precision": "bf16", "kv_cache": "u8"}
    plain = Candidate(name="a", onnx_path="/x", runtime={**base, "dynamic_quantization": 0})
    grouped = Candidate(name="b", onnx_path="/x", runtime={**base, "dynamic_quantization": 32})
    assert family(plain) == "openvino-genai bf16"
    assert family(grouped) == "openvino-genai bf16 dq32"
    assert family(Candidate(name="fp32", onnx_path="/x")) == "onnxruntime fp32"
