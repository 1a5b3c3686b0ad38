"""hf2triton/serving/causal.py: the chat tokenizer and the in-flight batching engine. A decoder
written in numpy stands in for the exported one (the same inputs and outputs: ids, attention
mask, positions and a KV cache in; logits and the cache out): its next token is a sum over the
ids it attends to and its position, so a row that joins a running batch gets a different
token the moment its mask, cache or padding is wrong. Each prompt must get the tokens a plain
loop over the same rule gives it alone."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from hf2triton.serving import causal
from hf2triton.serving.decoding import DecodeSettings
from hf2triton.serving.runtimes import Port

WORDS = ["<eos>", *(f"w{i}" for i in range(1, 23))]
V = len(WORDS)
EOS = 0
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)
TOOL_TEMPLATE = "{% if tools %}{{ tools | tojson }}{% endif %}" + TEMPLATE


class SumDecoder:
    """A Session: the next token after each position is the sum of (id + 1) over the tokens
    attended so far, plus the position, modulo V."""

    inputs = {
        "input_ids": Port("input_ids", ("batch", "seq")),
        "attention_mask": Port("attention_mask", ("batch", "total")),
        "position_ids": Port("position_ids", ("batch", "seq")),
        "past_key_values.0.key": Port("past_key_values.0.key", ("batch", 1, "past", 1)),
    }
    outputs = {"logits": Port("logits", ()), "present.0.key": Port("present.0.key", ())}
    in_use = "numpy"

    def __init__(self, fail_on: int | None = None):
        self.fail_on = fail_on  # a prompt token that makes its prefill raise

    def run(self, names, feeds):
        ids, mask = feeds["input_ids"], feeds["attention_mask"]
        prefill = feeds["past_key_values.0.key"].shape[2] == 0
        if prefill and self.fail_on is not None and (ids == self.fail_on).any():
            raise RuntimeError("the device fell over")
        past = feeds["past_key_values.0.key"]
        present = np.concatenate([past, ids[:, None, :, None].astype(np.float32)], axis=2)
        weights = (present[:, 0, :, 0] + 1) * mask  # padding and left-out rows count nothing
        sums = np.cumsum(weights, axis=1)[:, -ids.shape[1] :].astype(np.int64)
        nxt = (sums + feeds["position_ids"]) % V
        logits = np.full((*ids.shape, V), -5.0, np.float32)
        np.put_along_axis(logits, nxt[..., None], 5.0, axis=-1)
        return [logits, present]


def alone(prompt: list[int], max_new: int) -> list[int]:
    seq: list[int] = list(prompt)
    while len(seq) - len(prompt) < max_new:
        seq.append((sum(t + 1 for t in seq) + len(seq) - 1) % V)
        if seq[-1] == EOS:
            break
    return seq[len(prompt) :]


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory) -> causal.ChatTokenizer:
    from tokenizers import Tokenizer, models, pre_tokenizers

    fast = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<eos>"))
    fast.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast.add_special_tokens(["<eos>"])  # skipped when decoding
    path = tmp_path_factory.mktemp("tok") / "tokenizer.json"
    fast.save(str(path))
    plan = {"chat_template": TOOL_TEMPLATE, "special_tokens": {"eos_token": "<eos>"}}
    return causal.ChatTokenizer(str(path), plan)


def engine(tokenizer, session=None, **kwargs) -> causal.Engine:
    model = causal.CausalLM("unused.onnx", session=session or SumDecoder())
    processors = DecodeSettings(0, [EOS], 0, 99)
    return model.engine(tokenizer, [EOS], processors, causal.Batching(**kwargs))


class Collect:
    """What a sequence's emit sends, and a wait for its end."""

    def __init__(self) -> None:
        self.text, self.ids, self.ended = "", [], threading.Event()

    def __call__(self, text, ids, last, seq):
        self.text += text
        self.ids += ids
        if last:
            self.ended.set()


def generate(eng, prompts, max_new=12, stream=True, **sampling):
    seqs, sinks = [], []
    for p in prompts:
        sink = Collect()
        seq = causal.Sequence(
            p, causal.Sampling(max_new_tokens=max_new, **sampling), sink, stream=stream
        )
        seqs.append(seq)
        sinks.append(sink)
        eng.submit([seq])  # one at a time: each joins whatever runs
    for sink in sinks:
        assert sink.ended.wait(20)
    return seqs, sinks


PROMPTS = [[3], [5, 7, 1], [2, 2, 2, 2, 2, 9], [11, 4], [1] * 9, [19, 1, 1], [6]]


