"""hf2triton/clients/triton.py: the one place that reaches Triton. Its failures become hf2triton
errors by exception type and status (a server down or busy: a retryable
ServiceUnavailableError; anything else: the caller's error, with Triton's message), and a
decoupled model's answer over HTTP `generate` comes back as the arrays a plain one gives. A
stand-in HTTP server in this process plays Triton where one is needed."""

from __future__ import annotations

import socket

import numpy as np
import pytest
from tritonclient.utils import InferenceServerException

from hf2triton.clients.triton import Failure, Inference, TritonAdmin, classify, is_transient, joined
from hf2triton.errors import DeployError, ServiceUnavailableError, SmokeTestError
from tests.clients.stand_in import StandIn


@pytest.mark.parametrize(
    "exc, transient",
    [
        (InferenceServerException("down", status="StatusCode.UNAVAILABLE"), True),
        (InferenceServerException("slow", status="StatusCode.DEADLINE_EXCEEDED"), True),
        (InferenceServerException("busy", status="503"), True),
        (InferenceServerException("bad input", status="StatusCode.INVALID_ARGUMENT"), False),
        (InferenceServerException("bad input", status="400"), False),
        (ConnectionRefusedError("refused"), True),
        (ValueError("a bug"), False),
    ],
)
def test_failures_are_told_apart_by_type_and_status(exc, transient):
    assert is_transient(exc) == transient
    error = classify(exc, "load tiny", DeployError)
    assert isinstance(error, ServiceUnavailableError if transient else DeployError)
    assert error.retryable == transient
    verb = "did not answer while trying to" if transient else "refused to"
    assert str(error).startswith(f"Triton {verb} load tiny: ")


def test_the_message_is_tritons_on_one_line_and_bounded():
    error = classify(
        InferenceServerException("line one\n   line two " + "x" * 900, status="400"),
        "infer",
        DeployError,
    )
    text = str(error).removeprefix("Triton refused to infer: ")
    assert text.startswith("line one line two x") and len(text) == 500


def test_a_stream_of_pieces_is_joined_whole():
    texts = [np.array([[b"Hel"]], np.object_), np.array([[b"lo"]], np.object_)]
    assert joined(texts).tolist() == [[b"Hello"]]
    ids = [np.array([[1, 2]]), np.array([[3]])]
    assert joined(ids).tolist() == [[1, 2, 3]]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_server_that_does_not_answer_is_not_live_and_retryable():
    with TritonAdmin(f"127.0.0.1:{free_port()}", timeout_s=2) as admin:
        assert not admin.live() and not admin.ready() and not admin.model_ready("tiny")
        with pytest.raises(ServiceUnavailableError, match="read the model repository index"):
            admin.index()


INDEX = [
    {"name": "tiny", "version": "1", "state": "READY"},
    {"name": "tiny", "version": "10", "state": "READY"},
    {"name": "tiny", "version": "11", "state": "UNAVAILABLE", "reason": "load failed: no weights"},
    {"name": "other", "version": "2", "state": "READY"},
]


def test_the_repository_index_tells_the_serving_versions_and_a_versions_state():
    with StandIn({("POST", "/v2/repository/index"): (200, INDEX)}) as triton:
        with TritonAdmin(f"127.0.0.1:{triton.port}") as admin:
            assert admin.serving_versions("tiny") == ["1", "10"]  # as numbers, not strings
            assert admin.state("tiny", "11") == ("UNAVAILABLE", "load failed: no weights")
            assert admin.state("tiny", "12") == ("", "")


def test_a_refused_load_is_the_callers_error_with_tritons_message():
    refused = {"error": "failed to load 'tiny': no version is available"}
    with StandIn({("POST", "/v2/repository/models/tiny/load"): (400, refused)}) as triton:
        with TritonAdmin(f"127.0.0.1:{triton.port}") as admin:
            with pytest.raises(DeployError) as caught:
                admin.load("tiny")
    assert not isinstance(caught.value, ServiceUnavailableError)
    assert "Triton refused to load tiny: failed to load 'tiny': no version is available" == str(
        caught.value
    )


GENERATE = "/v2/models/gen/versions/3/generate"
CONFIG = {"name": "gen", "model_transaction_policy": {"decoupled": True}}


def test_a_decoupled_model_over_http_answers_through_generate_as_arrays():
    answer = {"text_output": "héllo", "output_ids": [5, 6], "finish_reason": "stop"}
    routes = {
        ("GET", "/v2/models/gen/versions/3/config"): (200, CONFIG),
        ("POST", GENERATE): (200, answer),
    }
    with StandIn(routes) as triton:
        failure = Failure(SmokeTestError, "generate the smoke text")
        session = Inference(
            "http",
            f"127.0.0.1:{triton.port}",
            "gen",
            "3",
            ("text_output", "output_ids", "finish_reason"),
            failure,
        )
        try:
            out = session(
                {
                    "text_input": np.array([[b"hi"]], np.object_),
                    "max_tokens": np.array([[4]], np.int32),
                }
            )
        finally:
            session.close()
    assert out["text_output"].tolist() == [["héllo".encode()]]
    assert out["output_ids"].tolist() == [[5, 6]] and out["finish_reason"].tolist() == [["stop"]]
    assert triton.seen[-1][3] == {"text_input": "hi", "max_tokens": 4}
    assert session.decoupled and len(session.latencies_ms) == 1


def test_a_refused_generate_raises_the_callers_error_and_a_5xx_is_retryable():
    for status, error in ((400, SmokeTestError), (503, ServiceUnavailableError)):
        routes = {
            ("GET", "/v2/models/gen/versions/3/config"): (200, CONFIG),
            ("POST", GENERATE): (status, {"error": "max_tokens 900 is outside 1..127"}),
        }
        with StandIn(routes) as triton:
            session = Inference(
                "http",
                f"127.0.0.1:{triton.port}",
                "gen",
                "3",
                ("text_output",),
                Failure(SmokeTestError, "generate"),
            )
            try:
                with pytest.raises(error) as caught:
                    session({"text_input": np.array([[b"hi"]], np.object_)})
            finally:
                session.close()
        assert "max_tokens 900 is outside 1..127" in str(caught.value)
