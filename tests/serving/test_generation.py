"""The text-generation serving core in-process, on a tiny random Llama, on both engines: the
serving core's own in-flight batching over the fp32 ONNX export (ONNX Runtime), and OpenVINO
GenAI's continuous batching over the stateful OpenVINO IR. Each gives every prompt what it gets
alone (whenever it joins), ends at stop strings, samples with a seed, refuses bad requests and
frees the place of a client that leaves; greedy text and the prompt's log-probability are
PyTorch's; and the quantized candidates the gate measures (int8 and int4, block-wise for ONNX
Runtime, NNCF weight compression for OpenVINO GenAI) are scored, each its own figure."""

from __future__ import annotations

import json
import threading
import time

import numpy as np
import pytest

from tests.tiny_models import CORPUS, build_tiny_llama

PROMPTS = list(dict.fromkeys(CORPUS))


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    import torch

    from hf2triton.kinds.base import save_fast_tokenizer
    from hf2triton.kinds.text_generation import (
        TextGenerationKind,
        TextGenerationSpec,
        resolve_text_generation,
    )
    from hf2triton.release.export import optimum_export

    torch.set_num_threads(1)  # tiny model on a shared 2-core machine (see test_text_generation)
    tmp = tmp_path_factory.mktemp("generation-core")
    model_dir = build_tiny_llama(tmp / "llama")
    out = tmp / "onnx"
    optimum_export(str(model_dir), out, "text-generation-with-past", 17, "model.onnx")
    save_fast_tokenizer(str(model_dir), out)
    cfg = resolve_text_generation(model_dir, TextGenerationSpec(max_new_tokens=20))
    kind = TextGenerationKind.__new__(TextGenerationKind)
    settings = {
        **kind.serving_json(cfg, str(out), threads=1),
        "onnx": str(out / "model.onnx"),
        "tokenizer_file": str(out / "tokenizer.json"),
    }
    return {"model_dir": model_dir, "out": out, "cfg": cfg, "settings": settings}


@pytest.fixture(scope="module")
def genai_exported(exported, tmp_path_factory):
    """The same Llama as OpenVINO GenAI serves it: the stateful IR the runtime plug-in builds."""
    from hf2triton.kinds import kind_class
    from hf2triton.runtimes.base import VariantContext
    from hf2triton.runtimes.openvino_genai import stateful_ir
    from hf2triton.spec import QuantizationSpec

    ctx = VariantContext(
        onnx_path=str(exported["out"] / "model.onnx"),
        export_dir=str(exported["out"]),
        model_dir=str(exported["model_dir"]),
        kind=kind_class("text-generation")(None, None),  # its name picks the IR's layout
        quantization=QuantizationSpec(method="int8-blockwise", block_size=16),
        calibration=None,
        max_length=None,
        work=str(tmp_path_factory.mktemp("genai-work")),
    )
    ir = stateful_ir(ctx)
    settings = {
        **exported["settings"],
        "onnx": ir["onnx_path"],
        "runtime": {"name": "openvino-genai", "device": "cpu", "precision": "fp32"},
    }
    return {**exported, "ctx": ctx, "ir": ir, "settings": settings}


@pytest.fixture(params=["onnxruntime", "openvino-genai"])
def engine_settings(request, exported):
    """serving.json of the Llama on each engine."""
    if request.param == "openvino-genai":
        return request.getfixturevalue("genai_exported")["settings"]
    return exported["settings"]


def _kind(model_dir):
    """The text-generation kind of a spec for `model_dir` (the gate's requests and scores)."""
    from hf2triton.spec import kind_for, parse_spec

    return kind_for(
        parse_spec(
            {
                "name": "tiny-llama",
                "task": "text-generation",
                "source": {"path": str(model_dir)},
                "registry": {"model_name": "tiny-llama"},
                "validation": {"sentences": "unused.txt"},
                "text_generation": {"max_new_tokens": 20},
            }
        )
    )


