"""Tiny ONNX graphs written by hand for the serving core's tests, and the tokenizer they read:
what each graph computes is known, so a test can tell its right answer from a wrong one."""

from __future__ import annotations

from pathlib import Path

import numpy as np

WORDS = ["[PAD]", "[UNK]", *(f"w{i}" for i in range(2, 40))]


def tokenizer_file(path: Path, max_length: int | None = None) -> Path:
    """A word-level tokenizer.json: "wN" is id N, other words [UNK] (1); [PAD] is 0."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    fast = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="[UNK]"))
    fast.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast.add_special_tokens(["[PAD]"])
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
