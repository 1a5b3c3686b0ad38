"""A release of a tiny random-weight model for the kinds' end-to-end tests: real export,
quantization, gate, MLflow (SQLite), and a real Triton server on free ports, validated on the
translation corpus and a few odd lines."""

from __future__ import annotations

import json
from pathlib import Path

from hf2triton.spec import load_spec
from tests.conftest import free_port, tiny_spec
from tests.tiny_models import SEQ2SEQ_CORPUS

# The smallest spec a kind's section is parsed into, and where the shipped specs lie.
SPEC_BASE = {
    "name": "x",
    "source": {"path": "/m"},
    "validation": {"sentences": "s.txt"},
    "registry": {"model_name": "x"},
}
RELEASES = Path(__file__).resolve().parents[2] / "releases"

ODD = [
    "a",
    "ok",
    "prices rose 12.5% to $43,210 on tuesday!",
    "ÄÖÜ ß straße 😀",
    "word " * 90,
]  # the last is cut at the model's 64 positions


def release(tmp, model_dir: Path, name: str, task: str, ports=None, **overrides):
    from hf2triton.flows.release import release_model

    ports = ports or {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    spec_path = tiny_spec(
        tmp / f"{name}.yaml",
        model_dir,
        ports,
        name=name,
        task=task,
        embedding=None,
        registry__model_name=name,
        source__model_id=f"fixtures/{name}",
        **overrides,
    )
    sentences = tmp / f"{name}-sentences.txt"
    sentences.write_text("\n".join(dict.fromkeys(SEQ2SEQ_CORPUS + ODD)) + "\n", encoding="utf-8")
    import yaml

    data = yaml.safe_load(spec_path.read_text())
    data["validation"]["sentences"] = str(sentences)
    data["validation"]["smoke_sentences"] = 12
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(spec_path)
    return spec, ports, release_model(spec)


def report_path(rel: dict) -> str:
    """The newest validation report of a release fixture's work folder."""
    found = sorted((rel["home"] / "work").rglob("validation_report.json"))
    return str(found[-1])


def report(rel: dict) -> dict:
    return json.loads(Path(report_path(rel)).read_text())