def _load(settings, **changes):
    from hf2triton import serving

    return serving.load("", {**settings, **changes})


def _request(prompt: str, **params) -> dict[str, np.ndarray]:
    arrays = {"text_input": np.array([[prompt.encode()]], dtype=object)}
    for name, value in params.items():
        if isinstance(value, list):
            arrays[name] = np.array([[v.encode() for v in value]], dtype=object)
        elif isinstance(value, float):
            arrays[name] = np.array([[value]], np.float32)
        else:
            arrays[name] = np.array([[value]], np.int32 if name != "seed" else np.uint64)
    return arrays


def _text(answer) -> str:
    return answer["text_output"][0, 0].decode()


def test_prompts_that_join_a_running_batch_get_what_they_get_alone(exported):
    from hf2triton.serving import causal

    model = _load(exported["settings"])
    try:
        alone = [_text(model.answer([_request(p)])[0]) for p in PROMPTS]
        # Streams start at staggered times: each joins while others are mid-way.
        got: dict[int, str] = {}
        done = threading.Semaphore(0)

        def emit_for(i):
            def emit(text, ids, last, seq):
                got[i] = got.get(i, "") + text
                if last:
                    done.release()

            return emit

        # Count the prompts that joined a batch that was already decoding others.
        joined_running = []
        join = model.engine._join

        def counting_join(joining, present, mask):
            joined_running.append(len(joining) if model.engine.running else 0)
            return join(joining, present, mask)

        model.engine._join = counting_join
        rows = [model.parse(_request(p, stream=True))[0] for p in PROMPTS]
        for i, row in enumerate(rows):
            model.engine.submit(
                [
                    causal.Sequence(
                        prompt=row["ids"], sampling=row["sampling"], emit=emit_for(i), stream=True
                    )
                ]
            )
            time.sleep(0.002 * (i % 3))
        for _ in rows:
            done.acquire()
        assert [got[i] for i in range(len(rows))] == alone
        assert sum(joined_running) > 0, joined_running  # some joined mid-way, as meant
        assert not model.engine.running  # every finished sequence left the batch
    finally:
        model.close()


def test_stop_strings_end_the_text_before_them(engine_settings):
    model = _load(engine_settings)
    try:
        full = _text(model.answer([_request(PROMPTS[1])])[0])
        stop = full[5:8]
        assert stop and full.find(stop) >= 0
        cut = model.answer([_request(PROMPTS[1], stop_words=[stop])])[0]
        assert _text(cut) == full[: full.find(stop)]
        assert cut["finish_reason"][0, 0] == b"stop"
    finally:
        model.close()


def test_bad_parameters_and_long_prompts_are_refused(engine_settings):
    model = _load(engine_settings)
    try:
        answers = model.answer(
            [
                _request("hello", max_tokens=0),
                _request("hello", top_p=1.5),
                _request("the quick brown fox " * 40),
                _request("hello"),
            ]
        )
        assert answers[0] == "max_tokens 0 is outside 1..127"
        assert answers[1].startswith("top_p 1.5 is outside")
        assert "over this model's context length 128" in answers[2]
        assert isinstance(answers[3], dict)  # the good one is answered
    finally:
        model.close()


def test_seeded_sampling_repeats_and_differs_from_greedy(engine_settings):
    model = _load(engine_settings)
    try:

        def ids(**params):
            return model.answer([_request(PROMPTS[0], **params)])[0]["output_ids"][0].tolist()

        sampled = [ids(temperature=1.0, top_k=20, seed=3) for _ in range(2)]
        assert sampled[0] == sampled[1] != ids()
        assert ids(temperature=1.0, top_k=20, seed=4) != sampled[0]
    finally:
        model.close()


