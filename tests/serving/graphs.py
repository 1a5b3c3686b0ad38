"""Tiny ONNX graphs written by hand for the serving core's tests, and the tokenizer they read:
what each graph computes is known, so a test can tell its right answer from a wrong one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

WORDS = ["[PAD]", "[UNK]", *(f"w{i}" for i in range(2, 40))]


def tokenizer_file(path: Path, max_length: int | None = None) -> Path:
    """A word-level tokenizer.json: "wN" is id N, other words [UNK] (1); [PAD] is 0 (both
    special: a decoder start or end id decodes to nothing)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    fast = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    fast.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast.add_special_tokens(["[PAD]", "[UNK]"])  # skipped when decoding
    if max_length:
        fast.enable_truncation(max_length=max_length)
    fast.save(str(path))
    return path


def sums_graph(path: Path, inputs: tuple[str, ...] = ("input_ids", "attention_mask")) -> Path:
    """An ONNX graph of token ids: `logits` [N, 2] = (sum of the row's real ids, its real token
    count x 10), and `hidden` [N, T, 1], each id as a float. Padding (mask 0) counts nothing,
    so a row's answer does not depend on the rows batched with it. Inputs besides the two it
    reads are declared and left unread."""
    import onnx
    from onnx import TensorProto, helper

    ins = [helper.make_tensor_value_info(n, TensorProto.INT64, ["N", "T"]) for n in inputs]
    nodes = [
        helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
        helper.make_node("Cast", ["kept"], ["kept_f"], to=TensorProto.FLOAT),
        helper.make_node("Cast", ["attention_mask"], ["mask_f"], to=TensorProto.FLOAT),
        helper.make_node("ReduceSum", ["kept_f", "axis1"], ["total"], keepdims=1),
        helper.make_node("ReduceSum", ["mask_f", "axis1"], ["count"], keepdims=1),
        helper.make_node("Mul", ["count", "ten"], ["count10"]),
        helper.make_node("Concat", ["total", "count10"], ["logits"], axis=1),
        helper.make_node("Unsqueeze", ["kept_f", "axis2"], ["hidden"]),
    ]
    consts = [
        helper.make_tensor("axis1", TensorProto.INT64, [1], [1]),
        helper.make_tensor("axis2", TensorProto.INT64, [1], [2]),
        helper.make_tensor("ten", TensorProto.FLOAT, [], [10.0]),
    ]
    outs = [
        helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["N", 2]),
        helper.make_tensor_value_info("hidden", TensorProto.FLOAT, ["N", "T", 1]),
    ]
    graph = helper.make_graph(nodes, "sums", ins, outs, initializer=consts)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return path


def expected_logits(rows: list[list[int]]) -> np.ndarray:
    return np.array([[sum(r), 10 * len(r)] for r in rows], np.float32)


def _save(nodes, name, inputs, outputs, path: Path, consts=()) -> None:
    import onnx
    from onnx import helper

    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(consts))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))


def _info(name: str, elem: int, shape: list) -> Any:
    from onnx import helper

    return helper.make_tensor_value_info(name, elem, shape)


def _copy_encoder(path: Path) -> None:
    """Its hidden states are the source's ids (0 where padded), [N, S, 1]."""
    from onnx import TensorProto, helper

    i64 = TensorProto.INT64
    _save(
        [
            helper.make_node("Mul", ["input_ids", "attention_mask"], ["kept"]),
            helper.make_node("Cast", ["kept"], ["kept_f"], to=TensorProto.FLOAT),
            helper.make_node("Unsqueeze", ["kept_f", "axis2"], ["last_hidden_state"]),
        ],
        "encoder",
        [_info("input_ids", i64, ["N", "S"]), _info("attention_mask", i64, ["N", "S"])],
        [_info("last_hidden_state", TensorProto.FLOAT, ["N", "S", 1])],
        path,
        [helper.make_tensor("axis2", i64, [1], [2])],
    )


