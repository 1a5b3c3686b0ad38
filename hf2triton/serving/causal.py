"""Decoder-only language models (GPT-2, Llama, Qwen2, ...) served with a KV cache and in-flight
batching: the tokenizer (and chat template), the exported decoder on a runtime (runtimes/),
and the engine whose background loop runs one decode step at a time for every running sequence,
letting new requests join between steps and finished ones leave. Logits processing, sampling
and stop strings are decoding.py's, shared with translation.

Part of the serving core: numpy, a runtime's library, tokenizers and jinja2 (chat templates).
"""

from __future__ import annotations

import collections
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Final

import numpy as np

from . import runtimes
from .decoding import DecodeSettings, log_softmax, pick, process_scores, stop_at, unsure_tail, warp
from .seq2seq import clean_up_tail, clean_up_tokenization
from .text import plan_sub_batches

# Padded prompt tokens one prefill run may hold (measured on a 14M-parameter Llama, 1 CPU
# thread: joining prompts padded to the longest tripled the prefill time at 32 streams).
PREFILL_GROUP_TOKENS = 64

# The defaults of `text_generation`'s batching settings, written once: the spec's
# (hf2triton.kinds.text_generation), and what a serving.json without them serves.
MAX_ROWS = 32  # sequences decoded together at most
STEP_TOKENS = 512  # prompt tokens that may join in one step
BATCHING: Final = "in-flight"  # or "request": new sequences join only an empty batch
STREAM_INTERVAL_MS = 50  # the least time between a busy stream's pieces (see BUSY_STREAMS)


@dataclass(frozen=True)
class Batching:
    """How an engine batches: at most `max_rows` sequences at once and `step_tokens` prompt
    tokens joining in one step; `request_level`: new sequences join only an empty batch; the
    model's context length (what one step must hold, unsplit)."""

    max_rows: int = MAX_ROWS
    step_tokens: int = STEP_TOKENS
    request_level: bool = False
    max_context: int = 2048


# --- tokenizer and chat template ----------------------------------------------------------------


def tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    """The `tojson` filter chat templates are written for (transformers'), not jinja's own
    (which escapes <, > and & for HTML)."""
    import json

    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def tool_style(template: str | None) -> str:
    """How a chat template renders tools and the model calls them: "hermes" (Qwen2, Hermes: the
    tools listed in the system turn, each call a JSON object in <tool_call> tags), "json"
    (another template that renders `tools`: a call is a JSON object with its name and
    arguments), or "" (the template takes no tools)."""
    source = template or ""
    if "tools" not in source:
        return ""
    return "hermes" if "<tool_call>" in source else "json"


class ChatTokenizer:
    """Prompts to ids and generated ids to text, as transformers' fast tokenizer does (special
    tokens added to a plain prompt, none to a rendered chat, skipped when decoding), and
    messages rendered with the model's own chat template (as `apply_chat_template` renders it).

    `plan` (serving.json's `tokenizer`): `clean_up_tokenization_spaces`, `chat_template` (None:
    the model has none) and `special_tokens` (bos_token, eos_token, ... the template may use)."""

    def __init__(self, path: str, plan: dict[str, Any]):
        from tokenizers import Tokenizer

        self.fast = Tokenizer.from_file(path)
        self.fast.no_padding()
        self.fast.no_truncation()
        self.clean_up = bool(plan.get("clean_up_tokenization_spaces", False))
        self.special = dict(plan.get("special_tokens") or {})
        self.template = None
        self.source: str | None = plan.get("chat_template")
        if plan.get("chat_template"):
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = raise_exception
            env.filters["tojson"] = tojson  # transformers' own, not jinja's HTML-safe one
            self.template = env.from_string(plan["chat_template"])

    def encode(self, text: str, special: bool = True) -> list[int]:
        return self.fast.encode(text, add_special_tokens=special).ids

    def decode(self, ids: list[int]) -> str:
        text = self.fast.decode(ids, skip_special_tokens=True)
        return clean_up_tokenization(text) if self.clean_up else text

    @property
    def tool_style(self) -> str:
        return tool_style(self.source)

    def render(self, messages: Any, tools: list[Any] | None = None) -> str:
        """The prompt of a chat: `messages` a list of {"role", "content"} objects (an assistant
        turn may carry `tool_calls` instead of content, a `tool` turn answers one), `tools` the
        functions the model may call, rendered by the template."""
        if self.template is None:
            raise ValueError("this model has no chat template: send text_input, not messages")
        if not (
            isinstance(messages, list)
            and messages
            and all(
                isinstance(m, dict)
                and isinstance(m.get("role"), str)
                and (isinstance(m.get("content"), str) or m.get("tool_calls"))
                for m in messages
            )
        ):
            raise ValueError(
                'messages must be a JSON list of {"role": ..., "content": ...} '
                "objects with string values (or an assistant's tool_calls)"
            )
        if tools and not self.tool_style:
            raise ValueError("this model's chat template does not render tools: send no tools")
        from jinja2.exceptions import TemplateError

        extra = {"tools": tools} if tools else {}
        try:
            return self.template.render(
                messages=messages, add_generation_prompt=True, **self.special, **extra
            )
        except TemplateError as exc:
            raise ValueError(f"the model's chat template refused these messages: {exc}") from None


