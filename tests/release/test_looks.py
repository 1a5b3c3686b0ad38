"""The gate's sample sized by its bounds (hf2triton/kinds/margin.py `looks`, judge.score_runs), on
a tiny real Llama exported to ONNX and judged through the serving core against PyTorch: a
candidate that agrees with PyTorch everywhere, and one that parts from it at once, are each
settled on the first 10 prompts, and PyTorch is asked for no more; where the first prompts leave
the verdict open, PyTorch answers the next ones (computed once, in the work folder) and the
candidate is judged on them too, with the same answers as one run over every prompt."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from hf2triton.kinds import Candidate
from tests.tiny_models import CORPUS, build_tiny_llama

PROMPTS = [*dict.fromkeys(CORPUS), "a", "ok then", "the end of it", "why", "one two three"]
PROMPTS += [f"number {i} of the list" for i in range(24 - len(PROMPTS))]


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    import torch

    from hf2triton.kinds.base import save_fast_tokenizer
    from hf2triton.release.export import optimum_export

    torch.set_num_threads(1)  # a tiny model on a shared 2-core machine
    tmp = tmp_path_factory.mktemp("looks")
    model_dir = build_tiny_llama(tmp / "llama")
    out = tmp / "onnx"
    optimum_export(str(model_dir), out, "text-generation-with-past", 17, "model.onnx")
    save_fast_tokenizer(str(model_dir), out)
    prompts = tmp / "prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    return {"model_dir": model_dir, "out": out, "prompts": prompts, "tmp": tmp}


def _nan_copy(llama) -> Path:
    """The fp32 graph with its final norm's weight NaN: it opens and runs, and misses."""
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(llama["out"] / "model.onnx"))
    norm = next(i for i in model.graph.initializer if i.name.endswith("norm.weight"))
    norm.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(norm) * np.nan, norm.name))
    out = llama["tmp"] / "nan" / "model.onnx"
    out.parent.mkdir(exist_ok=True)
    onnx.save(model, str(out))
    return out


def _gate(llama, candidates, work: Path):
    from hf2triton.release.gate import run_gate
    from hf2triton.release.plan import Gate, GateSettings
    from hf2triton.spec import kind_for, parse_spec

    kind = kind_for(
        parse_spec(
            {
                "name": "tiny-llama",
                "task": "text-generation",
                "source": {"path": str(llama["model_dir"])},
                "registry": {"model_name": "tiny-llama"},
                "validation": {"sentences": str(llama["prompts"]), "smoke_sentences": 4},
                "text_generation": {"max_new_tokens": 12, "gate_tokens": 12},
            }
        )
    )
    cfg = kind.resolve(str(llama["model_dir"]))
    gate = Gate.of(kind, cfg, kind.read_data(), str(llama["out"]), GateSettings(batch=8))
    assert gate.looks == (10, 20, 24)
    # the looks take the file in a seeded shuffle: each prefix a random sample, every run alike
    assert gate.gate_data.items != PROMPTS and sorted(gate.gate_data.items) == sorted(PROMPTS)
    result = run_gate(gate, candidates, model_dir=str(llama["model_dir"]), work_root=str(work))
    report = json.loads(Path(result["report_path"]).read_text(encoding="utf-8"))
    return gate, result, {c["name"]: c for c in report["candidates"]}


def _reference_sizes(work: Path) -> list[int]:
    return sorted(
        len(json.loads(p.read_text())) for p in (work / "reference").glob("*/reference.json")
    )


def test_clear_candidates_are_settled_on_the_first_prompts_and_pytorch_answers_no_more(
    llama, tmp_path
):
    fp32 = str(llama["out"] / "model.onnx")
    candidates = [
        Candidate(name="nan", onnx_path=str(_nan_copy(llama))),
        Candidate(name="fp32", onnx_path=fp32),
    ]
    gate, result, entries = _gate(llama, candidates, tmp_path)
    assert result["chosen"] == "fp32"
    assert entries["fp32"]["items"] == 10 and not entries["fp32"]["misses"]
    assert entries["fp32"]["metrics"]["next_token_agreement"] == 1.0
    assert entries["nan"]["items"] == 10 and entries["nan"]["misses"]
    assert _reference_sizes(tmp_path) == [10]  # PyTorch generated for 10 of the 24 prompts
    # the smoke test's prompts are among those PyTorch answered
    assert all(i < 10 for i in gate.smoke_index)


def test_an_open_verdict_asks_pytorch_for_the_next_prompts_and_judges_them_too(
    llama, tmp_path, monkeypatch
):
    """The early looks' verdict is held open here (a stand-in for `settled`, which its own
    tests in tests/kinds/test_margin.py cover): what is real is the growth, PyTorch's answers on
    the next prompts computed in the work folder and the candidate judged on all of them."""
    from hf2triton.release import judge
    from hf2triton.release.gate import pytorch_reference

    monkeypatch.setattr(judge, "settled", lambda *args: None)
    fp32 = str(llama["out"] / "model.onnx")
    gate, result, entries = _gate(llama, [Candidate(name="fp32", onnx_path=fp32)], tmp_path)
    assert result["chosen"] == "fp32" and entries["fp32"]["items"] == 24
    assert entries["fp32"]["metrics"]["next_token_agreement"] == 1.0
    assert _reference_sizes(tmp_path) == [4, 10, 10]  # three looks' prompts, once each
    # the looks' answers are one run's over every prompt
    whole = gate.kind.reference(str(llama["model_dir"]), gate.cfg, gate.gate_data)
    grown = pytorch_reference(gate, str(llama["model_dir"]), str(tmp_path)).upto(24)
    assert [r["ids"] for r in grown.outputs] == [r["ids"] for r in whole]
