"""Translation releases end to end on tiny random-weight models (an M2M100 and a Marian
translator built once per module): real export, quantization, gate, MLflow (SQLite), and a real
Triton server on free ports. The served greedy translation of every validation sentence must
equal PyTorch `generate`."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from hf2triton.errors import SpecError
from hf2triton.kinds.translation import GenerationSpec
from hf2triton.spec import load_spec, parse_spec
from tests.kinds.kind_release import ODD, RELEASES, SPEC_BASE, release, report_path
from tests.tiny_models import SEQ2SEQ_CORPUS, build_tiny_m2m100, build_tiny_marian


@pytest.fixture(scope="module")
def translation_release(tmp_path_factory):
    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("translation-release")
    model_dir = build_tiny_m2m100(tmp / "tiny-m2m100")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            spec, ports, summary = release(
                tmp,
                model_dir,
                "tiny-translator",
                "translation",
                generation={
                    "target_lang": "sw",
                    "max_new_tokens": 20,
                    "num_beams": 2,
                    # int8 ships only if it translates exactly as PyTorch does
                    "thresholds": {"min_bleu": 100.0, "min_chrf": 100.0},
                },
            )
            yield {
                "spec": spec,
                "ports": ports,
                "summary": summary,
                "model_dir": model_dir,
                "home": tmp / "home",
            }
        finally:
            triton_local.stop_server()


@pytest.fixture(scope="module")
def marian_release(tmp_path_factory):
    """A Marian en-de translator (tied embeddings, a zero logits bias) with a plain translation
    spec, as a new user tries one: every runtime this CPU offers."""
    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("marian-release")
    model_dir = build_tiny_marian(tmp / "tiny-marian")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            spec, ports, summary = release(tmp, model_dir, "tiny-marian", "translation")
            yield {
                "spec": spec,
                "ports": ports,
                "summary": summary,
                "model_dir": model_dir,
                "home": tmp / "home",
            }
        finally:
            triton_local.stop_server()


def _translate(url: str, model: str, texts: list[str], **params) -> list[str]:
    client = grpcclient.InferenceServerClient(url=url)
    data = np.array([[t.encode()] for t in texts], dtype=np.object_)
    inputs = [grpcclient.InferInput("TEXT", list(data.shape), "BYTES")]
    inputs[0].set_data_from_numpy(data)
    for name, value in params.items():
        if isinstance(value, str):
            arr = np.array([[value.encode()]] * len(texts), dtype=np.object_)
            x = grpcclient.InferInput(name, list(arr.shape), "BYTES")
        else:
            arr = np.full((len(texts), 1), value, dtype=np.int32)
            x = grpcclient.InferInput(name, list(arr.shape), "INT32")
        x.set_data_from_numpy(arr)
        inputs.append(x)
    out = client.infer(model, inputs).as_numpy("TRANSLATION")
    return [row[0].decode() for row in out]


def _torch_translations(rel, texts, **overrides):
    from hf2triton.kinds.translation import TorchTranslator
    from hf2triton.spec import kind_for

    cfg = kind_for(rel["spec"]).resolve(rel["model_dir"])
    ref = TorchTranslator(rel["model_dir"], cfg)
    kwargs = {"num_beams": 1, "max_new_tokens": 20, **overrides}
    import torch

    enc = ref.tokenizer(texts, padding=True, truncation=True, max_length=64, return_tensors="pt")
    s = cfg.settings
    with torch.inference_mode():
        ids = ref.model.generate(
            **enc,
            do_sample=False,
            forced_bos_token_id=kwargs.pop("forced_bos_token_id", s.forced_bos_token_id),
            **kwargs,
        )
    return ref.decode(ids.tolist()), ref


def test_translation_release_serves_pytorch_greedy_output_for_every_sentence(translation_release):
    rel = translation_release
    summary = rel["summary"]
    url = f"127.0.0.1:{rel['ports']['grpc_port']}"
    texts = list(dict.fromkeys(SEQ2SEQ_CORPUS + ODD))
    want, _ = _torch_translations(rel, texts)
    one_by_one = [_translate(url, "tiny-translator", [t], NUM_BEAMS=1)[0] for t in texts]
    assert one_by_one == want
    assert _translate(url, "tiny-translator", texts[:8], NUM_BEAMS=1) == want[:8]
    assert len(set(want)) > len(texts) // 2  # the fixture's output depends on its input
    report = json.loads(Path(report_path(rel)).read_text())
    print(
        "translation gate:",
        json.dumps({c["name"]: c["metrics"] for c in report["candidates"]}),
        "ships",
        summary["variant"],
    )
    assert summary["metrics"]["smoke_bleu"] == 100.0  # served = PyTorch, as the gate demanded


@pytest.mark.e2e
def test_a_marian_translator_releases_on_the_fastest_candidate_and_serves_pytorch_output(
    marian_release,
):
    rel = marian_release
    report = json.loads(Path(report_path(rel)).read_text())
    names = [c["name"] for c in report["candidates"]]
    assert "fp32 on openvino fp32" in names  # the candidate that crashed the release before
    by_name = {c["name"]: c for c in report["candidates"]}
    assert "error" not in by_name["fp32 on openvino fp32"]
    assert rel["summary"]["variant"] == report["chosen"]
    # The fastest timed candidate that passes ships (the pruned search leaves slower runtimes'
    # other candidates untimed: they say so).
    passing = [c for c in report["candidates"] if not c["misses"] and "throughput" in c]
    assert by_name[report["chosen"]]["throughput"]["speed"] == max(
        c["throughput"]["speed"] for c in passing
    )
    untimed = [c for c in report["candidates"] if "throughput" not in c and not c.get("error")]
    assert all("not timed" in c["status"] for c in untimed), untimed
    texts = list(dict.fromkeys(SEQ2SEQ_CORPUS + ODD))
    want, _ = _torch_translations(rel, texts)
    url = f"127.0.0.1:{rel['ports']['grpc_port']}"
    served = [_translate(url, "tiny-marian", [t], NUM_BEAMS=1, MAX_NEW_TOKENS=20)[0] for t in texts]
    same = sum(a == b for a, b in zip(served, want))
    # The gate's limits (BLEU/chrF against PyTorch) allow a quantized candidate to differ a
    # little; an fp32 one serves PyTorch's translation of every sentence.
    if "int8" not in rel["summary"]["variant"]:
        assert served == want
    assert same >= len(texts) * 0.8 and len(set(want)) > len(texts) // 2


class _Lines(logging.Handler):
    """The messages a logger tree emits (Prefect's handlers may hold a stream another test's
    capture replaced, so its console output is not read here)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@pytest.mark.e2e
