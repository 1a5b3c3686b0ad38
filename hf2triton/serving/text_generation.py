"""Served text generation, named as Triton's OpenAI-compatible frontend names a non-vLLM model's
tensors: `text_input` (or `messages`, a JSON chat rendered with the model's chat template) and
optional `max_tokens`, `stream`, `temperature`, `top_p`, `top_k`, `repetition_penalty`, `seed`,
`stop_words`, `return_prompt_logprob` in; `text_output` out, with `output_ids`, `finish_reason`
and, when asked, `prompt_logprob`/`prompt_tokens`. Decoupled: a streaming request gets one
response per new piece of text and a final one; a non-streaming one a single response. Every
request joins causal.py's in-flight batch.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

import numpy as np

from . import causal
from .base import ServedModel, Tensor, column, texts, value_column
from .decoding import DecodeSettings
from .genai import GenAIModel
from .runtimes import GenAIModelFiles
from .structured import SchemaError, schema_grammar

# How often a running request asks Triton whether its client left (seconds).
CANCEL_CHECK_S = 0.5
# The optional inputs that set one prompt's sampling (and its prompt log-probability).
SAMPLING_INPUTS = (
    "max_tokens",
    "temperature",
    "top_p",
    "top_k",
    "repetition_penalty",
    "seed",
    "return_prompt_logprob",
)


class Generator(ServedModel):
    decoupled = True  # config.pbtxt: model_transaction_policy { decoupled: true }
    inputs = (
        Tensor("text_input", "STRING", optional=True),
        Tensor("messages", "STRING", optional=True),
        Tensor("max_tokens", "INT32", optional=True),
        Tensor("stream", "BOOL", optional=True),
        Tensor("temperature", "FP32", optional=True),
        Tensor("top_p", "FP32", optional=True),
        Tensor("top_k", "INT32", optional=True),
        Tensor("repetition_penalty", "FP32", optional=True),
        Tensor("seed", "UINT64", optional=True),
        Tensor("stop_words", "STRING", dims=(-1,), optional=True),
        Tensor("return_prompt_logprob", "BOOL", optional=True),
        # Ids to score teacher-forced after the prompt (-1 pads a shorter row): the gate sends
        # PyTorch's greedy continuation and reads how many are the model's own next token.
        Tensor("score_ids", "INT32", dims=(-1,), optional=True),
        # Structured output: a JSON Schema every answer must validate against (the decoding is
        # constrained to it, structured.py), one per request.
        Tensor("json_schema", "STRING", optional=True),
        # Tool calling: the functions (OpenAI's `tools`, JSON) the chat template renders with
        # `messages`, and text the answer starts with (the API's forced call) after the prompt.
        Tensor("tools", "STRING", optional=True),
        Tensor("assistant_prefix", "STRING", optional=True),
    )
    outputs = (
        Tensor("text_output", "STRING"),
        Tensor("output_ids", "INT32", dims=(-1,)),
        Tensor("finish_reason", "STRING"),
        Tensor("prompt_logprob", "FP32"),
        Tensor("prompt_tokens", "INT32"),
        Tensor("score_logprob", "FP32"),
        Tensor("score_matches", "INT32"),
    )

    def __init__(self, directory: str, settings: dict[str, Any]):
        self.tokenizer, opened = causal.load_serving(directory, settings)
        # What serves the model: OpenVINO GenAI's pipeline, or the exported decoder's session.
        model = (
            GenAIModel(opened, prefix_caching=bool(settings.get("prefix_caching", False)))
            if isinstance(opened, GenAIModelFiles)
            else causal.CausalLM(settings["onnx"], session=opened)
        )
        d = dict(settings["defaults"])
        self.defaults = causal.Sampling(**{**d, "stop": tuple(d.get("stop") or ())})
        self.max_context = int(settings["max_context"])
        # The engine the model's runtime serves it with: causal.Engine's in-flight batching over
        # a runtime that runs feeds, or OpenVINO GenAI's continuous batching (genai.py).
        batching = causal.Batching(
            max_rows=int(settings.get("max_rows", causal.MAX_ROWS)),
            step_tokens=int(settings.get("step_tokens", causal.STEP_TOKENS)),
            request_level=settings.get("batching", causal.BATCHING) == "request",
            max_context=self.max_context,
        )
        self.engine = model.engine(
            self.tokenizer,
            [int(e) for e in settings["eos_token_ids"]],
            DecodeSettings.from_dict(settings["processors"]),
            batching,
        )
        interval = settings.get("stream_interval_ms", causal.STREAM_INTERVAL_MS)
        self.engine.stream_interval = float(interval) / 1000

    @classmethod
    def from_directory(cls, directory: str, settings: dict[str, Any]) -> Generator:
        return cls(directory, settings)

    def close(self) -> None:
        self.engine.close()

    # requests -----------------------------------------------------------------------------------
    def parse(self, arrays: dict[str, np.ndarray]) -> list[dict[str, Any]]:
        """One row per prompt: its ids, settings and whether it streams; ValueError for the
        client when a value is bad."""
        prompts = self.prompts(arrays)
        n = len(prompts)
        stream = [bool(v) for v in value_column(arrays, "stream", n) if v is not None]
        if any(stream) and n > 1:
            raise ValueError(
                "a streaming request carries one prompt: send the others as requests of their own"
            )
        stop_rows = stop_word_rows(arrays, n)
        columns = {name: value_column(arrays, name, n) for name in SAMPLING_INPUTS}
        scores = score_rows(arrays, n)
        grammar = self.grammar(arrays, n)
        rows = []
        for i, (text, special) in enumerate(prompts):
            values = {k: v[i] for k, v in columns.items()}
            sampling = self.sampling(values, stop_rows[i])
            rows.append(
                {
                    "ids": self.prompt_ids(text, special, sampling, len(scores[i])),
                    "sampling": sampling,
                    "stream": bool(stream and stream[0]),
                    "logprob": bool(values["return_prompt_logprob"]),
                    "score": scores[i],
                    "grammar": grammar,
                }
            )
        return rows

    def prompts(self, arrays: dict[str, np.ndarray]) -> list[tuple[str, bool]]:
        """Each prompt's text, and whether the tokenizer adds its special tokens (a plain
        prompt: yes; a chat, rendered by its template: no)."""
        if "text_input" in arrays and "messages" in arrays:
            raise ValueError(
                "the request has both text_input and messages: send one of them "
                "(text_input, a plain prompt; messages, a chat)"
            )
        if "text_input" in arrays:
            arr = column(arrays, "text_input")
            return [(row[0], True) for row in texts(arr, "text_input")]
        if "messages" in arrays:
            return self.chats(arrays)
        raise ValueError("the request has neither text_input nor messages: send one")

    def prompt_ids(
        self, text: str, special: bool, sampling: causal.Sampling, scored: int
    ) -> list[int]:
        """The prompt's ids; ValueError when it is empty, or when it and what follows it (the
        new tokens, or the `scored` ids) do not fit the context."""
        ids = self.tokenizer.encode(text, special)
        if not ids:
            raise ValueError("the prompt is empty: send some text")
        if len(ids) + max(sampling.max_new_tokens, scored) > self.max_context:
            raise ValueError(
                f"the prompt is {len(ids)} tokens and max_tokens "
                f"{sampling.max_new_tokens}: {len(ids) + sampling.max_new_tokens} is over "
                f"this model's context length {self.max_context}; shorten the prompt or "
                "lower max_tokens"
            )
        return ids

    def chats(self, arrays: dict[str, np.ndarray]) -> list[tuple[str, bool]]:
        """The prompts of `messages` rows, rendered by the chat template with `tools`, each
        followed by `assistant_prefix`."""
        tools = None
        if "tools" in arrays:
            try:
                tools = json.loads(texts(column(arrays, "tools"), "tools")[0][0])
            except json.JSONDecodeError as exc:
                raise ValueError(f"tools is not JSON: {exc}") from None
            if not isinstance(tools, list):
                raise ValueError("tools must be a JSON list of functions")
        prefix = (
            texts(column(arrays, "assistant_prefix"), "assistant_prefix")[0][0]
            if "assistant_prefix" in arrays
            else ""
        )
        prompts = []
        for row in texts(column(arrays, "messages"), "messages"):
            try:
                chat = json.loads(row[0])
            except json.JSONDecodeError as exc:
                raise ValueError(f"messages is not JSON: {exc}") from None
            prompts.append((self.tokenizer.render(chat, tools) + prefix, False))
        return prompts

    def grammar(self, arrays: dict[str, np.ndarray], rows: int) -> str:
        """The grammar of the request's json_schema ("" without one); ValueError naming the
        schema part it cannot enforce, or why this engine cannot constrain."""
        if "json_schema" not in arrays:
            return ""
        if self.engine.unconstrained:
            raise ValueError(f"json_schema cannot be served: {self.engine.unconstrained}")
        schema = texts(column(arrays, "json_schema"), "json_schema")[0][0]
        try:
            return schema_grammar(schema)
        except SchemaError as exc:
            raise ValueError(f"json_schema {exc}") from None

    def sampling(self, v: dict[str, Any], stop: tuple[str, ...] | None) -> causal.Sampling:
        changes: dict[str, Any] = {}
        if v["max_tokens"] is not None:
            if not 1 <= int(v["max_tokens"]) < self.max_context:
                raise ValueError(
                    f"max_tokens {v['max_tokens']} is outside 1..{self.max_context - 1}"
                )
            changes["max_new_tokens"] = int(v["max_tokens"])
        checks = {
            "temperature": (0.0, 100.0),
            "top_p": (1e-6, 1.0),
            "repetition_penalty": (1e-3, 100.0),
        }
        for name, (low, high) in checks.items():
            if v[name] is not None:
                value = float(v[name])
                if not low <= value <= high:  # False for NaN too
                    raise ValueError(f"{name} {value} is outside {low:g}..{high:g}")
                changes[name] = value
        if v["top_k"] is not None:
            if int(v["top_k"]) < 0:
                raise ValueError(f"top_k {v['top_k']} is negative: 0 turns it off")
            changes["top_k"] = int(v["top_k"])
        if v["seed"] is not None:
            changes["seed"] = int(v["seed"])
        if stop is not None:
            changes["stop"] = stop
        return causal.Sampling(**{**self.defaults.__dict__, **changes})

    # the gate's and the benchmark's way in: whole answers
    # ------------------------------------------
    def answer(self, requests: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray] | str]:
        """Each request's complete answer (streaming ignored), every prompt in the in-flight
        batch together; a bad request gets its error message."""
        answers, rows, owners = self.parse_all(requests)
        done = threading.Semaphore(0)
        seqs = [self._sequence(row, _collect(done), stream=False) for row in rows]
        if seqs:
            self.engine.submit(seqs)
        for _ in seqs:
            done.acquire()
        pending: dict[int, list[causal.Sequence]] = {}
        for r, seq in zip(owners, seqs):
            pending.setdefault(r, []).append(seq)
        for r, mine in pending.items():
            failed = [s for s in mine if s.finish == "error"]
            answers[r] = failed[0].text if failed else outputs(mine)
        return answers

    def _sequence(
        self, row: dict[str, Any], emit: Any, stream: bool, gone: Any = lambda: False
    ) -> causal.Sequence:
        return causal.Sequence(
            prompt=row["ids"],
            sampling=row["sampling"],
            emit=emit,
            stream=stream,
            gone=gone,
            want_logprob=row["logprob"],
            score=row["score"],
            grammar=row["grammar"],
        )

    # Triton's decoupled way in
    # ------------------------------------------------------------------------
    def triton_execute(self, requests: list, pb_utils: Any) -> None:
        """Hand every request to the decode loop and return at once: the loop answers each
        through its response sender (pieces, then the final response)."""
        final = pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        seqs = []
        for request in requests:
            sender = request.get_response_sender()
            arrays = {}
            for spec in self.inputs:
                tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
                if tensor is not None:
                    arrays[spec.name] = tensor.as_numpy()
            try:
                rows = self.parse(arrays)
                reply = TritonReply(sender, request, rows, pb_utils, self)
            except Exception as exc:  # noqa: BLE001 - a bad request is answered, the rest run
                message = (
                    str(exc)
                    if isinstance(exc, ValueError)
                    else f"the request could not be read ({type(exc).__name__}: {exc}); send "
                    "text_input (or messages) as a [n, 1] BYTES tensor"
                )
                error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
                sender.send(pb_utils.InferenceResponse(output_tensors=[], error=error), flags=final)
                continue
            seqs.extend(reply.sequences)
        if seqs:
            self.engine.submit(seqs)


def stop_word_rows(arrays: dict[str, np.ndarray], rows: int) -> list[tuple[str, ...] | None]:
    """Each row's stop words (None when the request leaves stop_words out)."""
    stops = column(arrays, "stop_words", required=False)
    if stops is None:
        return [None] * rows
    found: list[tuple[str, ...] | None] = [
        tuple(s for s in row if s) for row in texts(stops, "stop_words")
    ]
    if len(found) != rows:
        raise ValueError(f"stop_words needs one row per prompt: {rows}, got {len(found)}")
    return found


