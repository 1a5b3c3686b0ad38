"""The OpenAI-compatible API beside a release's Triton (hf2triton/openai_api), asked by the
clients teams already have: the `openai` SDK and LangChain's OpenAIEmbeddings, against a tiny
embedder released end to end (real export, gate, MLflow, a real local Triton and the API process
the release started beside it). What they get must be what Triton's own protocol serves; bad
requests get OpenAI's error object naming the field, and the server keeps serving."""

from __future__ import annotations

import base64
import hashlib
import json
import urllib.error
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import free_port

pytestmark = pytest.mark.e2e

TEXTS = [
    "a short query",
    "",
    "prices rose 12.5% to $43,210!",
    "ÄÖÜ ß straße 😀",
    "a long passage " * 40,
]


def _api(rel) -> str:
    return rel.summary["endpoint"]["openai"]


def _triton(rel, texts):
    client = grpcclient.InferenceServerClient(rel.grpc_url)
    arr = np.array([[t.encode()] for t in texts], dtype=np.object_)
    x = grpcclient.InferInput("TEXT", list(arr.shape), "BYTES")
    x.set_data_from_numpy(arr)
    res = client.infer(rel.model, [x])
    client.close()
    return res.as_numpy("EMBEDDING"), res.as_numpy("TOKENS")[:, 0]