def test_a_client_that_leaves_frees_its_row(engine_settings):
    from hf2triton.serving import causal

    model = _load(engine_settings)
    try:
        row = model.parse(_request(PROMPTS[0], stream=True, max_tokens=90))[0]
        left = threading.Event()
        finished = threading.Event()
        seen = []

        def emit(text, ids, last, seq):
            seen.append(ids)
            if len(seen) == 2:
                left.set()
            if last:
                finished.set()

        seq = causal.Sequence(
            prompt=row["ids"], sampling=row["sampling"], emit=emit, stream=True, gone=left.is_set
        )
        model.engine.submit([seq])
        assert finished.wait(60)
        assert seq.finish == "cancelled" and len(seq.generated) < 90
        assert not model.engine.running
    finally:
        model.close()


def test_staggered_streams_get_what_they_get_alone_on_either_engine(engine_settings):
    from hf2triton.serving import causal

    model = _load(engine_settings)
    try:
        alone = [_text(model.answer([_request(p)])[0]) for p in PROMPTS]
        got: dict[int, str] = {}
        done = threading.Semaphore(0)

        def emit_for(i):
            def emit(text, ids, last, seq):
                got[i] = got.get(i, "") + text
                if last:
                    done.release()

            return emit

        rows = [model.parse(_request(p, stream=True))[0] for p in PROMPTS]
        for i, row in enumerate(rows):
            model.engine.submit(
                [
                    causal.Sequence(
                        prompt=row["ids"], sampling=row["sampling"], emit=emit_for(i), stream=True
                    )
                ]
            )
            time.sleep(0.002 * (i % 3))
        for _ in rows:
            done.acquire()
        assert [got[i] for i in range(len(rows))] == alone
        assert not model.engine.running
    finally:
        model.close()


def test_openvino_genai_gives_pytorchs_greedy_text_and_prompt_logprob(genai_exported):
    """Greedy continuations (some end at end of text) and the prompts' log-probabilities, as
    the gate requests them, equal PyTorch's."""
    from hf2triton.kinds.base import Data

    kind = _kind(genai_exported["model_dir"])
    cfg = genai_exported["cfg"]
    reference = kind.reference(str(genai_exported["model_dir"]), cfg, Data(PROMPTS))
    model = _load(genai_exported["settings"])
    try:
        assert model.engine.model.in_use == "OpenVINO GenAI CPU f32 (KV cache f32)"
        outputs = kind.extract(model.answer(kind.requests(PROMPTS)))
    finally:
        model.close()
    assert [o["ids"] for o in outputs] == [r["ids"] for r in reference]
    assert any(len(r["ids"]) < cfg.gate_tokens for r in reference)  # some end early
    for o, r in zip(outputs, reference):
        assert abs(o["logprob"] - r["logprob"]) < 1e-3 * max(1.0, abs(r["logprob"]))


def test_openvino_genai_refuses_what_it_would_not_generate_faithfully(genai_exported):
    from hf2triton.serving.runtimes import RuntimeUnavailable

    with pytest.raises(RuntimeUnavailable, match="no_repeat_ngram_size"):
        _load(
            genai_exported["settings"],
            processors={**genai_exported["settings"]["processors"], "no_repeat_ngram_size": 3},
        )
    bf16 = {**genai_exported["settings"]["runtime"], "precision": "bf16", "kv_cache": "f32"}
    with pytest.raises((RuntimeUnavailable, ValueError), match="bf16|offer"):
        _load(genai_exported["settings"], runtime=bf16)


