"""text-generation releases end to end on tiny random-weight causal LMs (a Llama served by
OpenVINO GenAI's continuous batching, a GPT-2 by the serving core's own in-flight batching on
ONNX Runtime; built once per module): real export, gate, MLflow (SQLite) and a real Triton server
on free ports. Served greedy text must equal PyTorch `generate` token for token, a gRPC stream
must deliver pieces before the last token is generated, concurrent streams must each get what
they get alone, and a client that leaves mid-stream frees its place."""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Literal

import numpy as np
import pytest
import tritonclient.grpc as grpcclient

from tests.conftest import free_port, tiny_spec
from tests.tiny_models import CORPUS, build_tiny_gpt2, build_tiny_llama

PROMPTS = list(dict.fromkeys(CORPUS)) + [
    "a",
    "ok then",
    "prices rose 12.5% to $43,210!",
    "ÄÖÜ ß straße 😀",
    "word " * 20,
]
MAX_NEW = 24
GENAI = {"name": "openvino-genai", "precision": "fp32"}


def _release(
    tmp: Path,
    model_dir: Path,
    name: str,
    ports: dict,
    runtimes: list,
    quantization: str,
    max_rows: int = 32,
):
    import yaml

    from hf2triton.flows.release import release_model
    from hf2triton.spec import load_spec

    spec_path = tiny_spec(
        tmp / f"{name}.yaml",
        model_dir,
        ports,
        name=name,
        task="text-generation",
        embedding=None,
        registry__model_name=name,
        source__model_id=f"fixtures/{name}",
        text_generation={"max_new_tokens": MAX_NEW, "max_rows": max_rows},
        runtime__candidates=runtimes,
        quantization__method=quantization,
        deploy__intra_op_threads=1,
    )
    prompts = tmp / f"{name}-prompts.txt"
    prompts.write_text("\n".join(PROMPTS) + "\n", encoding="utf-8")
    data = yaml.safe_load(spec_path.read_text())
    data["validation"]["sentences"] = str(prompts)
    data["validation"]["smoke_sentences"] = 6
    spec_path.write_text(yaml.safe_dump(data, sort_keys=False))
    spec = load_spec(spec_path)
    import os

    return {
        "spec": spec,
        "ports": ports,
        "summary": release_model(spec),
        "model_dir": model_dir,
        "home": Path(os.environ["HF2TRITON_HOME"]),
        "name": name,
        "grpc": f"127.0.0.1:{ports['grpc_port']}",
        "http": f"127.0.0.1:{ports['http_port']}",
    }


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Both tiny models released to one home; the second release's Triton serves both."""
    import torch

    from hf2triton.targets import triton_local

    tmp = tmp_path_factory.mktemp("text-generation")
    # Tiny models: one thread each. Two threads spinning for each other on a loaded 2-core
    # machine made PyTorch's generate 400x slower here.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        # One home, one Triton and one API beside it: both specs name the same ports.
        ports = {
            "http_port": free_port(),
            "grpc_port": free_port(),
            "metrics_port": free_port(),
            "openai": {"port": free_port()},
        }
        ort = {"name": "onnxruntime", "precision": "fp32"}
        try:
            # The Llama on OpenVINO GenAI, two rows (a third request waits for a free one),
            # long enough a context and no end of text for a stream that outlasts the test;
            # the GPT-2 fp32 on ONNX Runtime alone (the gate's time is CI's).
            llama = _release(
                tmp,
                build_tiny_llama(tmp / "tiny-llama", max_positions=1024, eos_boost=0.0),
                "tiny-llama",
                ports,
                [GENAI],
                "none",
                max_rows=2,
            )
            gpt2 = _release(
                tmp, build_tiny_gpt2(tmp / "tiny-gpt2"), "tiny-gpt2", ports, [ort], "none"
            )
            yield {"llama": llama, "gpt2": gpt2}
        finally:
            triton_local.stop_server()
            torch.set_num_threads(threads)


def _torch(rel, prompts, max_new=MAX_NEW):
    from hf2triton.kinds.text_generation import TorchGenerator
    from hf2triton.spec import kind_for

    cfg = kind_for(rel["spec"]).resolve(str(rel["model_dir"]))
    ref = TorchGenerator(rel["model_dir"], cfg)
    return [ref.continuation(p, max_new) for p in prompts]


