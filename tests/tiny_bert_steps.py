"""What the step tests share (test_export, test_quantizers, test_gate): a tiny real BERT exported
once per session as the release exports it, its int8 variant, validation sentences with odd
ones, and the gate called as the validate step calls it. Test modules import the fixtures."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from hf2triton.kinds import Data
from hf2triton.kinds.embedding import EmbeddingConfig, resolve_embedding_config
from hf2triton.kinds.embedding import EmbeddingThresholds as Thresholds
from hf2triton.release.export import export_model
from hf2triton.release.gate import GateSettings
from hf2triton.release.gate import run_gate as gate
from hf2triton.release.plan import Gate
from hf2triton.runtimes.quantizers import quantize_onnx
from hf2triton.sources import fetch_model, parse_source
from hf2triton.spec import ExportSpec, QuantizationSpec, kind_for, parse_spec
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


def embedding_kind(
    model_dir: Path | str,
    sentences: Path | str = "unused.txt",
    thresholds: Thresholds | None = None,
    smoke: int = 8,
):
    return kind_for(
        parse_spec(
            {
                "name": "tiny",
                "source": {"path": str(model_dir)},
                "registry": {"model_name": "tiny"},
                "embedding": {"thresholds": (thresholds or Thresholds()).model_dump()},
                "validation": {"sentences": str(sentences), "smoke_sentences": smoke},
            }
        )
    )


def do_export(model_dir: Path, work: Path, atol: float = 1e-3, cfg: EmbeddingConfig | None = None):
    src = fetch_model(parse_source(dict(path=str(model_dir))))
    return export_model(
        embedding_kind(model_dir),
        src,
        ExportSpec(opset=18, atol=atol),
        cfg or resolve_embedding_config(model_dir),
        Data(SENTENCES),
        str(work),
    )


def served(model_dir, exported, onnx_path, cfg):
    """The serving core's embedder on `onnx_path`, with the export's tokenizer.json."""
    kind = embedding_kind(model_dir)
    return kind.open_candidate(
        str(onnx_path), exported["export_dir"], kind.serving_json(cfg, exported["export_dir"])
    )


def compare_with_torch(model_dir, onnx_path, cfg, texts) -> float:
    return embedding_kind(model_dir).check_export(
        str(model_dir), Path(onnx_path).parent, cfg, texts
    )["max_abs_diff"]


@pytest.fixture(scope="session")
def work(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("work")


@pytest.fixture(scope="session")
def cfg(tiny_bert) -> EmbeddingConfig:
    return resolve_embedding_config(tiny_bert)


@pytest.fixture(scope="session")
def exported(tiny_bert, work):
    return do_export(tiny_bert, work)


@pytest.fixture(scope="session")
def int8(exported, work):
    return quantize_onnx(exported["onnx_path"], QuantizationSpec(), str(work))


@pytest.fixture(scope="session")
def sentences_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("data") / "validation.txt"
    path.write_text("\n".join(SENTENCES) + "\n", encoding="utf-8")  # "" becomes a blank line
    return path


def run_gate(tiny_bert, exported, cfg, sentences_file, candidates, thresholds, work, smoke=8):
    kind = embedding_kind(tiny_bert, sentences_file, thresholds, smoke)
    return gate(
        Gate.of(kind, cfg, kind.read_data(), exported["export_dir"], GateSettings(batch=8)),
        candidates,
        model_dir=str(tiny_bert),
        work_root=str(work),
    )


def leftovers(step_dir: Path) -> list[str]:
    return sorted(p.name for p in step_dir.iterdir() if p.name.endswith(".tmp"))


def saved_apart(onnx_path: str, graph: Path) -> Path:
    """The graph at `onnx_path` saved as `graph` with every tensor in `<graph name>.data`
    beside it, as ONNX saves a graph over 2 GB."""
    import onnx

    graph.parent.mkdir()
    onnx.save(
        onnx.load(onnx_path),
        str(graph),
        save_as_external_data=True,
        location=f"{graph.name}.data",
        size_threshold=0,
    )
    return graph
