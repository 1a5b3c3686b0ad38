"""hf2triton/openai_api/state.py: what the routes share on the app's state. The one model of a
kind when a request names none (refused naming `model` when there are none or several), a
504 once an answer takes over the time limit, and the Triton client made on first use."""

from __future__ import annotations

import asyncio

import pytest

from hf2triton.openai_api.app import create_app
from hf2triton.openai_api.errors import ApiError
from hf2triton.openai_api.state import only_model, settings_of, timed, triton_of
from hf2triton.openai_api.triton import Triton
from tests.openai_api.test_routes import FakeTriton


class Request:
    """What the routes read off a request: its app."""

    def __init__(self, app) -> None:
        self.app = app


def request(fake=None, **settings) -> Request:
    app = create_app("localhost:1", **settings)
    app.state.triton = fake
    return Request(app)


def test_the_one_model_of_a_kind_is_found_and_none_or_several_refused():
    r = request(FakeTriton())
    assert asyncio.run(only_model(r, "reranking")) == "rr"
    with pytest.raises(ApiError) as caught:
        asyncio.run(only_model(r, "translation"))
    assert (
        caught.value.param == "model"
        and caught.value.message == "name the model: 0 translation models are served"
    )


def test_an_answer_over_the_time_limit_is_a_504():
    r = request(FakeTriton(), timeout_s=0.05)
    assert settings_of(r).timeout_s == 0.05
    assert asyncio.run(timed(r, asyncio.sleep(0, result="quick"))) == "quick"
    with pytest.raises(ApiError) as caught:
        asyncio.run(timed(r, asyncio.sleep(5)))
    assert (caught.value.status, caught.value.code) == (504, "timeout")


def test_the_triton_client_is_made_once_on_first_use():
    r = request(None)

    async def twice():
        return triton_of(r), triton_of(r)

    first, second = asyncio.run(twice())
    assert isinstance(first, Triton) and first is second and first.url == "localhost:1"