@pytest.mark.parametrize("split", [False, True])
def test_openvino_genai_prompts_longer_than_a_step_get_what_they_get_alone(genai_exported, split):
    """With a step of 8 tokens, prompts several steps long are prefilled whole in a step of
    their own (the default) or split over steps fused with decoding (`split_prompts`): either
    way each prompt, alone or among others, gets the text the default engine gives it."""
    from hf2triton.serving import causal

    settings = genai_exported["settings"]
    reference = _load(settings)
    try:
        long_prompts = [" ".join(PROMPTS[i : i + 2]) for i in range(0, 8, 2)]
        answers = [reference.answer([_request(p)])[0] for p in long_prompts]
        assert all(isinstance(a, dict) for a in answers), answers
        alone = [_text(a) for a in answers]
    finally:
        reference.close()
    runtime = {**settings["runtime"], "split_prompts": split}
    model = _load(settings, runtime=runtime, step_tokens=8)
    try:
        assert model.engine.pipe  # built with this scheduler: 8 tokens a step
        rows = [model.parse(_request(p))[0] for p in long_prompts]
        assert min(len(r["ids"]) for r in rows) > 8
        got: dict[int, str] = {}
        done = threading.Semaphore(0)

        def emit_for(i):
            def emit(text, ids, last, seq):
                got[i] = got.get(i, "") + text
                if last:
                    done.release()

            return emit

        for i, row in enumerate(rows):
            model.engine.submit(
                [
                    causal.Sequence(
                        prompt=row["ids"], sampling=row["sampling"], emit=emit_for(i), stream=True
                    )
                ]
            )
            time.sleep(0.003)
        for _ in rows:
            done.acquire()
        assert [got[i] for i in range(len(rows))] == alone
    finally:
        model.close()


def test_request_level_batching_serves_the_same_text(exported):
    inflight, request_level = (
        _load(exported["settings"]),
        _load(exported["settings"], batching="request"),
    )
    try:
        reqs = [_request(p) for p in PROMPTS[:8]]
        assert [_text(a) for a in inflight.answer(reqs)] == [
            _text(a) for a in request_level.answer(reqs)
        ]
    finally:
        inflight.close()
        request_level.close()


def test_int8_and_int4_blockwise_candidates_are_scored_by_the_gate_metrics(exported, tmp_path):
    from hf2triton.kinds.base import Data
    from hf2triton.runtimes.quantizers import quantize_onnx
    from hf2triton.spec import QuantizationSpec

    kind = _kind(exported["model_dir"])
    cfg = exported["cfg"]
    data = Data(PROMPTS)
    reference = kind.reference(str(exported["model_dir"]), cfg, data)
    scores = {}
    for method in ("none", "int8-blockwise", "int4-blockwise"):
        variant = quantize_onnx(
            str(exported["out"] / "model.onnx"),
            QuantizationSpec(method=method, block_size=16),
            str(tmp_path),
        )
        model = _load(exported["settings"], onnx=variant["onnx_path"])
        try:
            outputs = kind.extract(model.answer(kind.judging_requests(PROMPTS, reference)))
        finally:
            model.close()
        scores[method], _ = kind.score(reference, outputs, data, cfg)
    print(scores)
    assert scores["none"]["token_match"] == 1.0
    assert scores["none"]["next_token_agreement"] == 1.0  # teacher-forced on PyTorch's ids
    assert abs(scores["none"]["perplexity_increase"]) < 1e-5
    # Fewer bits, further from PyTorch: each figure is measured, none is a copy of fp32's.
    assert (
        abs(scores["int4-blockwise"]["perplexity_increase"])
        > abs(scores["int8-blockwise"]["perplexity_increase"])
        > 0.0
    )
    assert scores["int4-blockwise"]["token_match"] < 1.0
    assert scores["int4-blockwise"]["next_token_agreement"] < 1.0


