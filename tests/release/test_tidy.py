"""The tidy step (hf2triton/release/tidy.py): the step folders of the graphs the gate built and
did not ship go; the shipped one, the export, each runtime's first variant and the gate's
evidence stay while the work folder is within twice what ships (or what ships plus 512 MB);
over it, the unshipped export and first variants go, largest first; what was removed and kept
is counted."""

from __future__ import annotations

from pathlib import Path

from hf2triton.release.tidy import tidy_work


def step(work: Path, name: str, key: str, size: int) -> Path:
    folder = work / name / key
    folder.mkdir(parents=True)
    (folder / "model.onnx").write_bytes(b"\0" * size)
    (folder / "done.json").write_text("{}")
    return folder / "model.onnx"


def test_unshipped_graphs_the_gate_built_are_removed_and_counted(tmp_path):
    work = tmp_path / "work"
    export = step(work, "export", "a" * 16, 1000)
    first = step(work, "quantize", "b" * 16, 300)
    shipped = step(work, "quantize", "c" * 16, 200)
    other = step(work, "optimize", "d" * 16, 400)
    evidence = step(work, "validate", "e" * 16, 10)
    val = {"onnx_path": str(shipped), "built": [str(shipped), str(other)]}

    tidied = tidy_work(str(work), val, [str(export), str(first), str(shipped)], 200)  # type: ignore[arg-type]

    assert not other.parent.exists()
    assert all(p.is_file() for p in (export, first, shipped, evidence))
    assert tidied["removed_bytes"] == 400 + 2
    kept = sum(p.stat().st_size for p in work.rglob("*") if p.is_file())
    assert tidied["work_bytes"] == kept
    assert not [p for p in work.rglob("*.tmp")]  # nothing half-removed left behind
    assert tidied["rebuilt_on_rerun"] == []  # 1.5 KB is within 200 B + 512 MB


def test_over_twice_what_ships_the_unshipped_export_goes_first(tmp_path, monkeypatch):
    """multilingual-e5-large's case: a 2.1 GB fp32 export beside the 0.8 GB int8 graph that
    ships (and ONNX Runtime's 0.55 GB int8, timed and not shipped) is 4.2x what ships. The
    export goes, largest first, and then the folder is within 2x: the int8 variant stays."""
    monkeypatch.setattr("hf2triton.release.tidy.REUSE_ALLOWANCE", 100)
    work = tmp_path / "work"
    export = step(work, "export", "a" * 16, 2100)
    ort_int8 = step(work, "quantize", "b" * 16, 550)
    shipped = step(work, "openvino-int8", "c" * 16, 800)
    evidence = step(work, "validate", "e" * 16, 10)
    val = {"onnx_path": str(shipped), "built": [str(shipped)]}

    tidied = tidy_work(str(work), val, [str(export), str(ort_int8), str(shipped)], 800)  # type: ignore[arg-type]

    assert not export.parent.exists()
    assert all(p.is_file() for p in (ort_int8, shipped, evidence))
    assert tidied["rebuilt_on_rerun"] == ["export"]
    assert tidied["removed_bytes"] == 2100 + 2
    assert tidied["work_bytes"] <= 2 * 800 < tidied["work_bytes"] + 550


def test_the_shipped_graph_is_kept_whatever_the_budget(tmp_path, monkeypatch):
    monkeypatch.setattr("hf2triton.release.tidy.REUSE_ALLOWANCE", 0)
    work = tmp_path / "work"
    export = step(work, "export", "a" * 16, 5000)  # fp32 shipped: the export itself
    evidence = step(work, "validate", "e" * 16, 9000)
    tidied = tidy_work(str(work), {"onnx_path": str(export), "built": []}, [str(export)], 5002)  # type: ignore[arg-type]
    assert export.is_file() and evidence.is_file()
    assert tidied == {"removed_bytes": 0, "work_bytes": 14004, "rebuilt_on_rerun": []}


def test_a_built_path_outside_the_work_folder_is_never_touched(tmp_path):
    outside = tmp_path / "elsewhere" / "model.onnx"
    outside.parent.mkdir()
    outside.write_bytes(b"x")
    work = tmp_path / "work"
    shipped = step(work, "quantize", "c" * 16, 5)
    tidy_work(str(work), {"onnx_path": str(shipped), "built": [str(outside)]})  # type: ignore[arg-type]
    assert outside.is_file() and shipped.is_file()


def test_a_rerun_makes_the_removed_graphs_again_and_reuses_the_gates_verdict(
    tiny_bert, cfg, sentences_file, tmp_path, monkeypatch
):
    """What the tidy step promises a re-run: the export and the int8 graph it removed over
    budget are made again with the same bytes in the same places, so the gate's verdict (keyed
    by both) is reused, not judged again."""
    from hf2triton.kinds import Candidate
    from hf2triton.runtimes.quantizers import quantize_onnx
    from hf2triton.spec import QuantizationSpec
    from tests.tiny_bert_steps import LENIENT, do_export, run_gate, sha256

    def steps():
        exp = do_export(tiny_bert, work)
        int8 = quantize_onnx(exp["onnx_path"], QuantizationSpec(), str(work))
        cands = [Candidate(name=m["method"], onnx_path=m["onnx_path"]) for m in (int8,)]
        cands.append(Candidate(name="fp32", onnx_path=exp["onnx_path"]))
        return exp, int8, run_gate(tiny_bert, exp, cfg, sentences_file, cands, LENIENT, work)

    monkeypatch.setattr("hf2triton.release.tidy.REUSE_ALLOWANCE", 0)
    work = tmp_path / "work"
    exp, int8, val = steps()
    assert val["onnx_path"] == int8["onnx_path"]  # int8 ships; the fp32 export does not
    before = {p: sha256(p) for p in (exp["onnx_path"], int8["onnx_path"])}
    tidied = tidy_work(str(work), val, [exp["onnx_path"], int8["onnx_path"]], 1)
    assert tidied["rebuilt_on_rerun"] == ["export"] and not Path(exp["onnx_path"]).exists()

    exp2, int82, val2 = steps()
    assert exp2["reused"] is False and exp2["onnx_path"] == exp["onnx_path"]
    assert {p: sha256(p) for p in (exp2["onnx_path"], int82["onnx_path"])} == before
    assert val2["reused"] is True and val2["onnx_path"] == val["onnx_path"]
