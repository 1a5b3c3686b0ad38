"""hf2triton/serving/base.py: one dynamic batch in, one answer per request out. A request that
cannot be parsed gets its error message alone while the others are answered with their own rows;
the input readers refuse a malformed input naming it."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hf2triton.serving.base import (
    TEXT,
    Deferred,
    ServedModel,
    Tensor,
    column,
    int_column,
    text_column,
    value_column,
)


class Shouter(ServedModel):
    """Upper-cases each text; LENGTH is its length. Counts the rows of each run."""

    inputs = (TEXT,)
    outputs = (Tensor("LOUD", "STRING"), Tensor("LENGTH", "INT32"))

    def __init__(self) -> None:
        self.runs: list[int] = []

    def parse(self, arrays):
        rows = text_column(arrays)
        if any(not t for t in rows):
            raise ValueError("TEXT must not be empty")
        return rows

    def run(self, rows):
        self.runs.append(len(rows))
        return {
            "LOUD": [np.array([t.upper().encode()], np.object_) for t in rows],
            "LENGTH": [np.array([len(t)], np.int32) for t in rows],
        }


def texts(*values: str | bytes) -> dict[str, np.ndarray]:
    return {
        "TEXT": np.array([[v if isinstance(v, bytes) else v.encode()] for v in values], np.object_)
    }


def test_each_request_gets_its_own_rows_back_in_order_from_one_run():
    model = Shouter()
    answers = model.answer([texts("ab", "c"), texts(""), texts("def")])
    assert model.runs == [3]  # the good requests' rows ran together, once
    first, bad, last = answers
    assert first["LOUD"].tolist() == [[b"AB"], [b"C"]] and first["LENGTH"].tolist() == [[2], [1]]
    assert bad == "TEXT must not be empty"
    assert last["LOUD"].tolist() == [[b"DEF"]]


class SlowShouter(Shouter):
    """Shouter whose texts are made late (Deferred), as an image is decoded: a text of two or
    more letters waits, up to 10 s, until another is being made at once; "bad" is refused when
    it is made."""

    def __init__(self) -> None:
        super().__init__()
        self.together = threading.Barrier(2, timeout=10)

    def parse(self, arrays):
        return [
            Deferred(lambda t=t, i=i: self.make(t, i)) for i, t in enumerate(text_column(arrays))
        ]

    def make(self, text: str, i: int) -> str:
        if text == "bad":
            raise ValueError(f"TEXT[{i}]: bad is refused")
        if text == "odd":  # a decoder's own error type, not ValueError
            raise TypeError("unpack requires a buffer of 4 bytes")
        if len(text) > 1:
            self.together.wait()
        return text


def test_deferred_rows_of_a_batch_are_made_side_by_side_and_a_refused_one_fails_its_request_alone():
    model = SlowShouter()
    first, bad, odd, last = model.answer(
        [texts("ab"), texts("x", "bad"), texts("odd"), texts("def")]
    )
    # "ab" and "def" waited for each other: made one after the other, the barrier breaks.
    assert first["LOUD"].tolist() == [[b"AB"]] and last["LOUD"].tolist() == [[b"DEF"]]
    assert bad == "TEXT[1]: bad is refused"
    assert odd.startswith("the file could not be read (TypeError: unpack requires")
    assert model.runs == [2]  # the refused request's good row ("x") did not run either


def test_a_batch_of_bad_requests_runs_nothing():
    model = Shouter()
    assert model.answer([texts(""), {}]) == [
        "TEXT must not be empty",
        "the request has no input TEXT",
    ]
    assert model.runs == []


def test_inputs_are_refused_naming_the_input_and_what_was_wrong():
    with pytest.raises(ValueError, match=r"TEXT must have shape \[batch, n\], got \[2\]"):
        column({"TEXT": np.array([b"a", b"b"], np.object_)}, "TEXT")
    with pytest.raises(ValueError, match=r"TEXT must have shape \[batch, 1\], got \[1, 2\]"):
        text_column({"TEXT": np.array([[b"a", b"b"]], np.object_)})
    with pytest.raises(ValueError, match=r"TEXT\[1\] is not valid UTF-8"):
        text_column(texts("ok", b"\xff\xfe"))
    with pytest.raises(
        ValueError, match=r"SEED needs one value per text: shape \[2, 1\], got \[1, 1\]"
    ):
        value_column({"SEED": np.array([[3]])}, "SEED", rows=2)
    assert column({}, "OPTIONAL", required=False) is None


def test_optional_per_row_values_come_back_as_python_numbers_or_none():
    assert int_column({"N": np.array([[4], [5]], np.int32)}, "N", rows=2) == [4, 5]
    assert int_column({}, "N", rows=3) == [None, None, None]
    values = value_column({"T": np.array([[0.5]], np.float32)}, "T", rows=1)
    assert values == [0.5] and type(values[0]) is float
    assert text_column(texts("héllo")) == ["héllo"]