def _post(url: str, body, key: str | None = None, raw: bytes | None = None):
    headers = {"Content-Type": "application/json"}
    if key:
        headers["Authorization"] = f"Bearer {key}"
    req = urllib.request.Request(
        url, data=raw if raw is not None else json.dumps(body).encode(), headers=headers
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _cos(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float((a * b).sum() / (np.linalg.norm(a) * np.linalg.norm(b) + 1e-12))


def test_the_release_summary_names_the_api_and_the_server_status_shows_it(
    tiny_release, monkeypatch
):
    from hf2triton.spec import load_spec
    from hf2triton.targets import triton_local

    url = _api(tiny_release)
    port = load_spec(tiny_release.spec_path).deploy.openai.port
    assert url == f"http://127.0.0.1:{port}/v1"
    monkeypatch.setenv("HF2TRITON_HOME", str(tiny_release.home))
    status = triton_local.status()
    assert status["openai"]["running"] and status["openai"]["live"]
    assert status["openai"]["url"] == url and status["openai"]["keys"] == 0


def test_openai_sdk_embeddings_are_tritons(tiny_release):
    import openai

    client = openai.OpenAI(base_url=_api(tiny_release), api_key="unused")
    got = client.embeddings.create(model=tiny_release.model, input=TEXTS)
    want, tokens = _triton(tiny_release, TEXTS)
    assert [d.index for d in got.data] == list(range(len(TEXTS)))
    assert got.model == tiny_release.model
    assert min(_cos(d.embedding, w) for d, w in zip(got.data, want)) >= 0.9999
    # usage: what each text was embedded from (special tokens and truncation included)
    assert got.usage.prompt_tokens == int(tokens.sum()) > len(TEXTS)
    one = client.embeddings.create(model=tiny_release.model, input="a short query")
    assert _cos(one.data[0].embedding, want[0]) >= 0.9999
    # base64: little-endian float32, as the SDK decodes it by default
    status, body = _post(
        f"{_api(tiny_release)}/embeddings",
        {"model": tiny_release.model, "input": TEXTS[:2], "encoding_format": "base64"},
    )
    assert status == 200
    vec = np.frombuffer(base64.b64decode(body["data"][1]["embedding"]), "<f4")
    assert _cos(vec, want[1]) >= 0.9999


def test_langchain_openai_embeddings(tiny_release):
    from langchain_openai import OpenAIEmbeddings

    # check_embedding_ctx_length=False: the server tokenizes (LangChain's tiktoken counting is
    # OpenAI's tokenizer, and a download).
    emb = OpenAIEmbeddings(
        model=tiny_release.model,
        base_url=_api(tiny_release),
        api_key="unused",
        check_embedding_ctx_length=False,
    )
    docs = emb.embed_documents(TEXTS[2:])
    query = emb.embed_query(TEXTS[0])
    want, _ = _triton(tiny_release, TEXTS)
    assert min(_cos(d, w) for d, w in zip(docs, want[2:])) >= 0.9999
    assert _cos(query, want[0]) >= 0.9999


def test_models_lists_every_release_with_its_version(tiny_release):
    import openai

    client = openai.OpenAI(base_url=_api(tiny_release), api_key="unused")
    models = {m.id: m for m in client.models.list()}
    assert tiny_release.model in models
    served = models[tiny_release.model].model_dump()
    assert served["version"] == tiny_release.summary["endpoint"]["version"]
    assert served["kind"] == "embedding"
    assert client.models.retrieve(tiny_release.model).id == tiny_release.model


@pytest.mark.parametrize(
    "body, status, param, says",
    [
        ({"input": 3}, 400, "input", "string"),
        ({"input": [1, 2, 3]}, 400, "input", "token ids are not taken"),
        ({"input": []}, 400, "input", "empty"),
        ({"input": "x", "encoding_format": "int8"}, 400, "encoding_format", "float"),
        ({"input": "x", "dimensions": 7}, 400, "dimensions", "dimensions 7"),
        ({"input": "x", "model": "no-such-model"}, 404, "model", "does not exist"),
        ({"input": ["x"] * 3000}, 400, "input", "at most"),
    ],
)
def test_bad_requests_get_openai_error_objects_naming_the_field(
    tiny_release, body, status, param, says
):
    got, answer = _post(f"{_api(tiny_release)}/embeddings", {"model": tiny_release.model, **body})
    assert got == status, answer
    error = answer["error"]
    assert error["param"] == param and says in error["message"], error
    assert error["type"] in ("invalid_request_error",)
    # ... and the server keeps serving
    ok, answer = _post(
        f"{_api(tiny_release)}/embeddings", {"model": tiny_release.model, "input": "still here"}
    )
    assert ok == 200 and len(answer["data"]) == 1


def test_malformed_and_oversized_bodies_and_wrong_routes(tiny_release):
    api = _api(tiny_release)
    got, answer = _post(f"{api}/embeddings", None, raw=b'{"model": "x", "input": ')
    assert got == 400 and "JSON" in answer["error"]["message"]
    got, answer = _post(
        f"{api}/embeddings",
        None,
        raw=json.dumps({"model": tiny_release.model, "input": "x" * (5 << 20)}).encode(),
    )
    assert got == 413 and answer["error"]["code"] == "request_too_large"
    got, answer = _post(
        f"{api}/chat/completions",
        {"model": tiny_release.model, "messages": [{"role": "user", "content": "hi"}]},
    )
    assert got == 400 and answer["error"]["param"] == "model"
    assert "embedding" in answer["error"]["message"]
    got, answer = _post(f"{api}/no-such-route", {})
    assert got == 404 and "error" in answer


def test_the_api_exports_its_own_metrics(tiny_release):
    api = _api(tiny_release)
    _post(f"{api}/embeddings", {"model": tiny_release.model, "input": "count me"})
    _post(f"{api}/embeddings", {"model": tiny_release.model, "input": 3})
    with urllib.request.urlopen(api.removesuffix("/v1") + "/metrics", timeout=10) as r:
        text = r.read().decode()
    ok = [
        ln
        for ln in text.splitlines()
        if ln.startswith("hf2triton_openai_requests_total{")
        and f'model="{tiny_release.model}"' in ln
        and 'status="200"' in ln
    ]
    bad = [
        ln
        for ln in text.splitlines()
        if ln.startswith("hf2triton_openai_errors_total{")
        and 'status="400"' in ln
        and 'route="/v1/embeddings"' in ln
    ]
    assert ok and float(ok[0].split()[-1]) >= 1 and bad
    assert "hf2triton_openai_request_seconds_bucket" in text


def test_bearer_keys_are_asked_compared_as_hashes_and_never_written(tiny_release, monkeypatch):
    """An API started with keys answers 401 without one and with a wrong one; only the keys'
    sha256 reach the server's files and its process arguments; the key reaches no log."""
    from hf2triton.targets import triton_local

    monkeypatch.setenv("HF2TRITON_HOME", str(tiny_release.home))
    server = triton_local.read_state()
    before = triton_local.read_api()
    key = "sk-test-" + hashlib.sha256(b"planted").hexdigest()[:24]
    port = free_port()
    with pytest.raises(Exception, match="give them the same deploy.openai.port"):
        triton_local.ensure_api(server, "127.0.0.1", port, [], [])
    triton_local.stop_api()
    try:
        api = triton_local.ensure_api(
            server, "127.0.0.1", port, [hashlib.sha256(key.encode()).hexdigest()], []
        )
        assert api.keys == 1 and api.pid != before.pid
        url = api.url + "/embeddings"
        body = {"model": tiny_release.model, "input": "secret?"}
        assert _post(url, body)[0] == 401
        status, answer = _post(url, body, key="sk-wrong")
        assert status == 401 and answer["error"]["code"] == "invalid_api_key"
        assert _post(url, body, key=key)[0] == 200
        cmdline = open(f"/proc/{api.pid}/cmdline", "rb").read().decode(errors="replace")
        files = [p for p in tiny_release.home.rglob("*") if p.is_file()]
        leaked = [str(p) for p in files if key.encode() in p.read_bytes()]
        assert key not in cmdline and not leaked
        keys_file = tiny_release.home / "triton" / "openai-keys.sha256"
        assert oct(keys_file.stat().st_mode & 0o777) == "0o600"
    finally:  # the module's release as it was: no keys, its own port
        triton_local.stop_api()
        triton_local.ensure_api(server, "127.0.0.1", before.port, [], _arguments(tiny_release))
    assert (
        _post(
            f"{_api(tiny_release)}/embeddings", {"model": tiny_release.model, "input": "open again"}
        )[0]
        == 200
    )


def _arguments(rel):
    from hf2triton.spec import load_spec

    return load_spec(rel.spec_path).deploy.openai.arguments()


def test_server_stop_stops_the_api_too(own_tiny_release, monkeypatch):
    from hf2triton.targets import triton_local

    monkeypatch.setenv("HF2TRITON_HOME", str(own_tiny_release.home))
    api = triton_local.read_api()
    assert api is not None and triton_local.api_live(api)
    triton_local.stop_server()
    assert triton_local.read_api() is None and not triton_local.api_live(api)