def _copy_answer(source: str, position: str) -> list:
    """Nodes making logits [N, 1, V] that pick the source's id at `position` (a scalar)."""
    from onnx import TensorProto, helper

    return [
        helper.make_node("Squeeze", [source, "axes13"], ["src"]),  # [N, S]
        helper.make_node("Shape", ["src"], ["src_shape"]),
        helper.make_node("Gather", ["src_shape", "one"], ["S"], axis=0),
        helper.make_node("Range", ["zero", "S", "one"], ["positions"]),
        helper.make_node("Equal", ["positions", position], ["here"]),
        helper.make_node("Cast", ["here"], ["here_f"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["src", "here_f"], ["picked"]),
        helper.make_node("ReduceSum", ["picked", "axis1"], ["value"], keepdims=0),
        helper.make_node("Cast", ["value"], ["token"], to=TensorProto.INT64),
        helper.make_node("OneHot", ["token", "depth", "onoff"], ["scores"], axis=-1),
        helper.make_node("Unsqueeze", ["scores", "axis1"], ["logits"]),
    ]


def _copy_decoders(directory: Path, vocab: int) -> None:
    """The first step answers the source's first id; a step after P tokens, its P-th."""
    from onnx import TensorProto, helper

    i64, f32 = TensorProto.INT64, TensorProto.FLOAT
    consts = [
        helper.make_tensor("axes13", i64, [2], [1, 3]),
        helper.make_tensor("axis1", i64, [1], [1]),
        helper.make_tensor("axes23", i64, [2], [2, 3]),
        helper.make_tensor("zero", i64, [], [0]),
        helper.make_tensor("one", i64, [], [1]),
        helper.make_tensor("depth", i64, [], [vocab]),
        helper.make_tensor("onoff", f32, [2], [0.0, 10.0]),
    ]
    step_in = _info("input_ids", i64, ["N", 1])
    mask_in = _info("encoder_attention_mask", i64, ["N", "S"])
    outs = [
        _info("logits", f32, ["N", 1, vocab]),
        _info("present.0.decoder.key", f32, ["N", 1, "T", 1]),
        _info("present.0.encoder.key", f32, ["N", 1, "S", 1]),
    ]
    encoder_key = "present.0.encoder.key"
    _save(
        [
            helper.make_node("Unsqueeze", ["encoder_hidden_states", "axis1"], [encoder_key]),
            helper.make_node("Cast", ["input_ids"], ["ids_f"], to=f32),
            helper.make_node("Unsqueeze", ["ids_f", "axes23"], ["present.0.decoder.key"]),
            *_copy_answer(encoder_key, "zero"),
        ],
        "decoder",
        [step_in, _info("encoder_hidden_states", f32, ["N", "S", 1]), mask_in],
        outs,
        directory / "decoder_model.onnx",
        consts,
    )
    past = ["past_key_values.0.decoder.key", "past_key_values.0.encoder.key"]
    _save(
        [
            helper.make_node("Identity", [past[1]], [encoder_key]),
            helper.make_node("Cast", ["input_ids"], ["ids_f"], to=f32),
            helper.make_node("Unsqueeze", ["ids_f", "axes23"], ["new"]),
            helper.make_node("Concat", [past[0], "new"], ["present.0.decoder.key"], axis=2),
            helper.make_node("Shape", [past[0]], ["past_shape"]),
            helper.make_node("Gather", ["past_shape", "two"], ["P"], axis=0),
            *_copy_answer(encoder_key, "P"),
        ],
        "decoder_with_past",
        [
            step_in,
            mask_in,
            _info(past[0], f32, ["N", 1, "P", 1]),
            _info(past[1], f32, ["N", 1, "S", 1]),
        ],
        outs,
        directory / "decoder_with_past_model.onnx",
        [*consts, helper.make_tensor("two", i64, [], [2])],
    )


def copy_translator(directory: Path, vocab: int = len(WORDS)) -> dict[str, str]:
    """An encoder-decoder export (encoder, decoder, decoder with past) that copies its source:
    the decoder's k-th step answers the source's k-th id, and id 0 (the end) past its last.
    Returns the files as serving.json's `files` names them."""
    _copy_encoder(directory / "encoder_model.onnx")
    _copy_decoders(directory, vocab)
    return {
        "encoder": "encoder_model.onnx",
        "decoder": "decoder_model.onnx",
        "decoder_with_past": "decoder_with_past_model.onnx",
    }