# --- the model ----------------------------------------------------------------------------------


class CausalLM:
    """The exported decoder (optimum's text-generation-with-past model.onnx: input_ids,
    attention_mask, position_ids where the model takes them, and past_key_values.* in; logits
    and present.* out) opened by a runtime."""

    def __init__(
        self,
        path: str,
        runtime: runtimes.RuntimeSettings | None = None,
        session: runtimes.Session | None = None,
    ):
        self.session = session or runtimes.open_model(path, runtime or runtimes.RuntimeSettings())
        inputs = self.session.inputs
        self.past_names = [n for n in inputs if n.startswith("past_key_values.")]
        self.positions = "position_ids" in inputs
        # [batch, heads, past, head_dim]: heads and head_dim are fixed by the export
        self.kv_shape = {
            n: tuple(int(d) for d in (inputs[n].shape[1], inputs[n].shape[3]))
            for n in self.past_names
        }
        self.outputs = list(self.session.outputs)

    def empty_past(self, rows: int) -> dict[str, np.ndarray]:
        return {n: np.zeros((rows, h, 0, d), np.float32) for n, (h, d) in self.kv_shape.items()}

    def engine(
        self,
        tokenizer: ChatTokenizer,
        eos: list[int],
        processors: DecodeSettings,
        batching: Batching = Batching(),
    ) -> Engine:
        """The decode loop that serves this model: in-flight batching over its runtime."""
        return Engine(self, tokenizer, eos, processors, batching)

    def forward(
        self, ids: np.ndarray, mask: np.ndarray, positions: np.ndarray, past: dict[str, np.ndarray]
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Logits [N, T, V] of `ids` [N, T] after `past`, and the cache with them appended."""
        feeds = {"input_ids": ids, "attention_mask": mask, **past}
        if self.positions:
            feeds["position_ids"] = positions
        out = dict(zip(self.outputs, self.session.run(None, feeds)))
        present = {n: out[n.replace("past_key_values.", "present.")] for n in self.past_names}
        return out["logits"], present


# --- one sequence ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sampling:
    """One request's generation settings (the release's defaults, overridden per request)."""

    max_new_tokens: int
    temperature: float = 0.0  # 0: greedy
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0
    stop: tuple[str, ...] = ()
    seed: int | None = None

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "stop": list(self.stop)}


@dataclass(eq=False)
class Sequence:
    """One prompt being generated, and where its text goes (`emit(text, ids, final)`); `gone()`
    says whether its client left (then it leaves the batch)."""

    prompt: list[int]
    sampling: Sampling
    emit: Callable[[str, list[int], bool, Sequence], None]
    stream: bool = False
    gone: Callable[[], bool] = lambda: False
    want_logprob: bool = False
    grammar: str = ""  # what the text must follow (structured.py's EBNF); "" none
    # Ids to score teacher-forced after the prompt (the gate sends PyTorch's continuation):
    # their log-probability and how many are the model's own next token at their place.
    score: list[int] = field(default_factory=list)
    score_logprob: float = 0.0
    score_matches: int = 0
    generated: list[int] = field(default_factory=list)
    text: str = ""  # what was sent so far (or, for a failed sequence, why)
    sent_chars: int = 0
    sent_ids: int = 0
    sent_at: float = 0.0  # when its last piece went out (time.monotonic)
    prompt_logprob: float = 0.0
    finish: str | None = None  # "stop", "length", "cancelled"
    rng: Any = None


# With BUSY_STREAMS or more running, a stream sends its new text at most every
# `text_generation.stream_interval_ms` (its first piece at once, its last at the end): each
# response is a round trip through Triton's Python backend made while no decode step runs, and
# at 32 streams sending every token's piece took a sixth of the loop's time (py-spy). Fewer
# running: every token's piece.
BUSY_STREAMS = 8


class Streaming:
    """What every decode loop shares: a new token taken by its sequence (finished at the end of
    text, at max_tokens, at a stop string, or when its client left) and the text that goes out
    (pieces held back while they may still become a stop string or be rewritten, and while the
    loop is busy, gathered into fewer responses)."""

    tokenizer: ChatTokenizer
    eos: set[int]
    running: Any  # what the loop runs now (a list of sequences, or of the engine's handles)
    # Why this engine cannot constrain generation to a grammar ("": it can).
    unconstrained: str = (
        "the serving core's own engine (runtimes onnxruntime, openvino, onnxruntime-cuda) does "
        "not constrain generation: serve the model on runtime openvino-genai for response_format "
        "and tool_choice required"
    )
    stream_every: float = 0.0  # the least time between a stream's pieces now
    stream_interval: float = STREAM_INTERVAL_MS / 1000  # ... when the loop is busy (seconds)
    loop_name: str = "decode-loop"  # the thread that owns the engine, started by submit()

    def _init_loop(self) -> None:
        self.waiting: collections.deque[Sequence] = collections.deque()
        self.wake = threading.Condition()
        self.stopped = False
        self.thread: threading.Thread | None = None

    def _loop(self) -> None:
        raise NotImplementedError

    def _wait_for_work(self) -> bool:
        """Under `wake`: block while nothing waits or runs; False once closed."""
        while not self.stopped and not self.waiting and not self.running:
            self.wake.wait()
        return not self.stopped

    def submit(self, seqs: list[Sequence]) -> None:
        """Queue `seqs` for the loop (started with the first)."""
        with self.wake:
            if self.thread is None:
                self.thread = threading.Thread(target=self._loop, name=self.loop_name, daemon=True)
                self.thread.start()
            self.waiting.extend(seqs)
            self.wake.notify()

    def close(self) -> None:
        with self.wake:
            self.stopped = True
            self.wake.notify()
        if self.thread is not None:
            self.thread.join(timeout=10)

    def pace(self, running: int) -> None:
        """Set how often streams send, for `running` sequences."""
        self.stream_every = self.stream_interval if running >= BUSY_STREAMS else 0.0

    def _take(self, s: Sequence, token: int) -> bool:
        """`token` appended to `s`; whether `s` finished with it."""
        s.generated.append(int(token))
        if s.gone():
            self._finish(s, "cancelled")
        elif token in self.eos:
            self._finish(s, "stop")
        elif len(s.generated) >= s.sampling.max_new_tokens:
            self._finish(s, "length")
        else:
            self._stream(s)
        return s.finish is not None

    def _stream(self, s: Sequence) -> None:
        text = self.tokenizer.decode(s.generated)
        cut = stop_at(text, list(s.sampling.stop))
        if cut >= 0:
            self._finish(s, "stop", text[:cut])
            return
        if s.stream:
            held = unsure_tail(text, list(s.sampling.stop))
            if self.tokenizer.clean_up:
                held = max(held, clean_up_tail(text))
            ready = len(text) - held
            now = time.monotonic()
            if ready > s.sent_chars and (not s.sent_ids or now - s.sent_at >= self.stream_every):
                piece, s.sent_chars, s.sent_at = text[s.sent_chars : ready], ready, now
                ids, s.sent_ids = s.generated[s.sent_ids :], len(s.generated)
                s.emit(piece, ids, False, s)

    def _finish(self, s: Sequence, why: str, text: str | None = None) -> None:
        s.finish = why
        if text is None:
            text = self.tokenizer.decode(s.generated)
            cut = stop_at(text, list(s.sampling.stop))
            text = text if cut < 0 else text[:cut]
        s.emit(text[s.sent_chars :], s.generated[s.sent_ids :], True, s)

    def _fail(self, s: Sequence, message: str) -> None:
        s.finish = "error"
        s.emit(message, [], True, s)


class Engine(Streaming):
    """In-flight batching: a background loop runs one step at a time for the running batch (a
    decode step for every running sequence, or the prompts of sequences that join); a new
    sequence joins between steps while there are free rows and the step's token budget allows,
    a finished one leaves at once. `request_level`: new sequences join only an empty batch
    (request-level batching, kept to measure against).

    The running batch's cache is one array per layer, [rows, heads, length, head_dim], left
    padded (attention mask 0) where a row's sequence is shorter than the longest."""

    def __init__(
        self,
        model: CausalLM,
        tokenizer: ChatTokenizer,
        eos: list[int],
        processors: DecodeSettings,
        batching: Batching = Batching(),
    ):
        self.model, self.tokenizer, self.eos = model, tokenizer, set(eos)
        self.processors = processors
        self.max_rows = max(1, batching.max_rows)
        self.step_tokens = max(1, batching.step_tokens)
        self.request_level = batching.request_level
        self._init_loop()
        self.running: list[Sequence] = []
        self.past: dict[str, np.ndarray] = {}
        self.mask = np.zeros((0, 0), np.int64)

    # the loop ---------------------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            with self.wake:
                if not self._wait_for_work():
                    return
            joining: list[Sequence] = []
            try:  # nothing a step raises ends the loop: every later request would hang
                with self.wake:
                    joining = self._admit()
                self.pace(len(self.running) + len(joining))
                if joining:
                    self._prefill(joining)
                elif self.running:
                    self._decode()
            except Exception as exc:  # a failed step fails its sequences, not the server
                for seq in dict.fromkeys([*joining, *self.running]):
                    if seq.finish is None:
                        self._fail(seq, f"generation failed: {type(exc).__name__}: {exc}")
                self.running, self.past, self.mask = [], {}, np.zeros((0, 0), np.int64)

    def _admit(self) -> list[Sequence]:
        """The waiting sequences that join now (their prompts fit this step's token budget)."""
        if self.request_level and self.running:
            return []
        joining: list[Sequence] = []
        budget = self.step_tokens
        while self.waiting and len(self.running) + len(joining) < self.max_rows:
            seq = self.waiting[0]
            if joining and len(seq.prompt) > budget:
                break
            self.waiting.popleft()  # out of the queue first: whatever gone() does, it moves on
            if seq.gone():
                self._finish(seq, "cancelled")
                continue
            budget -= len(seq.prompt)
            joining.append(seq)
        return joining

    # steps --------------------------------------------------------------------------------------
    def _prefill(self, joining: list[Sequence]) -> None:
        # Prompts of like length together (padding is compute on a CPU): a long prompt alone.
        for group in plan_sub_batches([len(s.prompt) for s in joining], PREFILL_GROUP_TOKENS):
            self._prefill_group([joining[i] for i in group])

    def _prefill_group(self, joining: list[Sequence]) -> None:
        width = max(len(s.prompt) for s in joining)
        ids = np.zeros((len(joining), width), np.int64)
        mask = np.zeros((len(joining), width), np.int64)
        for r, s in enumerate(joining):  # left padding: every row's last token is the last
            ids[r, width - len(s.prompt) :] = s.prompt
            mask[r, width - len(s.prompt) :] = 1
        positions = np.maximum(np.cumsum(mask, axis=1) - 1, 0)
        logits, present = self.model.forward(
            ids, mask, positions, self.model.empty_past(len(joining))
        )
        for r, s in enumerate(joining):
            if s.want_logprob:
                s.prompt_logprob = prompt_logprob(logits[r], ids[r], mask[r])
            if s.score:  # a forward pass of its own over the prompt and the scored ids
                whole = s.prompt + s.score
                scored, _ = self.model.forward(
                    np.array([whole], np.int64),
                    np.ones((1, len(whole)), np.int64),
                    np.arange(len(whole), dtype=np.int64)[None],
                    self.model.empty_past(1),
                )
                s.score_logprob, s.score_matches = score_continuation(
                    scored[0], whole, len(s.prompt), processors_for(self.processors, s)
                )
        self._join(joining, present, mask)
        self._advance(joining, logits[:, -1, :])

    def _decode(self) -> None:
        rows = self.running
        last = np.array([[s.generated[-1]] for s in rows], np.int64)
        mask = np.concatenate([self.mask, np.ones((len(rows), 1), np.int64)], axis=1)
        positions = np.array([[len(s.prompt) + len(s.generated) - 1] for s in rows], np.int64)
        logits, self.past = self.model.forward(last, mask, positions, self.past)
        self.mask = mask
        self._advance(rows, logits[:, -1, :])

    def _join(
        self, joining: list[Sequence], present: dict[str, np.ndarray], mask: np.ndarray
    ) -> None:
        if not self.running:
            self.running, self.past, self.mask = list(joining), present, mask
            return
        width = max(self.mask.shape[1], mask.shape[1])
        rows = len(self.running)

        def placed(old: np.ndarray, new: np.ndarray, axis: int) -> np.ndarray:
            shape = list(old.shape)
            shape[0], shape[axis] = rows + len(new), width
            out = np.zeros(shape, old.dtype)
            index_old = [slice(0, rows)] + [slice(None)] * (old.ndim - 1)
            index_old[axis] = slice(width - old.shape[axis], width)
            out[tuple(index_old)] = old
            index_new = [slice(rows, None)] + [slice(None)] * (old.ndim - 1)
            index_new[axis] = slice(width - new.shape[axis], width)
            out[tuple(index_new)] = new
            return out

        self.past = {n: placed(self.past[n], present[n], 2) for n in self.past}
        self.mask = placed(self.mask, mask, 1)
        self.running = self.running + list(joining)

    def _advance(self, rows: list[Sequence], logits: np.ndarray) -> None:
        """Each row's next token from its logits; finished rows leave the batch."""
        nxt = next_tokens(logits, rows, self.processors)
        for s, token in zip(rows, nxt.tolist()):
            self._take(s, token)
        if any(s.finish for s in rows):
            self._leave([i for i, s in enumerate(self.running) if s.finish is None])

    def _leave(self, keep: list[int]) -> None:
        self.running = [self.running[i] for i in keep]
        if not keep:
            self.past, self.mask = {}, np.zeros((0, 0), np.int64)
            return
        mask = self.mask[keep]
        start = int(np.argmax(mask.any(axis=0)))  # columns no remaining row attends to go
        self.mask = mask[:, start:]
        self.past = {n: v[keep, :, start:] for n, v in self.past.items()}


