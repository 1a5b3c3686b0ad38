"""Kind `image_classification` (task: image-classification) end to end on a tiny random-weight
ViT: real export, int8 quantization, the gate against PyTorch on real photographs
(releases/data/images: JPEG, PNG, WebP, BMP, GIF, grayscale, palette, transparent, EXIF-rotated,
64 to 640 pixels), MLflow (SQLite) and a real Triton server on free ports. Clients send image
files and get the label and every label's score; a file that is not an image the model takes is
refused with the reason, and the others are served."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton.errors import SpecError
from hf2triton.spec import load_spec
from tests.conftest import free_port, tiny_spec
from tests.kinds.kind_release import report
from tests.tiny_models import IMAGE_LABELS, PHOTOS, build_tiny_vit


def photos() -> list[Path]:
    return sorted(p for p in PHOTOS.iterdir() if p.suffix not in (".py", ".md"))


def _spec(tmp: Path, model_dir: Path, ports: dict, **overrides) -> Path:
    overrides = {"validation__sentences": None, "validation__images": str(PHOTOS), **overrides}
    return tiny_spec(
        tmp / "vit.yaml",
        model_dir,
        ports,
        name="tiny-vit",
        task="image-classification",
        embedding=None,
        registry__model_name="tiny-vit",
        source__model_id="fixtures/tiny-vit",
        validation__smoke_sentences=6,
        **overrides,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_vit(tmp_path_factory.mktemp("models") / "tiny-vit")


@pytest.fixture(scope="module")
def image_classifier(tmp_path_factory, model_dir):
    from hf2triton.flows.release import release_model
    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("image-classifier")
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    # Every candidate judged: the tests read int8's metrics from the report. Scores within 0.002
    # of PyTorch's: fp32 keeps them (1e-6), int8 does not on any CPU (0.03 with VNNI, more on
    # AVX2 alone), so what ships, and what the tests compare with PyTorch at 1e-4, is fp32.
    spec = load_spec(
        _spec(
            tmp,
            model_dir,
            ports,
            validation__judge_all=True,
            image_classification={"thresholds": {"max_prob_diff": 0.002}},
        )
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            yield {"summary": release_model(spec), "ports": ports, "home": tmp / "home"}
        finally:
            triton_local.stop_server()


def torch_scores(model_dir: Path, files: list[Path]) -> np.ndarray:
    from hf2triton.kinds.image_classification import TorchImages
    from hf2triton.serving.classification import activate

    logits = TorchImages(model_dir, "AutoModelForImageClassification").outputs(
        [str(f) for f in files], "logits"
    )
    return activate(logits, "softmax")


def image_array(blobs: list[bytes]) -> np.ndarray:
    return np.array([[b] for b in blobs], dtype=np.object_)


def infer(client_module, port: int, blobs: list[bytes]) -> dict[str, np.ndarray]:
    """One request of `blobs` over tritonclient.http or tritonclient.grpc."""
    client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
    arr = image_array(blobs)
    inp = client_module.InferInput("IMAGE", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    res = client.infer("tiny-vit", [inp])
    return {"LABEL": res.as_numpy("LABEL"), "SCORES": res.as_numpy("SCORES")}


def http_infer(port: int, blobs: list[bytes]) -> dict[str, np.ndarray]:
    return infer(httpclient, port, blobs)


def test_served_labels_and_scores_are_pytorchs_on_every_photo(image_classifier, model_dir):
    files = photos()
    expected = torch_scores(model_dir, files)
    labels = [IMAGE_LABELS[i] for i in expected.argmax(axis=1)]
    blobs = [f.read_bytes() for f in files]
    for client, port in ((httpclient, "http_port"), (grpcclient, "grpc_port")):
        # One image a request, and all of them in one request.
        one = [infer(client, image_classifier["ports"][port], [b]) for b in blobs]
        # As many as a request may hold (deploy.max_batch_size, 8) in one request.
        whole = infer(client, image_classifier["ports"][port], blobs[:8])
        np.testing.assert_allclose(np.stack([a["SCORES"][0] for a in one]), expected, atol=1e-4)
        np.testing.assert_allclose(whole["SCORES"], expected[:8], atol=1e-4)
        assert [a["LABEL"][0][0].decode() for a in one] == labels
        assert [x[0].decode() for x in whole["LABEL"]] == labels[:8]
    assert len(set(labels)) > 1  # the photos are told apart


def test_the_gate_judged_the_candidates_on_their_own_metrics(image_classifier):
    rep = report(image_classifier)
    assert rep["kind"] == "image_classification" and rep["items"] == len(photos())
    by_name = {c["name"]: c for c in rep["candidates"]}
    for name, entry in by_name.items():
        assert {"label_agreement", "top5_overlap", "logit_cosine", "max_prob_diff"} <= set(
            entry["metrics"]
        ), name
    shipped = image_classifier["summary"]["variant"]
    assert not by_name[shipped]["misses"]
    # ONNX Runtime's dynamic int8 and OpenVINO's int8 (NNCF, calibrated on the photographs as
    # the served path decodes them) move this random ViT's scores past the fixture's limit
    # (OpenVINO's also changes a top-1 label on an AVX2-only CPU): none ships.
    int8 = {n: c for n, c in by_name.items() if "int8" in n}
    assert {"dynamic-int8/qint8/per-channel", "openvino-int8 on openvino fp32"} <= set(int8)
    assert all(c["misses"] for c in int8.values()) and "int8" not in shipped
    for name, entry in by_name.items():  # a top label moved is a miss
        if entry["metrics"]["label_agreement"] < 1.0:
            assert "label_agreement" in entry["misses"], name
    assert by_name[shipped]["metrics"]["label_agreement"] == 1.0  # all 12 photographs


def _png(width: int, height: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (width, height), (200, 30, 30)).save(out, "PNG")
    return out.getvalue()


def _animated_gif() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    frames = [Image.new("RGB", (8, 8), c) for c in ((255, 0, 0), (0, 0, 255))]
    frames[0].save(out, "GIF", save_all=True, append_images=frames[1:])
    return out.getvalue()


def _bomb() -> bytes:
    """A 20,000 x 20,000 PNG header (400 MP): refused before its pixels are decoded."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (20_000, 20_000)).save(out, "PNG")
    return out.getvalue()


