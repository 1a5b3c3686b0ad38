"""hf2triton/openai_api/bodies.py: a route's own JSON read or refused with a 400 naming the first
field it fails on, answers written with numpy arrays, texts as Triton's BYTES arrays."""

from __future__ import annotations

import asyncio
import json

import numpy as np
import pytest
from pydantic import BaseModel, Field

from hf2triton.openai_api.bodies import Json, parse, read_json, text_array, texts_array
from hf2triton.openai_api.errors import ApiError


class Body(BaseModel):
    name: str
    count: int = Field(ge=1)


class Raw:
    """A request whose body is `data`."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def body(self) -> bytes:
        return self.data


def read(data: bytes):
    return asyncio.run(read_json(Raw(data)))


def test_a_json_object_is_read_and_anything_else_refused():
    assert read(b'{"a": 1}') == {"a": 1}
    for data, says in (
        (b"{nope", "The body is not valid JSON"),
        (b"[1, 2]", "The body must be a JSON object"),
    ):
        with pytest.raises(ApiError) as caught:
            read(data)
        assert caught.value.status == 400 and caught.value.message == says


def test_a_body_is_parsed_or_refused_naming_the_first_bad_field():
    assert parse(Body, {"name": "x", "count": 2}) == Body(name="x", count=2)
    with pytest.raises(ApiError) as caught:
        parse(Body, {"name": "x", "count": 0})
    assert (
        caught.value.param == "count"
        and caught.value.message == "count: Input should be greater than or equal to 1"
    )
    with pytest.raises(ApiError) as caught:
        parse(Body, {"count": 1})
    assert caught.value.param == "name" and caught.value.message == "name: Field required"


def test_answers_write_numpy_arrays_and_texts_go_as_utf8_bytes():
    rendered = Json({"v": np.array([1.5, 2.0], np.float32), "n": 3}).body
    assert json.loads(rendered) == {"v": [1.5, 2.0], "n": 3}
    assert text_array("é").tolist() == [["é".encode()]] and text_array("x").dtype == np.object_
    assert texts_array(["a", "b"]).shape == (2, 1)