def _inputs(prompt: str, stream: bool, **params) -> list:
    arrays = {
        "text_input": np.array([[prompt.encode()]], dtype=np.object_),
        "stream": np.array([[stream]], dtype=bool),
    }
    for name, value in params.items():
        if name == "seed":
            arrays[name] = np.array([[value]], dtype=np.uint64)
        elif isinstance(value, float):
            arrays[name] = np.array([[value]], dtype=np.float32)
        elif isinstance(value, str):
            arrays[name] = np.array([[value.encode()]], dtype=np.object_)
        elif isinstance(value, list):
            arrays[name] = np.array([[v.encode() for v in value]], dtype=np.object_)
        else:
            arrays[name] = np.array([[value]], dtype=np.int32)
    out = []
    for name, arr in arrays.items():
        kind = {"O": "BYTES", "b": "BOOL", "f": "FP32", "i": "INT32", "u": "UINT64"}[arr.dtype.kind]
        x = grpcclient.InferInput(name, list(arr.shape), kind)
        x.set_data_from_numpy(arr)
        out.append(x)
    return out


def _stream(url: str, model: str, prompt: str, stream: bool = True, **params):
    """Every response of one request over a gRPC stream: [(text, ids, final)], or the error."""
    client = grpcclient.InferenceServerClient(url=url)
    got: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    responses = []
    try:
        client.async_stream_infer(
            model, _inputs(prompt, stream, **params), enable_empty_final_response=True
        )
        while True:
            result, error = got.get(timeout=120)
            if error is not None:
                return error
            final = result.get_response().parameters["triton_final_response"].bool_param
            text = result.as_numpy("text_output")
            ids = result.as_numpy("output_ids")
            responses.append(
                (
                    text[0, 0].decode() if text is not None else "",
                    ids[0].tolist() if ids is not None else [],
                    final,
                )
            )
            if final:
                return responses
    finally:
        client.stop_stream()
        client.close()


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_served_greedy_text_is_pytorch_generate_token_for_token(released, which):
    rel = released[which]
    print(which, json.dumps(rel["summary"]["metrics"]))
    want = _torch(rel, PROMPTS)
    assert len({w["text"] for w in want}) > len(PROMPTS) // 2  # text depends on the prompt
    for prompt, ref in zip(PROMPTS, want):
        responses = _stream(rel["grpc"], rel["name"], prompt, stream=False)
        assert isinstance(responses, list), responses
        assert len(responses) == 1 and responses[0][2]
        text, ids, _ = responses[0]
        assert ids == ref["ids"], prompt
        assert text == ref["text"]


def test_a_grpc_stream_delivers_pieces_before_the_last_token(released):
    rel = released["llama"]
    prompt = PROMPTS[0]
    responses = _stream(rel["grpc"], rel["name"], prompt)
    assert isinstance(responses, list), responses
    ref = _torch(rel, [prompt])[0]
    # Several responses, each after one more token: the first arrives with a few of the
    # tokens, long before the last one exists.
    assert len(responses) >= 3
    assert responses[-1][2] and not any(final for *_, final in responses[:-1])
    first_ids = responses[0][1]
    assert 0 < len(first_ids) < len(ref["ids"])
    assert "".join(t for t, _, _ in responses) == ref["text"]
    assert [i for _, ids, _ in responses for i in ids] == ref["ids"]


def test_http_generate_and_generate_stream(released):
    rel = released["gpt2"]
    prompt = PROMPTS[3]
    ref = _torch(rel, [prompt])[0]
    url = f"http://{rel['http']}/v2/models/{rel['name']}"
    body = json.dumps({"text_input": prompt, "temperature": 0.0}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{url}/generate", data=body)) as r:
        answer = json.loads(r.read())
    assert answer["text_output"] == ref["text"] and answer["output_ids"] == ref["ids"]
    body = json.dumps({"text_input": prompt, "stream": True}).encode()
    with urllib.request.urlopen(urllib.request.Request(f"{url}/generate_stream", data=body)) as r:
        events = [
            json.loads(line[5:])
            for line in r.read().decode().splitlines()
            if line.startswith("data:")
        ]
    assert len(events) > 1
    assert "".join(e["text_output"] for e in events) == ref["text"]


def test_32_concurrent_streams_each_get_what_they_get_alone(released):
    rel = released["llama"]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(32)]
    alone = {
        p: "".join(t for t, _, _ in _stream(rel["grpc"], rel["name"], p))
        for p in dict.fromkeys(prompts)
    }
    results: list = [None] * 32

    def worker(i: int) -> None:
        results[i] = _stream(rel["grpc"], rel["name"], prompts[i])

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    failed = [r for r in results if not isinstance(r, list)]
    assert not failed, failed[:1]
    assert ["".join(t for t, _, _ in r) for r in results] == [alone[p] for p in prompts]


