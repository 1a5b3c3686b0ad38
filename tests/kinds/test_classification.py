"""Text-classification releases end to end on a tiny random-weight BERT classifier (built once
per module): real export, quantization, gate, MLflow (SQLite), and a real Triton server on free
ports. The served labels must equal PyTorch's, and the OpenAI-compatible API's /predict answers
every label with PyTorch's score."""

from __future__ import annotations

import json

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from hf2triton.errors import SpecError
from hf2triton.spec import load_spec, parse_spec
from tests.kinds.kind_release import ODD, RELEASES, SPEC_BASE, release
from tests.tiny_models import SEQ2SEQ_CORPUS, build_tiny_classifier


@pytest.fixture(scope="module")
def classification_release(tmp_path_factory):
    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("classification-release")
    model_dir = build_tiny_classifier(tmp / "tiny-classifier")
    labelled = tmp / "labelled.tsv"
    labelled.write_text(
        "the team won the match after extra time\tpositive\n"
        "the server returned an error when the disk was full\tnegative\n"
        "new york is a large city\tneutral\n",
        encoding="utf-8",
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            spec, ports, summary = release(
                tmp,
                model_dir,
                "tiny-classifier",
                "text-classification",
                classification={
                    "labelled": str(labelled),
                    "thresholds": {"min_label_agreement": 1.0, "max_prob_diff": 0.001},
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


def test_classification_release_serves_pytorch_labels(classification_release):
    rel = classification_release
    from hf2triton.kinds.classification import TorchClassifier, resolve_classification_config
    from hf2triton.serving.classification import activate

    texts = list(dict.fromkeys(SEQ2SEQ_CORPUS + ODD))
    cfg = resolve_classification_config(rel["model_dir"])
    probs = activate(
        TorchClassifier(rel["model_dir"], cfg.max_length).all_logits(texts), cfg.activation
    )
    want = [cfg.labels[i] for i in probs.argmax(axis=1)]
    assert len(set(want)) > 1
    client = grpcclient.InferenceServerClient(url=f"127.0.0.1:{rel['ports']['grpc_port']}")
    data = np.array([[t.encode()] for t in texts], dtype=np.object_)
    labels, scores = [], []
    for i in range(0, len(texts), 8):  # max_batch_size of the fixture spec
        x = grpcclient.InferInput("TEXT", [len(data[i : i + 8]), 1], "BYTES")
        x.set_data_from_numpy(data[i : i + 8])
        res = client.infer("tiny-classifier", [x])
        labels += [r[0].decode() for r in res.as_numpy("LABEL")]
        scores.append(res.as_numpy("SCORES"))
    assert labels == want
    assert np.abs(np.concatenate(scores) - probs).max() < 1e-3
    summary = rel["summary"]
    assert summary["metrics"]["label_agreement"] == 1.0
    assert "accuracy" in summary["metrics"]
    print("classification gate:", json.dumps(summary["metrics"]), "ships", summary["variant"])
    # text-embeddings-inference's /predict beside it: every label with its score, best first
    import urllib.request

    api = summary["endpoint"]["openai"].removesuffix("/v1")
    req = urllib.request.Request(
        f"{api}/predict",
        data=json.dumps({"inputs": texts[:5], "model": "tiny-classifier"}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as r:
        answer = json.loads(r.read())
    for row, labelled in enumerate(answer):
        assert [item["label"] for item in labelled][0] == want[row]
        assert sorted(item["label"] for item in labelled) == sorted(cfg.labels)
        for item in labelled:
            assert abs(item["score"] - probs[row, cfg.labels.index(item["label"])]) < 1e-3


def test_the_classification_section_is_checked():
    base = SPEC_BASE
    with pytest.raises(SpecError, match="does not read the section"):
        parse_spec({**base, "task": "text-classification", "embedding": {"pooling": "cls"}})
    with pytest.raises(SpecError, match="needs gold labels"):
        parse_spec(
            {
                **base,
                "task": "text-classification",
                "classification": {"thresholds": {"min_accuracy": 0.9}},
            }
        )


def test_labelled_texts_without_a_label_are_refused_before_any_step(tmp_path):
    """`classification.labelled` is read up front (as the CLI does before the first step): a
    line without its TAB and label is named then, not after the export."""
    from hf2triton.spec import kind_for

    (tmp_path / "s.txt").write_text("a text\n")
    (tmp_path / "labelled.tsv").write_text("great film\tpositive\nawful film negative\n")
    spec = parse_spec(
        {
            **SPEC_BASE,
            "task": "text-classification",
            "validation": {"sentences": str(tmp_path / "s.txt")},
            "classification": {"labelled": str(tmp_path / "labelled.tsv")},
        }
    )
    with pytest.raises(SpecError, match=r"labelled.tsv' line 2: expected 'text<TAB>label', got"):
        kind_for(spec).read_data()


def test_the_seed_classification_spec_is_valid():
    spec = load_spec(RELEASES / "twitter-roberta-sentiment.yaml")
    assert spec.source.repo_id and spec.source.revision
    assert spec.task == "text-classification"


def test_a_multi_label_flip_is_a_disagreement_on_any_of_many_labels():
    """A multi-label model with 70 labels: a label that crosses 0.5 on the candidate and not
    in PyTorch's answer is a disagreement, the 65th as much as the first."""
    from hf2triton.kinds.classification import agreeing

    reference = np.full((4, 70), 0.1, np.float32)
    reference[:, 3] = 0.9
    for label in (0, 64, 69):
        candidate, ref = reference.copy(), reference.copy()
        ref[:, label], candidate[:, label] = 0.49, 0.51
        assert not agreeing(candidate, ref, "sigmoid").any(), label
    assert agreeing(reference, reference.copy(), "sigmoid").all()
    assert agreeing(reference, reference + 0.01, "softmax").all()