def score_continuation(
    logits: np.ndarray, ids: list[int], start: int, processors: DecodeSettings | None = None
) -> tuple[float, int]:
    """Of the tokens `ids[start:]`, teacher-forced: the sum of their log-probabilities (of the
    raw logits), and how many are the token greedy decoding picks there: the argmax of the
    logits before them once `processors` (the model's repetition penalty, n-gram and bad-word
    bans, min length: what PyTorch's `generate` applied) ran over the ids before
    (`logits` [len(ids), vocab] of `ids`)."""
    if start >= len(ids) or start < 1:
        return 0.0, 0
    rows = logits[start - 1 : len(ids) - 1].astype(np.float64)
    want = np.asarray(ids[start:])
    logp = log_softmax(rows)
    picked = rows.argmax(axis=-1)
    if processors is not None and processors.changes_scores():
        context = np.asarray(ids, np.int64)
        for j in range(len(want)):
            row = rows[j : j + 1].copy()
            picked[j] = pick(process_scores(row, context[None, : start + j], processors))[0]
    return float(logp[np.arange(len(want)), want].sum()), int((picked == want).sum())


def processors_for(processors: DecodeSettings, seq: Sequence) -> DecodeSettings:
    """The logits processors decoding runs for `seq`: the release's, with the request's
    repetition penalty (its teacher-forced scores pick with the same)."""
    return replace(processors, repetition_penalty=seq.sampling.repetition_penalty)