@pytest.mark.parametrize("model", ["llama", "gpt2"])
def test_16_streams_on_a_contended_cpu_each_get_what_they_get_alone(released, model):
    """Greedy text does not depend on what else is in the batch, nor on the CPU being shared:
    16 concurrent streams, while another process keeps a core busy the whole time (requests
    join and leave the batch at other steps than on a quiet machine), each get exactly the text
    the same prompt gets alone. Both engines: OpenVINO GenAI's continuous batching (the Llama)
    and the serving core's in-flight batching on ONNX Runtime (the GPT-2), fp32."""
    import subprocess
    import sys

    rel = released[model]
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(16)]
    alone = {
        p: "".join(t for t, _, _ in _stream(rel["grpc"], rel["name"], p))
        for p in dict.fromkeys(prompts)
    }
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        results: list = [None] * 16

        def worker(i: int) -> None:
            results[i] = _stream(rel["grpc"], rel["name"], prompts[i])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
    finally:
        busy.kill()
        busy.wait()
    failed = [r for r in results if not isinstance(r, list)]
    assert not failed, failed[:1]
    got = ["".join(t for t, _, _ in r) for r in results]
    differ = [(p, g, alone[p]) for p, g in zip(prompts, got) if g != alone[p]]
    assert not differ, differ[:2]


def test_chat_messages_are_rendered_with_the_model_template(released):
    from transformers import AutoTokenizer

    rel = released["llama"]
    chat = [{"role": "user", "content": "how do i reset my password"}]
    tok = AutoTokenizer.from_pretrained(rel["model_dir"])
    rendered = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=False)
    url = f"http://{rel['http']}/v2/models/{rel['name']}/generate"
    body = json.dumps({"messages": json.dumps(chat), "max_tokens": 8}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=body)) as r:
        answer = json.loads(r.read())
    import torch

    ids = tok(rendered, add_special_tokens=False, return_tensors="pt")["input_ids"]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(rel["model_dir"]).eval()
    with torch.inference_mode():
        want = model.generate(
            input_ids=ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=8
        )[0, ids.shape[1] :].tolist()
    assert answer["output_ids"] == want


def test_the_llama_is_served_by_openvino_genai(released):
    rel = released["llama"]
    assert rel["summary"]["variant"] == "openvino-ir on openvino-genai fp32"
    served = json.loads(
        next(
            (Path(rel["home"]) / "triton" / "models" / rel["name"]).glob("*/serving.json")
        ).read_text()
    )
    assert served["runtime"]["name"] == "openvino-genai"
    assert served["onnx"] == "openvino_model.xml"
    assert served["runtime"]["precision"] == "fp32"  # pinned, with the KV cache's
    # No runtime tried reads an ONNX graph: none was exported (the IR is converted from the
    # source model), the export folder holds the checked tokenizer alone.
    exports = list((Path(rel["home"]) / "work" / rel["name"] / "export").glob("*/"))
    assert exports and all(not list(d.glob("*.onnx")) for d in exports)
    assert all((d / "tokenizer.json").is_file() for d in exports)