def score_rows(arrays: dict[str, np.ndarray], rows: int) -> list[list[int]]:
    """Each row's ids to score (none when the request leaves score_ids out)."""
    arr = column(arrays, "score_ids", required=False)
    if arr is None:
        return [[] for _ in range(rows)]
    if len(arr) != rows:
        raise ValueError(f"score_ids needs one row per prompt: {rows}, got {len(arr)}")
    return [[int(i) for i in row if i >= 0] for row in arr]


def _collect(done: threading.Semaphore):
    def emit(text: str, ids: list[int], last: bool, seq: causal.Sequence) -> None:
        seq.text = text if seq.finish == "error" else seq.text + text
        if last:
            done.release()

    return emit


def outputs(seqs: list[causal.Sequence]) -> dict[str, np.ndarray]:
    """The complete answer of one request's prompts (output_ids padded with -1)."""
    width = max(len(s.generated) for s in seqs)
    ids = np.full((len(seqs), width), -1, np.int32)
    for r, s in enumerate(seqs):
        ids[r, : len(s.generated)] = s.generated
    return {
        "text_output": np.array([[s.text.encode("utf-8")] for s in seqs], dtype=np.object_),
        "output_ids": ids,
        "finish_reason": np.array([[str(s.finish).encode()] for s in seqs], dtype=np.object_),
        "prompt_logprob": np.array([[s.prompt_logprob] for s in seqs], np.float32),
        "prompt_tokens": np.array([[len(s.prompt)] for s in seqs], np.int32),
        "score_logprob": np.array([[s.score_logprob] for s in seqs], np.float32),
        "score_matches": np.array([[s.score_matches] for s in seqs], np.int32),
    }