def test_a_first_candidate_that_passes_by_a_hair_is_not_shipped_the_next_one_is(
    tmp_path, monkeypatch
):
    """A Marian translator on ONNX Runtime: its int8 graph is judged first (the spec's own
    variant; with one runtime the gate takes candidates in order, so no timing decides). With
    min_chrf just under int8's measured chrF, int8 meets the limit by a hair but its bootstrap
    bound does not: it is borderline, the report and the log say by how much, and the fp32
    graph ships, then passes the smoke test against its own recorded answers."""
    from hf2triton.targets import triton_local

    monkeypatch.setenv("HF2TRITON_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    model_dir = build_tiny_marian(tmp_path / "tiny-marian")
    onnxruntime_only = {"runtime__candidates": [{"name": "onnxruntime", "precision": "fp32"}]}
    said = _Lines()  # what the second release logs, read below
    try:
        # First with no limit to meet: int8 ships, and the gate measures its chrF.
        _, ports, first = release(
            tmp_path,
            model_dir,
            "marian-hair",
            "translation",
            generation={"max_new_tokens": 20, "thresholds": {"min_bleu": 0.0, "min_chrf": 0.0}},
            **onnxruntime_only,
        )
        assert first["variant"].startswith("dynamic-int8"), first["variant"]
        int8 = first["metrics"]
        assert int8["exact_match"] < 1.0  # int8 differs from PyTorch somewhere: it has a spread
        limit = round(int8["chrf"] - 0.3, 3)
        for name in ("prefect.task_runs", "hf2triton"):
            logging.getLogger(name).addHandler(said)
        _, _, second = release(
            tmp_path,
            model_dir,
            "marian-hair",
            "translation",
            ports,
            generation={"max_new_tokens": 20, "thresholds": {"min_bleu": 0.0, "min_chrf": limit}},
            **onnxruntime_only,
        )
    finally:
        for name in ("prefect.task_runs", "hf2triton"):
            logging.getLogger(name).removeHandler(said)
        triton_local.stop_server()
    assert second["variant"] == "fp32", second["variant"]
    assert second["mlflow"]["version"] == "2"
    latest = max(
        (tmp_path / "home" / "work").rglob("validation_report.json"),
        key=lambda p: p.stat().st_mtime,
    )
    report = json.loads(latest.read_text())
    entry = next(c for c in report["candidates"] if c["name"].startswith("dynamic-int8"))
    border = entry["borderline"]["chrf"]
    assert border["bound"] < limit <= border["value"] == pytest.approx(int8["chrf"])
    assert entry["misses"] == {"margin.chrf": pytest.approx(limit - border["bound"])}
    assert report["chosen"] == "fp32"
    border_lines = [line for line in said.lines if "is borderline" in line]
    assert border_lines and "chrf" in border_lines[0] and f"meets {limit}" in border_lines[0], (
        said.lines
    )


def test_translation_default_decoding_is_pytorch_beam_search(translation_release):
    rel = translation_release
    url = f"127.0.0.1:{rel['ports']['grpc_port']}"
    texts = list(dict.fromkeys(SEQ2SEQ_CORPUS))[:8]  # max_batch_size
    want, _ = _torch_translations(rel, texts, num_beams=2)
    assert _translate(url, "tiny-translator", texts) == want


def test_translation_per_request_parameters(translation_release):
    rel = translation_release
    url = f"127.0.0.1:{rel['ports']['grpc_port']}"
    texts = ["the quick brown fox jumps over the lazy dog", "we need more time"]
    short, ref = _torch_translations(rel, texts, max_new_tokens=3)
    assert _translate(url, "tiny-translator", texts, NUM_BEAMS=1, MAX_NEW_TOKENS=3) == short
    french, _ = _torch_translations(rel, texts, forced_bos_token_id=ref.tokenizer.get_lang_id("fr"))
    assert _translate(url, "tiny-translator", texts, NUM_BEAMS=1, TARGET_LANG="fr") == french
    with pytest.raises(InferenceServerException, match="TARGET_LANG 'xx'"):
        _translate(url, "tiny-translator", texts, TARGET_LANG="xx")
    with pytest.raises(InferenceServerException, match="MAX_NEW_TOKENS 100000"):
        _translate(url, "tiny-translator", texts, MAX_NEW_TOKENS=100000)
    # A bad request does not break the next one.
    assert _translate(url, "tiny-translator", texts, NUM_BEAMS=1, MAX_NEW_TOKENS=3) == short


def test_translation_concurrent_requests_are_answered_like_single_ones(translation_release):
    rel = translation_release
    url = f"127.0.0.1:{rel['ports']['grpc_port']}"
    texts = list(dict.fromkeys(SEQ2SEQ_CORPUS))[:16]
    want, _ = _torch_translations(rel, texts)
    got: dict[int, str] = {}
    errors: list[str] = []

    def worker(i: int) -> None:
        try:
            got[i] = _translate(url, "tiny-translator", [texts[i]], NUM_BEAMS=1)[0]
        except Exception as exc:  # any failure is a wrong answer
            errors.append(repr(exc))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert [got[i] for i in range(len(texts))] == want


def test_the_generation_section_is_checked():
    base = SPEC_BASE
    assert parse_spec({**base, "task": "translation"}).task_section == GenerationSpec()
    with pytest.raises(SpecError, match="does not read the section"):
        parse_spec({**base, "task": "translation", "classification": {}})
    with pytest.raises(SpecError, match="unknown key 'generation.beams'"):
        parse_spec({**base, "task": "translation", "generation": {"beams": 4}})
    with pytest.raises(SpecError, match="generation.num_beams"):
        parse_spec({**base, "task": "translation", "generation": {"num_beams": 0}})


def test_the_seed_translation_spec_is_valid():
    spec = load_spec(RELEASES / "m2m100-en-sw.yaml")
    assert spec.source.repo_id and spec.source.revision
    assert spec.task == "translation"


def test_a_file_that_does_not_survive_quantization_ships_fp32(
    translation_release, tmp_path, monkeypatch
):
    import hashlib

    from onnxruntime import quantization

    from hf2triton.kinds.translation import serving_files
    from hf2triton.runtimes.quantizers import quantize_onnx
    from hf2triton.serving.seq2seq import Seq2SeqModel
    from hf2triton.spec import QuantizationSpec

    export_dir = next(
        p.parent
        for p in (translation_release["home"] / "work").rglob("encoder_model.onnx")
        if p.parent.parent.name == "export"
    )
    real = quantization.quantize_dynamic

    def breaks_on_decoder_with_past(src, target, **kwargs):
        if Path(src).name == "decoder_with_past_model.onnx":
            raise RuntimeError("Unsupported op in graph")  # as ORT reports such graphs
        return real(src, target, **kwargs)

    monkeypatch.setattr(quantization, "quantize_dynamic", breaks_on_decoder_with_past)
    result = quantize_onnx(str(export_dir), QuantizationSpec(), str(tmp_path))
    assert list(result["fallbacks"]) == ["decoder_with_past_model.onnx"]
    assert "Unsupported op" in result["fallbacks"]["decoder_with_past_model.onnx"]
    assert result["method"].endswith("/1-files-fp32")
    sha = lambda p: hashlib.sha256(Path(p).read_bytes()).hexdigest()  # noqa: E731
    out = Path(result["onnx_path"])
    assert sha(out / "decoder_with_past_model.onnx") == sha(
        export_dir / "decoder_with_past_model.onnx"
    )
    assert sha(out / "encoder_model.onnx") != sha(export_dir / "encoder_model.onnx")
    # The mixed int8/fp32 set still generates.
    cfg = json.loads(
        (
            translation_release["home"]
            / "triton"
            / "models"
            / "tiny-translator"
            / "1"
            / "serving.json"
        ).read_text()
    )
    from hf2triton.serving.seq2seq import DecodeSettings

    ids = Seq2SeqModel(serving_files(out)).generate(
        [[101, 40, 2]], DecodeSettings.from_dict(cfg["decode"]).with_request(num_beams=1), 1
    )
    assert len(ids[0]) > 1