def test_a_client_that_leaves_mid_stream_frees_its_place(released):
    """Two rows: A and C stream long texts; A's client leaves after its first piece; B, sent
    then, gets A's row and finishes while C is still far from its end (had A kept its row, B
    would wait for A's or C's end)."""
    rel = released["llama"]
    long = 900
    c_pieces: list = []
    c_done = threading.Event()

    def stream_c() -> None:
        c_pieces.extend(_stream(rel["grpc"], rel["name"], PROMPTS[1], max_tokens=long))
        c_done.set()

    client = grpcclient.InferenceServerClient(url=rel["grpc"])
    first: queue.Queue = queue.Queue()
    client.start_stream(callback=lambda result, error: first.put((result, error)))
    client.async_stream_infer(rel["name"], _inputs(PROMPTS[0], True, max_tokens=long))
    c = threading.Thread(target=stream_c)
    c.start()
    result, error = first.get(timeout=60)
    assert error is None
    client.stop_stream(cancel_requests=True)  # A's client leaves
    client.close()
    time.sleep(0.2)
    b = _stream(rel["grpc"], rel["name"], PROMPTS[2], stream=False, max_tokens=4)
    assert isinstance(b, list) and len(b[0][1]) == 4
    c_so_far = len(c_pieces) if c_done.is_set() else None
    c.join(timeout=300)
    assert c_so_far is None, "B finished only after C had ended: A's row was not freed"
    assert isinstance(c_pieces, list) and sum(len(ids) for _, ids, _ in c_pieces) == long


@pytest.mark.parametrize(
    "params, message",
    [
        ({"messages": '[{"role": "user", "content": "hi"}]'}, "both text_input and messages"),
        ({"max_tokens": 0}, "max_tokens 0 is outside"),
        ({"temperature": -1.0}, "temperature -1.0 is outside 0..100"),
        ({"top_p": 0.0}, "top_p 0.0 is outside"),
    ],
)
def test_bad_parameters_get_a_clear_error(released, params, message):
    rel = released["gpt2"]
    error = _stream(rel["grpc"], rel["name"], "hello", **params)
    assert not isinstance(error, list) and message in str(error)


def test_a_prompt_over_the_context_length_gets_a_clear_error(released):
    rel = released["gpt2"]
    url = f"http://{rel['http']}/v2/models/{rel['name']}/generate"
    body = json.dumps({"text_input": "the quick brown fox " * 60}).encode()
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(urllib.request.Request(url, data=body))
    text = exc.value.read().decode()
    assert exc.value.code == 400 and "over this model's context length 128" in text
    # ... and the server still answers the next one.
    assert isinstance(_stream(rel["grpc"], rel["name"], "hello"), list)