@pytest.mark.parametrize(
    "kwargs", [{}, {"max_rows": 2}, {"step_tokens": 4}, {"request_level": True}]
)
def test_every_prompt_gets_what_it_gets_alone_however_it_joins_the_batch(tokenizer, kwargs):
    eng = engine(tokenizer, **kwargs)
    try:
        seqs, sinks = generate(eng, PROMPTS)
    finally:
        eng.close()
    for prompt, seq, sink in zip(PROMPTS, seqs, sinks):
        want = alone(prompt, 12)
        assert seq.generated == want and sink.ids == want, prompt
        assert seq.finish == ("stop" if want[-1] == EOS else "length")
        assert sink.text == tokenizer.decode(want)  # the streamed pieces join to the text
    assert not eng.running


def test_stop_strings_end_the_text_before_them(tokenizer):
    prompt = [5, 7, 1]
    whole = tokenizer.decode(alone(prompt, 12))
    stop = whole.split()[3]
    eng = engine(tokenizer)
    try:
        (seq,), (sink,) = generate(eng, [prompt], stop=(stop,))
    finally:
        eng.close()
    assert seq.finish == "stop" and sink.text == whole[: whole.find(stop)]


def test_a_failed_step_fails_its_sequences_and_the_engine_serves_on(tokenizer):
    eng = engine(tokenizer, session=SumDecoder(fail_on=22))
    try:
        (bad,), (sink,) = generate(eng, [[22, 1]])
        assert bad.finish == "error"
        assert sink.text == "generation failed: RuntimeError: the device fell over"
        (good,), _ = generate(eng, [[3]])
        assert good.generated == alone([3], 12)
    finally:
        eng.close()


def test_a_client_that_left_is_cancelled(tokenizer):
    eng = engine(tokenizer)
    try:
        sink = Collect()
        seq = causal.Sequence([3], causal.Sampling(max_new_tokens=50), sink, gone=lambda: True)
        eng.submit([seq])
        assert sink.ended.wait(20)
    finally:
        eng.close()
    assert seq.finish == "cancelled" and len(seq.generated) < 50


def test_seeded_sampling_repeats(tokenizer):
    eng = engine(tokenizer)
    try:
        runs = [
            generate(eng, [[3]], max_new=8, temperature=5.0, seed=s)[0][0].generated
            for s in (1, 1, 2)
        ]
    finally:
        eng.close()
    assert runs[0] == runs[1] != runs[2]


def test_the_chat_template_renders_messages_and_tools(tokenizer):
    messages = [{"role": "user", "content": "w1 w2"}]
    assert tokenizer.render(messages) == "<user>w1 w2\n<assistant>"
    tools = [{"type": "function", "function": {"name": "f<1>"}}]
    # transformers' tojson: not HTML-escaped
    assert tokenizer.render(messages, tools).startswith(
        '[{"type": "function", "function": {"name": "f<1>"}}]'
    )
    assert tokenizer.tool_style == "json"
    assert tokenizer.encode("w1 w2") == [1, 2] and tokenizer.decode([1, 0, 2]) == "w1 w2"


@pytest.mark.parametrize(
    "messages, says",
    [
        ([], "messages must be a JSON list"),
        ([{"role": "user"}], "messages must be a JSON list"),
        ("hello", "messages must be a JSON list"),
        ([{"role": "user", "content": 3}], "messages must be a JSON list"),
    ],
)
def test_bad_messages_are_refused_naming_them(tokenizer, messages, says):
    with pytest.raises(ValueError, match=says):
        tokenizer.render(messages)


def test_a_model_without_a_template_or_tools_says_what_to_send(tmp_path, tokenizer):
    path = tmp_path / "tokenizer.json"
    tokenizer.fast.save(str(path))
    plain = causal.ChatTokenizer(str(path), {})
    with pytest.raises(ValueError, match="no chat template: send text_input"):
        plain.render([{"role": "user", "content": "hi"}])
    no_tools = causal.ChatTokenizer(str(path), {"chat_template": TEMPLATE})
    with pytest.raises(ValueError, match="does not render tools: send no tools"):
        no_tools.render([{"role": "user", "content": "hi"}], [{"type": "function"}])
    refusing = causal.ChatTokenizer(
        str(path), {"chat_template": "{{ raise_exception('no system role') }}"}
    )
    with pytest.raises(ValueError, match="refused these messages: no system role"):
        refusing.render([{"role": "system", "content": "x"}])
    assert causal.tool_style("{% for t in tools %}<tool_call>{% endfor %}") == "hermes"
    assert causal.tool_style(None) == ""


def test_teacher_forced_scores_and_prompt_logprob():
    logits = np.log(np.array([[0.4, 0.6], [0.9, 0.1], [0.2, 0.8]], np.float32))
    logprob, matches = causal.score_continuation(logits, [1, 0, 0], start=1)
    assert np.isclose(logprob, np.log(0.4) + np.log(0.9)) and matches == 1  # 0 is not 1's best
    assert causal.score_continuation(logits, [1], start=1) == (0.0, 0)
    mask = np.array([0, 1, 1])  # a left-padded prompt of two tokens
    assert np.isclose(causal.prompt_logprob(logits, np.array([9, 1, 1]), mask), np.log(0.1))