def prompt_logprob(logits: np.ndarray, ids: np.ndarray, mask: np.ndarray) -> float:
    """Sum of log p(token | tokens before) over a prompt's real tokens after its first."""
    real = np.flatnonzero(mask)
    if len(real) < 2:
        return 0.0
    logp = log_softmax(logits[real[:-1]].astype(np.float64))
    return float(logp[np.arange(len(real) - 1), ids[real[1:]]].sum())


def next_tokens(logits: np.ndarray, rows: list[Sequence], processors: DecodeSettings) -> np.ndarray:
    """Each row's next token: transformers' logits processors (decoding.process_scores) over
    its prompt and what it generated, then greedy or sampling with its own settings."""
    scores = logits.astype(np.float32, copy=True)
    out = pick(scores)  # greedy rows without processors: one argmax for all
    for r, s in enumerate(rows):
        p = s.sampling
        mine = processors_for(processors, s)
        if not mine.changes_scores() and p.temperature <= 0:
            continue
        row = process_scores(scores[r : r + 1], np.array([s.prompt + s.generated], np.int64), mine)
        if p.temperature > 0:
            if s.rng is None:
                s.rng = np.random.default_rng(p.seed)
            out[r] = pick(warp(row, p.temperature, p.top_k, p.top_p), s.rng)[0]
        else:
            out[r] = pick(row)[0]
    return out


def load_serving(directory: str, cfg: dict[str, Any]) -> tuple[ChatTokenizer, Any]:
    """The tokenizer and what the runtime serving.json names opened for the model (paths
    relative to `directory`): a Session that runs feeds, or a model a runtime serves whole
    (OpenVINO GenAI's). text_generation.py makes the model that gives the engine of it."""
    tokenizer = ChatTokenizer(os.path.join(directory, cfg["tokenizer_file"]), cfg["tokenizer"])
    runtime = runtimes.settings_of(cfg)
    path = os.path.join(directory, cfg["onnx"])
    return tokenizer, runtimes.open_model(path, runtime)