def test_sampling_with_a_seed_is_repeatable(released):
    rel = released["llama"]
    runs = [
        _stream(
            rel["grpc"], rel["name"], "the bank", stream=False, temperature=1.0, top_p=0.9, seed=7
        )
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    greedy = _stream(rel["grpc"], rel["name"], "the bank", stream=False)
    assert runs[0][0][1] != greedy[0][1]


# -- through the OpenAI-compatible API beside Triton (hf2triton/openai_api) -----------------


def _sdk(rel):
    import openai

    return openai.OpenAI(base_url=rel["summary"]["endpoint"]["openai"], api_key="unused")


@pytest.mark.parametrize("which", ["llama", "gpt2"])
def test_openai_streamed_completion_is_generate_stream_piece_for_piece(released, which):
    """The SDK's streamed completion carries the pieces Triton's gRPC stream carries, in
    order, then the finish reason and the usage."""
    rel = released[which]
    for prompt in PROMPTS[:3]:
        want = _stream(rel["grpc"], rel["name"], prompt, max_tokens=12, temperature=0.0)
        chunks = list(
            _sdk(rel).completions.create(
                model=rel["name"],
                prompt=prompt,
                max_tokens=12,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        pieces = [c.choices[0].text for c in chunks if c.choices and c.choices[0].text]
        assert pieces == [text for text, _, _ in want if text]
        assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] in ("length", "stop")
        usage = chunks[-1].usage
        assert usage.completion_tokens == sum(len(ids) for _, ids, _ in want)
        assert usage.prompt_tokens > 0


def test_openai_chat_completion_streams_what_triton_serves_for_the_chat(released):
    rel = released["llama"]
    chat = [{"role": "user", "content": "how do i reset my password"}]
    url = f"http://{rel['http']}/v2/models/{rel['name']}/generate"
    body = json.dumps({"messages": json.dumps(chat), "max_tokens": 10}).encode()
    with urllib.request.urlopen(urllib.request.Request(url, data=body)) as r:
        want = json.loads(r.read())
    stream = _sdk(rel).chat.completions.create(
        model=rel["name"], messages=chat, max_tokens=10, temperature=0, stream=True
    )
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want["text_output"]
    assert chunks[-1].choices[0].finish_reason == want["finish_reason"]
    whole = _sdk(rel).chat.completions.create(
        model=rel["name"], messages=chat, max_tokens=10, temperature=0
    )
    assert whole.choices[0].message.content == want["text_output"]
    assert whole.usage.completion_tokens == len(want["output_ids"])


def test_langchain_chat_openai_talks_to_the_release(released):
    from langchain_openai import ChatOpenAI

    rel = released["llama"]
    llm = ChatOpenAI(
        model=rel["name"],
        base_url=rel["summary"]["endpoint"]["openai"],
        api_key="unused",
        temperature=0,
        max_tokens=6,
    )
    answer = llm.invoke("hello there")
    want = _sdk(rel).chat.completions.create(
        model=rel["name"],
        messages=[{"role": "user", "content": "hello there"}],
        max_tokens=6,
        temperature=0,
    )
    assert answer.content == want.choices[0].message.content


def _assert_400(rel: dict, body: dict, param: str, says: str) -> None:
    """A chat request with `body` added is a 400 whose error names `param` and says `says`."""
    url = rel["summary"]["endpoint"]["openai"] + "/chat/completions"
    request = {"model": rel["name"], "messages": [{"role": "user", "content": "hi"}], **body}
    req = urllib.request.Request(
        url, data=json.dumps(request).encode(), headers={"Content-Type": "application/json"}
    )
    with pytest.raises(urllib.error.HTTPError) as exc:
        urllib.request.urlopen(req, timeout=60)
    error = json.loads(exc.value.read())["error"]
    assert exc.value.code == 400 and error["param"] == param and says in error["message"], error


@pytest.mark.parametrize(
    "body, param, says",
    [
        ({"temperature": "NaN"}, "temperature", "finite"),
        ({"temperature": -1}, "temperature", "greater than or equal to 0"),
        ({"max_tokens": "many"}, "max_tokens", "integer"),
        ({"n": 2}, "n", "n=1"),
        ({"top_p": 0}, "top_p", "greater than 0"),
        ({"stop": [1]}, "stop", "string"),
        (
            {"messages": [{"role": "user", "content": "the quick brown fox " * 300}]},
            "messages",
            "context length",
        ),
        ({"messages": []}, "messages", "at least 1"),
        (
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "messages",
            "text only",
        ),
    ],
)
def test_bad_chat_requests_get_openai_errors_naming_the_field(released, body, param, says):
    rel = released["gpt2"] if "context length" in says else released["llama"]
    _assert_400(rel, body, param, says)
    # ... and the API keeps serving
    ok = _sdk(rel).chat.completions.create(
        model=rel["name"], max_tokens=2, messages=[{"role": "user", "content": "hi"}]
    )
    assert ok.choices[0].finish_reason in ("length", "stop")


# -- agents: structured output and tools (OpenVINO GenAI constrains; the gate checked it) -----

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "the weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"enum": ["Oslo", "Lima", "Perth"]},
                "unit": {"enum": ["celsius", "fahrenheit"]},
                "days": {"enum": [1, 2, 3]},
            },
            "required": ["city", "unit", "days"],
            "additionalProperties": False,
        },
    },
}
CLOCK = {
    "type": "function",
    "function": {
        "name": "get_time",
        "parameters": {
            "type": "object",
            "properties": {"zone": {"enum": ["UTC", "CET"]}},
            "required": ["zone"],
            "additionalProperties": False,
        },
    },
}


def test_the_gate_checked_constrained_decoding_on_the_shipped_candidate(released):
    report = json.loads(
        max(
            (released["llama"]["home"] / "work" / released["llama"]["name"]).rglob(
                "validation_report.json"
            ),
            key=lambda p: p.stat().st_mtime,
        ).read_text()
    )
    shipped = next(c for c in report["candidates"] if c["name"] == report["chosen"])
    assert shipped["served_checks"]["structured_output"].startswith("4/4 valid")


