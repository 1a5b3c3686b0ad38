"""Kind `reranking` (task: text-ranking) end to end on a tiny random-weight cross-encoder: real
export, int8 quantization, the ranking gate against PyTorch (Spearman per query, top-1
agreement), MLflow (SQLite) and a real Triton server on free ports. Clients send a query with
its passages and get one score per passage; the served ranking is PyTorch's."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton.errors import AccuracyGateError, SpecError
from hf2triton.spec import load_spec, parse_spec
from tests.conftest import free_port, tiny_spec
from tests.tiny_models import build_tiny_cross_encoder, rerank_pairs


def _spec(tmp: Path, model_dir: Path, ports: dict[str, int], **overrides) -> Path:
    pairs = tmp / "rerank-validation.tsv"
    pairs.write_text("".join(f"{q}\t{p}\n" for q, p in rerank_pairs()), encoding="utf-8")
    return tiny_spec(
        tmp / "reranker.yaml",
        model_dir,
        ports,
        name="tiny-reranker",
        task="text-ranking",
        embedding=None,
        registry__model_name="tiny-reranker",
        source__model_id="fixtures/tiny-cross-encoder",
        validation__sentences=str(pairs),
        embedding__thresholds=None,
        validation__smoke_sentences=6,
        **overrides,
    )


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_cross_encoder(tmp_path_factory.mktemp("models") / "tiny-cross-encoder")


@pytest.fixture(scope="module")
def reranker(tmp_path_factory, model_dir):
    from hf2triton.flows.release import release_model
    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("reranker")
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    # Every candidate judged (not only up to the fastest that passes, which depends on this
    # machine's timings): the tests read int8's ranking metrics from the report.
    spec = load_spec(_spec(tmp, model_dir, ports, validation__judge_all=True))
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            yield {
                "summary": release_model(spec),
                "spec": spec,
                "ports": ports,
                "home": tmp / "home",
                "tmp": tmp,
            }
        finally:
            triton_local.stop_server()


def _torch_scores(model_dir: Path, query: str, passages: list[str]) -> np.ndarray:
    from hf2triton.kinds.classification import TorchClassifier

    logits = TorchClassifier(model_dir, 64).all_logits([(query, p) for p in passages])
    return 1 / (1 + np.exp(-logits[:, 0]))  # one-logit cross-encoders: sigmoid, as auto says


def _rerank(module, url: str, queries: list[str], passages: list[list[str]]) -> np.ndarray:
    client = module.InferenceServerClient(url=url)
    q = np.array([[x.encode()] for x in queries], dtype=np.object_)
    p = np.array([[x.encode() for x in row] for row in passages], dtype=np.object_)
    inputs = [
        module.InferInput("QUERY", list(q.shape), "BYTES"),
        module.InferInput("PASSAGES", list(p.shape), "BYTES"),
    ]
    inputs[0].set_data_from_numpy(q)
    inputs[1].set_data_from_numpy(p)
    try:
        return client.infer("tiny-reranker", inputs).as_numpy("SCORES")
    finally:
        client.close()


def test_release_ships_a_reranker_that_passed_the_ranking_gate(reranker):
    summary = reranker["summary"]
    metrics = summary["metrics"]
    assert metrics["min_spearman"] >= 0.9 and metrics["top1_agreement"] >= 0.95
    assert metrics["smoke_min_spearman"] >= 0.9 and metrics["smoke_top1_agreement"] >= 0.95
    report = json.loads(
        next(
            (reranker["home"] / "work" / "tiny-reranker" / "validate").glob(
                "*/validation_report.json"
            )
        ).read_text()
    )
    assert report["kind"] == "reranking" and report["items"] == 10  # queries
    assert set(report["limits"]) == {"min_spearman", "mean_spearman", "top1_agreement"}
    served = reranker["home"] / "triton" / "models" / "tiny-reranker" / "1"
    assert (served / "hf2triton_serving" / "reranking.py").is_file()
    assert json.loads((served / "serving.json").read_text())["activation"] == "sigmoid"


@pytest.mark.parametrize("module, port", [(grpcclient, "grpc_port"), (httpclient, "http_port")])
def test_served_scores_rank_unseen_passages_as_pytorch_does(reranker, model_dir, module, port):
    query = "which city is large"
    passages = [
        "new york is a large city",
        "the team won the match after extra time",
        "bake the bread at two hundred degrees for forty minutes",
        "a " * 100,
        "the court ruled that the contract was void",
    ]
    want = _torch_scores(model_dir, query, passages)
    got = _rerank(module, f"127.0.0.1:{reranker['ports'][port]}", [query], [passages])
    from scipy.stats import spearmanr

    assert got.shape == (1, len(passages))
    assert int(np.argmax(got[0])) == int(np.argmax(want))  # the same passage comes first
    assert spearmanr(got[0], want).statistic >= 0.9
    # fp32 ships, or bf16 where it timed faster (OpenVINO on an AVX512_BF16 CPU: 0.034 from
    # PyTorch's scores here in one CI run, 0.028 on the gate's own pairs): 8 bits of mantissa.
    bf16 = reranker["summary"]["variant"].endswith(" bf16")
    assert np.abs(got[0] - want).max() < (0.05 if bf16 else 0.02), reranker["summary"]["variant"]


def test_concurrent_requests_with_different_passage_counts_are_answered(reranker, model_dir):
    from concurrent.futures import ThreadPoolExecutor

    url = f"127.0.0.1:{reranker['ports']['grpc_port']}"
    groups = [
        ("how do i reset my password", ["call me at 555-0100 tomorrow?"] * (1 + i % 5))
        for i in range(12)
    ]
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda g: _rerank(grpcclient, url, [g[0]], [g[1]]), groups))
    for (_, passages), got in zip(groups, answers):
        assert got.shape == (1, len(passages))
        assert np.allclose(got[0], got[0][0])  # the same passage, the same score


def test_a_bad_request_gets_a_clear_error(reranker):
    url = f"127.0.0.1:{reranker['ports']['grpc_port']}"
    client = grpcclient.InferenceServerClient(url=url)
    q = grpcclient.InferInput("QUERY", [1, 1], "BYTES")
    q.set_data_from_numpy(np.array([[b"\xff\xfe not utf-8"]], dtype=np.object_))
    p = grpcclient.InferInput("PASSAGES", [1, 2], "BYTES")
    p.set_data_from_numpy(np.array([[b"a", b"b"]], dtype=np.object_))
    with pytest.raises(InferenceServerException, match="QUERY.0. is not valid UTF-8"):
        client.infer("tiny-reranker", [q, p])


def test_a_ranking_gate_int8_cannot_meet_refuses_the_release_naming_the_metric(
    reranker, model_dir, tmp_path, monkeypatch
):
    from hf2triton.flows.release import release_model

    report = json.loads(
        next(
            (reranker["home"] / "work" / "tiny-reranker" / "validate").glob(
                "*/validation_report.json"
            )
        ).read_text()
    )
    int8 = next(c for c in report["candidates"] if c["name"].startswith("dynamic-int8"))
    assert int8["metrics"]["min_spearman"] < 1.0
    monkeypatch.setenv("HF2TRITON_HOME", str(reranker["home"]))
    spec = load_spec(
        _spec(
            tmp_path,
            model_dir,
            reranker["ports"],
            quantization__fallback_to_fp32=False,
            reranking={"thresholds": {"min_spearman": 1.0}},
        )
    )
    with pytest.raises(AccuracyGateError, match=r"min_spearman -?[01]\.\d+ < 1\.0") as err:
        release_model(spec)
    assert "worst query" in str(err.value) and "Relax reranking.thresholds" in str(err.value)


def test_reranking_spec_and_data_are_checked(tmp_path):
    base = {
        "name": "x",
        "task": "text-ranking",
        "source": {"path": "/m"},
        "validation": {"sentences": str(tmp_path / "pairs.tsv")},
        "registry": {"model_name": "x"},
    }
    assert parse_spec({**base, "reranking": {"activation": "none"}}).reranking.activation == "none"
    with pytest.raises(SpecError, match="does not read the section"):
        parse_spec({**base, "embedding": {"pooling": "cls"}})
    with pytest.raises(SpecError, match="'reranking.activation'"):
        parse_spec({**base, "reranking": {"activation": "tanh"}})
    (tmp_path / "pairs.tsv").write_text("a query without its passage\n")
    from hf2triton.spec import kind_for

    with pytest.raises(SpecError, match="line 1: a text-ranking release reads 'query<TAB>"):
        kind_for(parse_spec(base)).read_data()
    seed = load_spec(Path(__file__).resolve().parents[2] / "releases" / "ms-marco-reranker.yaml")
    groups = kind_for(seed).read_data().items
    assert seed.source.repo_id and len(groups) == 40 and all(len(p) >= 4 for _, p in groups)


def _post(url: str, body: dict):
    import urllib.error
    import urllib.request

    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_rerank_through_the_openai_compatible_api_in_cohere_and_tei_shapes(reranker):
    """/v1/rerank answers what LangChain's and LlamaIndex's Cohere/Jina rerankers read (results
    best first, `index` into the documents, `relevance_score`), text-embeddings-inference's
    /rerank its own list; both are Triton's scores."""
    api = reranker["summary"]["endpoint"]["openai"]
    query = "which city is large"
    docs = ["the team won the match", "new york is a large city", "a " * 80, "bake bread"]
    want = _rerank(grpcclient, f"127.0.0.1:{reranker['ports']['grpc_port']}", [query], [docs])[0]
    status, body = _post(
        f"{api}/rerank",
        {
            "model": "tiny-reranker",
            "query": query,
            "documents": docs,
            "top_n": 3,
            "return_documents": True,
        },
    )
    assert status == 200 and body["model"] == "tiny-reranker"
    order = list(np.argsort(-want, kind="stable")[:3])
    assert [r["index"] for r in body["results"]] == order
    for r in body["results"]:
        assert abs(r["relevance_score"] - want[r["index"]]) < 1e-5
        assert r["document"]["text"] == docs[r["index"]]
    status, tei = _post(
        api.removesuffix("/v1") + "/rerank", {"query": query, "texts": docs, "return_text": False}
    )
    assert status == 200 and [r["index"] for r in tei] == list(np.argsort(-want, kind="stable"))
    assert all(abs(r["score"] - want[r["index"]]) < 1e-5 and "text" not in r for r in tei)
    status, bad = _post(
        f"{api}/rerank", {"model": "tiny-reranker", "query": query, "documents": []}
    )
    assert status == 400 and bad["error"]["param"] == "documents"