class TritonReply:
    """How one Triton request is answered: a streaming prompt piece by piece, non-streaming
    prompts together once all have finished; a client that went away ends its sequences."""

    def __init__(
        self, sender: Any, request: Any, rows: list[dict[str, Any]], pb_utils: Any, model: Generator
    ):
        self.sender, self.pb = sender, pb_utils
        self.left = len(rows)
        self.lost = False  # the client is gone, or its final response was sent
        self.lock = threading.Lock()
        cancelled = getattr(sender, "is_cancelled", None) or getattr(request, "is_cancelled", None)
        self.cancelled = cancelled or (lambda: False)
        self.checked = 0.0  # when Triton was last asked
        self.sequences = [
            model._sequence(row, self.emit, stream=row["stream"], gone=self.gone) for row in rows
        ]

    def gone(self) -> bool:
        """Whether the client left. Asking Triton is a round trip to the server process: it is
        asked at most every CANCEL_CHECK_S per request, not at every token of every stream."""
        if self.lost:
            return True
        now = time.monotonic()
        if now - self.checked < CANCEL_CHECK_S:
            return False
        self.checked = now
        self.lost = bool(self.cancelled())
        return self.lost

    def emit(self, text: str, ids: list[int], last: bool, seq: causal.Sequence) -> None:
        pb = self.pb
        final = pb.TRITONSERVER_RESPONSE_COMPLETE_FINAL
        if self.lost:  # one final response per request: its other prompts end unanswered
            return
        try:
            if seq.finish in ("error", "cancelled"):
                # The request ends here; its other prompts leave the batch (gone()).
                self.lost = True
                if seq.finish == "error":
                    error = pb.TritonError(text, pb.TritonError.INTERNAL)
                    self.sender.send(
                        pb.InferenceResponse(output_tensors=[], error=error), flags=final
                    )
                else:
                    self.sender.send(flags=final)
                return
            if seq.stream:
                tensors = {
                    "text_output": np.array([[text.encode("utf-8")]], dtype=np.object_),
                    "output_ids": np.array([ids], np.int32),
                }
                if last:
                    every = outputs([seq])
                    every["text_output"], every["output_ids"] = (
                        tensors["text_output"],
                        tensors["output_ids"],
                    )
                    tensors = every
                self.sender.send(
                    pb.InferenceResponse(
                        output_tensors=[pb.Tensor(k, v) for k, v in tensors.items()]
                    ),
                    flags=final if last else 0,
                )
                return
            seq.text = seq.text + text
            if not last:
                return
            with self.lock:
                self.left -= 1
                if self.left:
                    return
            every = outputs(self.sequences)
            self.sender.send(
                pb.InferenceResponse(output_tensors=[pb.Tensor(k, v) for k, v in every.items()]),
                flags=final,
            )
        except Exception:  # the client is gone: its sequences leave the batch
            self.lost = True