def test_the_sdks_parse_gets_a_pydantic_object_from_a_random_model(released):
    """client.chat.completions.parse with a pydantic model: the SDK sends a strict json_schema,
    the decoding is constrained to it, and even a random model's answer parses."""

    from pydantic import BaseModel

    class Verdict(BaseModel):
        answer: Literal["yes", "no"]
        score: int
        checked: bool
        tags: list[Literal["a", "b"]]

    rel = released["llama"]
    for prompt in PROMPTS[:3]:
        done = _sdk(rel).chat.completions.parse(
            model=rel["name"],
            messages=[{"role": "user", "content": prompt}],
            response_format=Verdict,
            max_tokens=120,
            temperature=0,
        )
        assert done.choices[0].finish_reason == "stop"
        assert isinstance(done.choices[0].message.parsed, Verdict)


def test_a_streamed_json_object_answer_parses(released):
    rel = released["llama"]
    chunks = list(
        _sdk(rel).chat.completions.create(
            model=rel["name"],
            messages=[{"role": "user", "content": "reply in json"}],
            response_format={
                "type": "json_schema",
                "json_schema": {
                    "name": "flag",
                    "strict": True,
                    "schema": {
                        "type": "object",
                        "properties": {"on": {"type": "boolean"}},
                        "required": ["on"],
                        "additionalProperties": False,
                    },
                },
            },
            max_tokens=40,
            temperature=0,
            stream=True,
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 2  # streamed
    assert isinstance(json.loads(text)["on"], bool)


@pytest.mark.parametrize("stream", [False, True])
def test_tool_choice_required_returns_a_valid_call(released, stream):
    import jsonschema

    rel = released["llama"]
    kwargs = {
        "model": rel["name"],
        "messages": [{"role": "user", "content": "weather in oslo?"}],
        "tools": [WEATHER, CLOCK],
        "tool_choice": "required",
        "max_tokens": 100,
        "temperature": 0,
    }
    if stream:
        chunks = list(_sdk(rel).chat.completions.create(stream=True, **kwargs))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        calls = [tc for d in deltas for tc in (d.tool_calls or [])]
        reason = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        name, arguments, ident = calls[0].function.name, calls[0].function.arguments, calls[0].id
    else:
        done = _sdk(rel).chat.completions.create(**kwargs)
        reason = done.choices[0].finish_reason
        assert done.choices[0].message.tool_calls, done.choices[0]
        call = done.choices[0].message.tool_calls[0]
        name, arguments, ident = call.function.name, call.function.arguments, call.id
    assert reason == "tool_calls" and ident.startswith("call_")
    tool = next(t for t in (WEATHER, CLOCK) if t["function"]["name"] == name)
    jsonschema.validate(json.loads(arguments), tool["function"]["parameters"])


def test_a_named_function_is_the_one_called(released):
    rel = released["llama"]
    done = _sdk(rel).chat.completions.create(
        model=rel["name"],
        messages=[{"role": "user", "content": "what time is it"}],
        tools=[WEATHER, CLOCK],
        tool_choice={"type": "function", "function": {"name": "get_time"}},
        max_tokens=100,
        temperature=0,
    )
    assert done.choices[0].message.tool_calls, done.choices[0]
    call = done.choices[0].message.tool_calls[0]
    assert call.function.name == "get_time"
    assert json.loads(call.function.arguments)["zone"] in ("UTC", "CET")


def test_tool_choice_auto_answers_in_openais_shape(released):
    """A random model may call a tool or not on its own: either way the answer is OpenAI's
    shape, and a call it makes names a tool with JSON arguments."""
    rel = released["llama"]
    done = _sdk(rel).chat.completions.create(
        model=rel["name"],
        messages=[{"role": "user", "content": "weather?"}],
        tools=[WEATHER],
        tool_choice="auto",
        max_tokens=30,
        temperature=0,
    )
    message = done.choices[0].message
    if message.tool_calls:
        assert done.choices[0].finish_reason == "tool_calls"
        assert message.tool_calls[0].function.name == "get_weather"
        json.loads(message.tool_calls[0].function.arguments)
    else:
        assert isinstance(message.content, str)


def test_a_langchain_tool_calling_agent_loop_runs_against_the_release(released):
    """LangChain's tool-calling loop: the model (bound to the tool, required) calls it, the tool
    runs, its answer goes back as a tool message (rendered by the chat template), and the model
    writes its final answer."""
    from langchain_core.messages import HumanMessage, ToolMessage
    from langchain_core.tools import tool
    from langchain_openai import ChatOpenAI

    @tool
    def get_time(zone: Literal["UTC", "CET"]) -> str:
        """The time in a zone (UTC or CET)."""
        return f"12:00 {zone}"

    rel = released["llama"]
    llm = ChatOpenAI(
        model=rel["name"],
        base_url=rel["summary"]["endpoint"]["openai"],
        api_key="unused",
        temperature=0,
        max_tokens=120,
    )
    history: list = [HumanMessage("what time is it in UTC?")]
    first = llm.bind_tools([get_time], tool_choice="required").invoke(history)
    assert first.tool_calls and first.tool_calls[0]["name"] == "get_time"
    history.append(first)
    for call in first.tool_calls:
        history.append(ToolMessage(get_time.invoke(call["args"]), tool_call_id=call["id"]))
    final = llm.bind_tools([get_time], tool_choice="none").invoke(history)
    assert isinstance(final.content, str) and not final.tool_calls


@pytest.mark.parametrize(
    "body, param, says",
    [
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {
                        "name": "x",
                        "schema": {
                            "type": "object",
                            "properties": {"s": {"type": "string", "pattern": "^a"}},
                        },
                    },
                }
            },
            "response_format",
            "$.properties.s.pattern",
        ),
        ({"response_format": {"type": "json_schema"}}, "response_format", "needs json_schema"),
        ({"response_format": {"type": "xml"}}, "response_format", "json_schema"),
        ({"tools": [{"type": "function", "function": {"parameters": {}}}]}, "tools", "name"),
        (
            {
                "tools": [
                    {
                        "type": "function",
                        "function": {"name": "f", "parameters": {"type": "string"}},
                    }
                ]
            },
            "tools",
            "type object",
        ),
        (
            {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
            "tool_choice",
            "which tools does not define",
        ),
        ({"tool_choice": "required"}, "tool_choice", "required needs tools"),
        (
            {"tools": [WEATHER], "response_format": {"type": "json_object"}},
            "response_format",
            "tool_choice none",
        ),
    ],
)
def test_bad_schemas_and_tools_are_400s_naming_the_field(released, body, param, says):
    rel = released["llama"]
    _assert_400(rel, body, param, says)