BAD = {
    "not an image": (b"hello, I am text", "not an image file"),
    "empty": (b"", "empty"),
    "1x1": (_png(1, 1), "1 x 1"),
    "animated": (_animated_gif(), "animated"),
    "bomb": (_bomb(), "decompression bomb"),
}


def test_bad_images_are_refused_with_the_reason_and_the_rest_served(image_classifier):
    port = image_classifier["ports"]["http_port"]
    good = photos()[0].read_bytes()
    truncated = good[: len(good) // 2]
    for blob, reason in [*BAD.values(), (truncated, "truncated")]:
        with pytest.raises(InferenceServerException, match=reason):
            http_infer(port, [blob])
    # A bad row names itself; the server goes on serving good images.
    with pytest.raises(InferenceServerException, match=r"IMAGE\[1\]: .*not an image file"):
        http_infer(port, [good, b"not an image"])
    with pytest.raises(InferenceServerException, match="batch-size must be <= 8"):
        http_infer(port, [good] * 9)  # more images than a request may hold
    assert http_infer(port, [good])["SCORES"].shape == (1, len(IMAGE_LABELS))


def test_an_image_kind_without_validation_images_is_refused(tmp_path, model_dir):
    spec = load_spec(
        _spec(
            tmp_path,
            model_dir,
            {"http_port": 1, "grpc_port": 2, "metrics_port": 3},
            validation__images=None,
            validation__sentences=str(tmp_path / "x.txt"),
        )
    )
    from hf2triton.spec import kind_for

    with pytest.raises(SpecError, match="validation.images is not set"):
        kind_for(spec).read_data()


def test_the_openai_compatible_predict_route_takes_images_as_data_uris(image_classifier, model_dir):
    import httpx

    from hf2triton.kinds.image_classification import data_uri

    files = photos()[:4]
    expected = torch_scores(model_dir, files)
    url = f"http://127.0.0.1:{image_classifier['ports']['openai']['port']}/v1/predict"
    body = {"model": "tiny-vit", "inputs": [data_uri(f.read_bytes()) for f in files]}
    answer = httpx.post(url, json=body, timeout=60).json()
    for row, want in zip(answer, expected):
        assert row[0]["label"] == IMAGE_LABELS[int(want.argmax())]  # the best first
        got = {item["label"]: item["score"] for item in row}
        np.testing.assert_allclose(
            [got[IMAGE_LABELS[i]] for i in range(len(want))], want, atol=1e-4
        )
    # A remote URL is not fetched, bad base64 and a bad file are named; 400s all.
    for bad, says in (
        ("https://example.com/cat.jpg", "does not fetch remote images"),
        ("data:image/png;base64,@@@", "not base64"),
        (data_uri(b"GIF89a not really"), "IMAGE"),
    ):
        refused = httpx.post(url, json={"model": "tiny-vit", "inputs": [bad]}, timeout=60)
        assert refused.status_code == 400 and says in refused.text, refused.text


def test_an_export_whose_graph_answers_nan_is_refused(tmp_path, model_dir):
    """The export check compares the graph's logits with PyTorch's: a graph that answers NaN
    (here its classifier's bias planted with NaN after a real export) differs by inf, which
    export.atol refuses, not by 0 (max() skips a NaN: before the fix it passed)."""
    import onnx

    from hf2triton.release.export import export_checked
    from hf2triton.spec import kind_for
    from hf2triton.spec.release import ExportSpec

    ports = {"http_port": 1, "grpc_port": 2, "metrics_port": 3}
    kind = kind_for(load_spec(_spec(tmp_path, model_dir, ports)))
    cfg = kind.resolve(str(model_dir))
    inputs = [str(p) for p in photos()[:3]]
    out = tmp_path / "export"
    out.mkdir()
    found = export_checked(kind, str(model_dir), out, ExportSpec(), cfg, inputs)
    assert 0 <= found["max_abs_diff"] <= 1e-3 and found["checked"] == 3
    graph = onnx.load(str(out / kind.main_file))
    bias = next(t for t in graph.graph.initializer if "classifier" in t.name and "bias" in t.name)
    values = onnx.numpy_helper.to_array(bias).copy()
    values[0] = np.nan
    bias.CopyFrom(onnx.numpy_helper.from_array(values, bias.name))
    onnx.save(graph, str(out / kind.main_file))
    assert kind.check_export(str(model_dir), out, cfg, inputs)["max_abs_diff"] == float("inf")


def test_a_candidate_answering_uniform_scores_has_no_logit_cosine(tmp_path, model_dir):
    """A candidate that answers the same score for every label (centred logits all zero) does
    not agree with PyTorch's logits: its logit cosine is 0, not 1 (a zero row counted as
    agreeing once let it through), while the same scores against themselves agree."""
    from hf2triton.kinds.base import Data
    from hf2triton.spec import kind_for

    ports = {"http_port": 1, "grpc_port": 2, "metrics_port": 3}
    kind = kind_for(load_spec(_spec(tmp_path, model_dir, ports)))
    cfg = kind.resolve(str(model_dir))
    n = len(cfg.labels)
    reference = np.array([[0.7] + [0.3 / (n - 1)] * (n - 1)] * 2, np.float32)
    uniform = np.full_like(reference, 1.0 / n)
    items = Data(items=["a.png", "b.png"])
    answer = {"probs": uniform, "labels": [cfg.labels[0]] * 2}
    metrics, _ = kind.score(reference, answer, items, cfg)
    assert metrics["logit_cosine"] == 0.0 and metrics["mean_logit_cosine"] == 0.0
    same, _ = kind.score(uniform, answer, items, cfg)
    assert same["logit_cosine"] == pytest.approx(1.0)