def test_a_stream_with_clean_up_spaces_holds_back_what_a_later_token_rewrites():
    """Tokenizers that clean up spaces (" 's" -> "'s", " ." -> ".") rewrite the end of the text
    when the next token comes: the engine's stream must only send what stays, so the pieces
    join to the whole text. A tokenizer of whole strings stands in for the model's (each id one
    of `tokens`), driven through the engine's own streaming step."""
    from hf2triton.serving import causal
    from hf2triton.serving.seq2seq import clean_up_tokenization

    class Pieces:
        clean_up = True

        def __init__(self, tokens):
            self.tokens = tokens

        def decode(self, ids):
            return clean_up_tokenization("".join(self.tokens[i] for i in ids))

    for tokens in (
        ["It", " '", "s", " fine", " ."],
        ["I", " do", " n", "'t", " know", " !"],
        ["he", " said", " '", " yes", " '", " ,", " then"],
        ["a", " ", "b", " 've"],
    ):
        tok = Pieces(tokens)
        engine = causal.Engine(None, tok, eos=[], processors=None)
        sent: list[str] = []
        seq = causal.Sequence(
            prompt=[],
            sampling=causal.Sampling(max_new_tokens=99),
            emit=lambda text, ids, last, s: sent.append(text),  # noqa: B023 - used in the loop
            stream=True,
        )
        for i in range(len(tokens)):
            seq.generated.append(i)
            engine._stream(seq)
        engine._finish(seq, "length")
        whole = tok.decode(range(len(tokens)))
        assert "".join(sent) == whole, (tokens, sent)
        assert len(sent) > 2, sent  # it streamed, not one piece at the end


def test_openvino_genai_compressed_candidates_are_scored_by_the_gate_metrics(genai_exported):
    from hf2triton.kinds.base import Data
    from hf2triton.runtimes.openvino_genai import compressed

    kind = _kind(genai_exported["model_dir"])
    cfg = genai_exported["cfg"]
    data = Data(PROMPTS)
    reference = kind.reference(str(genai_exported["model_dir"]), cfg, data)
    scores = {}
    for name, variant in (
        ("f32", genai_exported["ir"]),
        ("int8", compressed(genai_exported["ctx"], "INT8_ASYM", 0)),
        ("int8-sym", compressed(genai_exported["ctx"], "INT8_SYM", 0)),
        ("int4", compressed(genai_exported["ctx"], "INT4_ASYM", 16)),
    ):
        model = _load(genai_exported["settings"], onnx=variant["onnx_path"])
        try:
            outputs = kind.extract(model.answer(kind.judging_requests(PROMPTS, reference)))
        finally:
            model.close()
        scores[name], _ = kind.score(reference, outputs, data, cfg)
        scores[name]["bytes"] = variant["size_bytes"]
    print(scores)
    assert scores["f32"]["token_match"] == 1.0
    assert scores["f32"]["next_token_agreement"] == 1.0
    assert abs(scores["f32"]["perplexity_increase"]) < 1e-4
    # (On a model this small the embeddings, int8 in both, weigh most: int4 is not smaller.)
    assert max(scores["int4"]["bytes"], scores["int8"]["bytes"]) < scores["f32"]["bytes"]
    assert abs(scores["int4"]["perplexity_increase"]) > abs(scores["int8"]["perplexity_increase"])
    # Symmetric int8 keeps no zero points: smaller, and still far closer to PyTorch than int4.
    assert scores["int8-sym"]["bytes"] < scores["int8"]["bytes"]
    sym = abs(scores["int8-sym"]["perplexity_increase"])
    assert np.isfinite(sym) and sym < abs(scores["int4"]["perplexity_increase"])


def test_the_search_also_tries_symmetric_int8_weights_on_a_generator(genai_exported):
    """With quantization.search a generator's OpenVINO GenAI candidates gain symmetric int8
    weights (a bf16 decode step 10% faster at SmolLM2-135M's shape, coarser numerics for the gate
    to judge); a release that asks for int8 without the search builds the asymmetric only."""
    from dataclasses import replace

    from hf2triton.runtimes.openvino_genai import OpenVinoGenAI
    from hf2triton.spec import QuantizationSpec

    def methods(quantization: QuantizationSpec) -> list[str]:
        ctx = replace(genai_exported["ctx"], quantization=quantization)
        return [r.method for r in OpenVinoGenAI.recipes(ctx)]

    assert methods(QuantizationSpec(search=True)) == [
        "openvino-ir",
        "openvino-ir/int8-sym",  # first of the compressed: what times a family at one stream
        "openvino-ir/int8",
        "openvino-ir/int4-g32",
    ]
    assert methods(QuantizationSpec(method="int8-blockwise")) == ["openvino-ir", "openvino-ir/int8"]