def test_the_serving_cores_own_engine_refuses_constraints_naming_the_runtime(released):
    """The GPT-2 on ONNX Runtime (the serving core's own engine) cannot constrain decoding: a
    response_format or a forced call is a 400 naming the runtime, never served unconstrained."""
    import openai

    rel = released["gpt2"]
    with pytest.raises(openai.BadRequestError) as exc:
        _sdk(rel).chat.completions.create(
            model=rel["name"],
            messages=[{"role": "user", "content": "hi"}],
            response_format={"type": "json_object"},
            max_tokens=8,
        )
    assert exc.value.body["param"] == "response_format"
    assert "runtime openvino-genai" in exc.value.body["message"]
    with pytest.raises(openai.BadRequestError) as exc:
        _sdk(rel).chat.completions.create(
            model=rel["name"],
            messages=[{"role": "user", "content": "hi"}],
            tools=[WEATHER],
            tool_choice="required",
            max_tokens=8,
        )
    assert exc.value.body["param"] == "tool_choice"


@pytest.fixture(scope="module")
def kjv(released, tmp_path_factory):
    """The embedded language model (trained here from the shipped King James text, a tiny
    shape as tests/training/test_lm.py trains it), released on OpenVINO GenAI beside the others
    on the same Triton."""
    from hf2triton.sources.train import TrainSourceSpec
    from hf2triton.training.lm import train_lm
    from tests.conftest import ROOT

    tmp = tmp_path_factory.mktemp("kjv")
    settings = {
        "text": str(ROOT / "releases" / "data" / "kjv-pentateuch.txt"),
        "vocab_size": 512,
        "layers": 1,
        "hidden": 64,
        "heads": 2,
        "context": 32,
        "max_positions": 256,
        "steps": 40,
        "batch_size": 8,
        "learning_rate": 0.01,
        "seed": 3,
    }
    trained = train_lm(TrainSourceSpec(**settings), tmp / "trained")
    return _release(
        tmp, Path(trained["model_dir"]), "tiny-kjv", released["llama"]["ports"], [GENAI], "none"
    )


