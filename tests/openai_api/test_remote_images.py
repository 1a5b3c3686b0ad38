"""Image URLs on the OpenAI-compatible API: fetched only from the hosts the operator allows
(deploy.openai.remote_image_hosts), redirects not followed, at most a body's size; any other URL
refused naming the item. A real HTTP server on 127.0.0.1 serves the files; the Triton behind the
API is test_routes' stand-in (it records the image bytes it was sent)."""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import numpy as np
import pytest
from fastapi.testclient import TestClient

from hf2triton.openai_api.app import create_app
from hf2triton.openai_api.triton import Model
from hf2triton.targets.base import OpenAISpec
from tests.openai_api.test_routes import FakeTriton, error_of
from tests.tiny_models import PHOTOS

PHOTO = (PHOTOS / "coffee.jpg").read_bytes()
MAX_BODY = 1 << 16
MODELS = (
    Model("img", "1", "image_classification", 0, ("LABEL", "SCORES"), 100, labels=("a", "b")),
    Model("clip", "1", "image_text_embedding", 0, ("EMBEDDING",), 100, width=2),
)


class Files(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        answers = {
            "/coffee.jpg": (200, PHOTO),
            "/big.jpg": (200, b"x" * (MAX_BODY + 1)),
            "/moved.jpg": (302, b""),
        }
        status, body = answers.get(self.path, (404, b"no"))
        self.send_response(status)
        if status == 302:
            self.send_header("Location", "/coffee.jpg")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


class ImageTriton(FakeTriton):
    """An image classifier and an image-text embedder that answer with each image's size."""

    served = MODELS

    def __init__(self) -> None:
        super().__init__()
        self.images: list[bytes] = []

    async def infer(self, model: Model, arrays: dict[str, np.ndarray], prompt_param: str = "input"):
        images = [bytes(row[0]) for row in arrays["IMAGE"]]
        self.images += images
        sizes = np.array([[float(len(b)), 0.0] for b in images], np.float32)
        return {"EMBEDDING": sizes} if model.kind == "image_text_embedding" else {"SCORES": sizes}


@pytest.fixture(scope="module")
def files():
    server = ThreadingHTTPServer(("127.0.0.1", 0), Files)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def client(hosts: tuple[str, ...] = ("127.0.0.1",)) -> tuple[TestClient, ImageTriton]:
    app = create_app("fake:8001", max_body=MAX_BODY, remote_image_hosts=hosts)
    fake = ImageTriton()
    app.state.triton = fake
    return TestClient(app), fake


def test_an_allowed_hosts_image_is_fetched_and_sent_as_the_file(files):
    api, fake = client()
    url = f"{files}/coffee.jpg"
    got = api.post("/v1/predict", json={"model": "img", "inputs": [url]})
    assert got.status_code == 200, got.text
    embedded = api.post(
        "/v1/embeddings", json={"model": "clip", "input": [url], "modality": "image"}
    )
    assert embedded.status_code == 200, embedded.text
    assert fake.images == [PHOTO, PHOTO]
    assert embedded.json()["data"][0]["embedding"][0] == len(PHOTO)


def test_a_url_of_another_host_is_refused_without_a_request(files):
    api, fake = client(hosts=("images.example.com",))
    error = error_of(api.post("/v1/predict", json={"model": "img", "inputs": [files]}), 400)
    assert "does not fetch remote images" in error["message"]
    assert "remote_image_hosts" in error["message"] and error["param"] == "inputs"
    assert fake.images == []


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("/moved.jpg", "HTTP 302 (redirects are not followed)"),
        ("/missing.jpg", "HTTP 404"),
        ("/big.jpg", f"over {MAX_BODY} bytes"),
    ],
)
def test_what_an_allowed_host_cannot_give_is_a_400_naming_the_item(files, path, says):
    api, fake = client()
    good, bad = f"{files}/coffee.jpg", f"{files}{path}"
    body = {"model": "clip", "input": [good, bad], "modality": "image"}
    error = error_of(api.post("/v1/embeddings", json=body), 400)
    assert error["message"].startswith("input[1]: ") and says in error["message"]
    assert error["param"] == "input" and fake.images == []  # nothing reached Triton


def test_an_unreachable_host_is_a_400_not_a_hang():
    api, _ = client(hosts=("127.0.0.1",))
    error = error_of(
        api.post("/v1/predict", json={"model": "img", "inputs": ["http://127.0.0.1:9/x.jpg"]}), 400
    )
    assert "could not be fetched" in error["message"]


def test_the_spec_takes_host_names_and_passes_them_to_the_api():
    spec = OpenAISpec(remote_image_hosts=["Images.Example.com"])
    assert "--remote-image-host=images.example.com" in spec.arguments()
    with pytest.raises(ValueError, match="host names alone"):
        OpenAISpec(remote_image_hosts=["https://images.example.com/cat.jpg"])