@pytest.mark.parametrize("query", [0, 1])
def test_an_endpoint_answering_nan_for_one_query_fails_the_smoke_limits(query):
    """What the smoke test and the watch hold a served reranker to (top-1 agreement and the
    largest score difference against the recorded answers): a score that is not a number
    misses both, whichever query it is in and whichever passage."""
    from hf2triton.kinds.limits import misses
    from hf2triton.kinds.reranking import RerankingKind, ranking_metrics

    recorded = [np.array([0.1, 0.9, 0.3], np.float32), np.array([0.8, 0.2, 0.1], np.float32)]
    served = [r.copy() for r in recorded]
    served[query][int(np.argmax(recorded[query]))] = np.nan  # the top passage's score
    metrics, _ = ranking_metrics(recorded, served)
    limits = RerankingKind.agreement_limits(None, 1e-4)
    assert set(misses(metrics, limits)) == {"top1_agreement", "max_score_diff"}
    assert metrics["max_score_diff"] == float("inf")
    assert misses(ranking_metrics(recorded, recorded)[0], limits) == {}
    # In the gate, its bootstrap sample is the metric it measured (margin.check_sample).
    from hf2triton.kinds.margin import borderline

    kind = RerankingKind.__new__(RerankingKind)
    samples = kind.samples(recorded, served, None, None)
    borderline(metrics, samples, {"top1_agreement": (">=", 0.9)})