def test_the_embedded_model_answers_a_pydantic_schema_and_refuses_tools(kjv):
    """On the KJV model (a plain-text template: the messages' text, one per line): parse with a
    pydantic model gets a valid object; tools are a 400 naming them, since its template cannot
    show them to the model."""
    from typing import Literal as Lit

    import openai
    from pydantic import BaseModel

    class Book(BaseModel):
        book: Lit["Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy"]
        chapter: int
        holy: bool

    done = _sdk(kjv).chat.completions.parse(
        model=kjv["name"],
        messages=[{"role": "user", "content": "In the beginning"}],
        response_format=Book,
        max_tokens=60,
        temperature=0,
    )
    assert done.choices[0].finish_reason == "stop"
    assert isinstance(done.choices[0].message.parsed, Book)
    with pytest.raises(openai.BadRequestError) as exc:
        _sdk(kjv).chat.completions.create(
            model=kjv["name"],
            messages=[{"role": "user", "content": "hi"}],
            tools=[WEATHER],
            max_tokens=8,
        )
    assert exc.value.body["param"] == "tools"
    assert "does not render tools" in exc.value.body["message"]


def test_a_candidate_far_off_pytorch_misses_on_perplexity_rather_than_raising():
    """A candidate whose log-likelihood is thousands of nats below PyTorch's (a broken graph)
    is scored inf and misses the perplexity limit, named, instead of failing with OverflowError."""
    from hf2triton.kinds.base import Data
    from hf2triton.kinds.limits import misses
    from hf2triton.kinds.lm_reference import perplexity_increase
    from hf2triton.kinds.text_generation import TextGenerationKind

    assert perplexity_increase(np.array([-10.0, -10.0, 10.0])) == 0.0
    kind = TextGenerationKind.__new__(TextGenerationKind)
    pytorch = [{"ids": [1, 2], "text": "ab", "logprob": -10.0, "tokens": 11}]
    far = [{**pytorch[0], "logprob": -9000.0}]
    metrics, _ = kind.score(pytorch, far, Data(["p"]), None)
    assert metrics["perplexity"] == metrics["perplexity_increase"] == float("inf")
    assert misses(metrics, {"perplexity_increase": ("<=", 0.2)})


def test_smoke_limits_stay_meaningful_where_greedy_text_moved_with_the_batch():
    """The gate saw a candidate's greedy continuations part, late, between batched and alone
    on every prompt: exact_match loosens to nothing, but each prompt's share of tokens up to
    where two runs part is held to the gate's worst one, so an endpoint that answers
    something else misses, and one that parts as late as the gate saw does not."""
    from hf2triton.kinds.base import Data
    from hf2triton.kinds.limits import misses
    from hf2triton.kinds.margin import NARROW_TOLERANCE, loosened
    from hf2triton.kinds.text_generation import TextGenerationKind

    def answer(ids):
        return {"ids": ids, "text": str(ids), "logprob": -1.0, "tokens": 2}

    kind, data = TextGenerationKind.__new__(TextGenerationKind), Data(["p1", "p2", "p3"])
    alone = [answer([1, 2, 3, 4, 5]), answer([6, 7, 8, 9]), answer([3, 3, 3, 3])]
    batched = [answer([1, 2, 3, 4, 6]), answer([6, 7, 8, 1]), answer([3, 3, 3, 4])]
    itself, _ = kind.score(alone, batched, data, None)
    assert itself["exact_match"] == 0.0 and itself["min_token_match"] == 0.75
    limits = loosened(kind.agreement_limits(NARROW_TOLERANCE), itself, NARROW_TOLERANCE)
    assert limits["exact_match"][1] < 0 and limits["min_token_match"] == (">=", 0.74)
    garbage = [answer([]), answer([99]), answer([42, 42])]
    assert "min_token_match" in misses(kind.score(alone, garbage, data, None)[0], limits)
    one_prompt = Data(["p1"])  # the smoke test's fewer items, parting as late as the gate saw
    assert misses(kind.score(alone[:1], batched[:1], one_prompt, None)[0], limits) == {}