@pytest.mark.parametrize("split", [False, True])
@pytest.mark.parametrize("streams", [32, 64])
def test_prompts_up_to_the_context_never_fail_a_scheduler_step(genai_exported, streams, split):
    """OpenVINO GenAI's scheduler refuses a step whose sequence is longer than its batched-token
    budget. Prompts of every length up to the model's whole context (less the tokens asked
    for), `streams` of them at once on as many rows: every one is answered, none is refused,
    whatever the prompts' mix, prompts split over steps or not."""
    settings = genai_exported["settings"]
    context, new = int(settings["max_context"]), 4
    runtime = {**settings["runtime"], "split_prompts": split}
    model = _load(settings, runtime=runtime, max_rows=streams, step_tokens=64)
    try:
        words = " ".join(PROMPTS).split()
        lengths = np.linspace(1, context - new, streams).round().astype(int)
        prompts = []
        for want in lengths.tolist():
            text, n = "", 0
            while n < want:
                text = (text + " " + words[len(text) % len(words)]).strip()
                n = len(model.tokenizer.encode(text))
            while n > want:  # back to at most `want` tokens
                text = text.rsplit(" ", 1)[0]
                n = len(model.tokenizer.encode(text))
            prompts.append(text)
        assert max(len(model.tokenizer.encode(p)) for p in prompts) > context - 2 * new
        answers = model.answer([_request(p, max_tokens=new) for p in prompts])
    finally:
        model.close()
    refused = [a for a in answers if isinstance(a, str)]
    assert not refused, refused[:2]
    reasons = {a["finish_reason"][0, 0].decode() for a in answers}
    assert reasons <= {"length", "stop"}, reasons


SCHEMAS = {
    "object": {
        "type": "object",
        "properties": {
            "answer": {"enum": ["yes", "no", "maybe"]},
            "confidence": {"type": "integer"},
            "tags": {"type": "array", "items": {"type": "string", "maxLength": 6}, "maxItems": 3},
            "note": {"type": ["string", "null"], "maxLength": 10},
        },
        "required": ["answer", "confidence", "tags"],
        "additionalProperties": False,
    },
    "refs": {
        "$defs": {
            "Point": {
                "type": "object",
                "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
                "required": ["x", "y"],
            }
        },
        "type": "object",
        "properties": {
            "points": {
                "type": "array",
                "items": {"$ref": "#/$defs/Point"},
                "minItems": 1,
                "maxItems": 2,
            },
            "closed": {"type": "boolean"},
        },
        "required": ["points"],
    },
    "optional-only": {
        "type": "object",
        "properties": {"a": {"type": "boolean"}, "b": {"const": 7}},
    },
    "anyof": {"anyOf": [{"type": "integer"}, {"enum": ["none"]}]},
}


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_json_schema_constrains_a_random_model_to_valid_json(genai_exported, name):
    """A random tiny model, told nothing, writes JSON that validates against the request's
    schema when the decoding is constrained to it: every prompt, compact, within max_tokens."""
    import jsonschema

    model = _load(genai_exported["settings"])
    try:
        schema = SCHEMAS[name]
        requests = []
        for p in ("hello", "the answer", "tell me", "now", "json please", "why"):
            r = _request(p, max_tokens=110)
            r["json_schema"] = np.array([[json.dumps(schema).encode()]], dtype=object)
            requests.append(r)
        answers = model.answer(requests)
    finally:
        model.close()
    assert not [a for a in answers if isinstance(a, str)], answers
    for a in answers:
        assert a["finish_reason"][0, 0].decode() == "stop", _text(a)
        jsonschema.validate(json.loads(_text(a)), schema)


@pytest.mark.parametrize(
    "schema, part",
    [
        (
            {"type": "object", "properties": {"s": {"type": "string", "pattern": "^a"}}},
            "$.properties.s.pattern",
        ),
        (
            {"type": "object", "properties": {"n": {"type": "integer", "minimum": 3}}},
            "$.properties.n.minimum",
        ),
        ({"type": "object", "properties": {"p": {"$ref": "#/$defs/Nope"}}}, "$.properties.p.$ref"),
        ({"type": "object", "required": ["x"], "properties": {}}, "$.required"),
        ({"type": "strin"}, "$.type"),
    ],
)
def test_a_schema_the_grammar_cannot_enforce_is_refused_naming_its_part(
    genai_exported, schema, part
):
    model = _load(genai_exported["settings"])
    try:
        r = _request(PROMPTS[0])
        r["json_schema"] = np.array([[json.dumps(schema).encode()]], dtype=object)
        (answer,) = model.answer([r])
    finally:
        model.close()
    assert isinstance(answer, str) and f"json_schema {part}:" in answer, answer


def test_the_serving_cores_own_engine_refuses_a_schema_naming_the_runtime(exported):
    model = _load(exported["settings"])
    try:
        r = _request(PROMPTS[0])
        r["json_schema"] = np.array([[b'{"type": "object"}']], dtype=object)
        (answer,) = model.answer([r])
    finally:
        model.close()
    assert isinstance(answer, str) and "serve the model on runtime openvino-genai" in answer


def test_openvino_genai_serves_compressed_weights_with_quantized_activations(genai_exported):
    """The latency objective's candidate (activations quantized in groups of 32 beside the IR's
    int8 weights) opens with the property pinned, generates, and scores prompts: what the gate
    judges and Triton serves. Its numerics differ from the same weights without it, so the
    greedy text is compared loosely: the first new token of most prompts agrees."""
    from hf2triton.runtimes.openvino_genai import compressed

    kind, cfg = _kind(genai_exported["model_dir"]), genai_exported["cfg"]
    int8 = compressed(genai_exported["ctx"], "INT8_ASYM", 0)
    settings = {**genai_exported["settings"], "onnx": int8["onnx_path"]}
    answers = {}
    for group in (0, 32):
        runtime = {**settings["runtime"], "dynamic_quantization": group}
        model = _load(settings, runtime=runtime, max_new_tokens=cfg.gate_tokens)
        try:
            if group:
                assert "activations quantized in groups of 32" in model.engine.model.in_use
            answers[group] = kind.extract(model.answer(kind.requests(PROMPTS)))
        finally:
            model.close()
    assert all(o["ids"] and np.isfinite(o["logprob"]) for o in answers[32])
    first = [a["ids"][0] == b["ids"][0] for a, b in zip(answers[0], answers[32])]
    assert sum(first) >= 0.75 * len(first), first


def test_the_model_itself_agrees_on_every_next_token_under_its_repetition_penalty(
    engine_settings, exported
):
    """A model whose generation config sets a repetition penalty: PyTorch's continuation is
    what `generate` picks with the penalty, so the gate's teacher-forced agreement picks with it
    too. The fp32 graph (PyTorch's own answers) agrees on every token, on each engine; with the
    plain argmax it would be refused for tokens the penalty changed."""
    from dataclasses import replace

    from hf2triton.kinds.base import Data

    kind, data = _kind(exported["model_dir"]), Data(PROMPTS)
    cfg = exported["cfg"]
    cfg = replace(cfg, defaults={**cfg.defaults, "repetition_penalty": 1.3})
    reference = kind.reference(str(exported["model_dir"]), cfg, data)
    plain = kind.reference(str(exported["model_dir"]), exported["cfg"], data)
    assert [r["ids"] for r in reference] != [r["ids"] for r in plain]  # the penalty changed some
    model = _load({**engine_settings, "defaults": cfg.defaults})
    try:
        outputs = kind.extract(model.answer(kind.judging_requests(PROMPTS, reference)))
    finally:
        model.close()
    scores, _ = kind.score(reference, outputs, data, cfg)
    assert scores["next_token_agreement"] == 1.0, scores
    assert abs(scores["perplexity_increase"]) < 1e-4, scores
