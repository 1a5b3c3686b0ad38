"""Text generation on OpenVINO GenAI's ContinuousBatchingPipeline: its scheduler batches every
running sequence continuously over a paged KV cache that stays inside the runtime, so a decode
step no longer copies each row's cache in and out. One loop thread owns the pipeline: between
steps it adds the requests that came (token ids from the serving core's own tokenizer and chat
template, so the gate's ids are the served ids), stops those whose client left, then steps and
reads every handle that has tokens. What comes out goes through causal.Streaming, as the
home-made engine's: stop strings, held-back pieces, finish reasons, cancellation.

What OpenVINO GenAI does not do, the engine refuses up front (a candidate that cannot serve the
model faithfully is refused by the gate): logits processors it ignores outside beam search
(no_repeat_ngram_size, bad words).

The prompt's log-probability (the gate's perplexity) is scored on the same IR apart (PromptScorer),
compiled when first asked and freed when unused (IdleScorer).

Known from its source and tried: `step()` and `add_request()` hold the GIL; `read()` blocks when
nothing is queued (ask `can_read()` first); a handle stops its request when it is destroyed (so
every handle is kept until its request is final); two live requests may not share an id.

Part of the serving core: numpy, openvino and openvino_genai only.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np

from .causal import Batching, ChatTokenizer, Sequence, Streaming, processors_for, score_continuation
from .decoding import DecodeSettings
from .runtimes import GenAIModelFiles, RuntimeUnavailable

# OpenVINO GenAI's structured output (XGrammar) reads the vocabulary from the tokenizer as an
# OpenVINO IR beside the model: without it, a constrained request cannot be served.
TOKENIZER_IRS = (
    "openvino_tokenizer.xml",
    "openvino_tokenizer.bin",
    "openvino_detokenizer.xml",
    "openvino_detokenizer.bin",
)


class GenAIModel:
    """A stateful IR OpenVINO GenAI serves, with its pinned properties
    (runtimes/openvino_genai.py)."""

    def __init__(self, files: GenAIModelFiles, prefix_caching: bool = False):
        self.files = files
        self.in_use = files.in_use
        self.prefix_caching = prefix_caching

    def pipeline(self, max_rows: int, step_tokens: int, max_context: int) -> Any:
        import openvino_genai as ovg

        options = self.files.settings.options
        scheduler = ovg.SchedulerConfig()
        # 0 GB and 0 blocks: the cache grows as sequences need it (a fixed one too small for
        # what runs drops every running request).
        scheduler.cache_size = int(options["cache_gb"])
        scheduler.num_kv_blocks = 0
        scheduler.max_num_seqs = max_rows
        scheduler.dynamic_split_fuse = bool(options["split_prompts"])
        # Unsplit, a step must hold the longest prompt served whole (a longer one fails the
        # step), and one token of every running sequence.
        scheduler.max_num_batched_tokens = (
            step_tokens if options["split_prompts"] else max(step_tokens, max_context, max_rows)
        )
        scheduler.enable_prefix_caching = self.prefix_caching
        return ovg.ContinuousBatchingPipeline(
            self.files.directory, scheduler, "CPU", dict(self.files.properties)
        )

    def engine(
        self,
        tokenizer: ChatTokenizer,
        eos: list[int],
        processors: DecodeSettings,
        batching: Batching,
    ) -> GenAIEngine:
        why = unfaithful(processors)
        if why:
            raise RuntimeUnavailable(why)
        return GenAIEngine(self, tokenizer, eos, processors, batching)


def unfaithful(processors: DecodeSettings) -> str:
    """Why OpenVINO GenAI would not generate what the model's generation config asks ("" when
    it would)."""
    if processors.no_repeat_ngram_size or processors.bad_words_ids:
        return (
            "runtime openvino-genai does not apply the model's no_repeat_ngram_size or "
            "bad_words_ids outside beam search: it would not generate what the model's "
            "generation config asks; serve it on onnxruntime or openvino"
        )
    return ""


class Running:
    """A sequence in the pipeline and its handle."""

    def __init__(self, seq: Sequence, handle: Any):
        self.seq, self.handle = seq, handle


class PromptScorer:
    """The log-probability of a prompt, from one forward pass of the same stateful IR compiled
    with the same pinned properties (OpenVINO GenAI's own `echo` with `logprobs` gives other
    figures when the batch also holds generating requests: seen with 2026.4.1). Compiled on
    first use: only the gate and the smoke test ask for it."""

    def __init__(self, files: GenAIModelFiles):
        import os

        import openvino as ov

        self.compiled = ov.Core().compile_model(
            os.path.join(files.directory, "openvino_model.xml"), "CPU", dict(files.properties)
        )
        self.request = self.compiled.create_infer_request()

    def __call__(self, ids: list[int]) -> float:
        if len(ids) < 2:
            return 0.0
        logits = self.logits(ids)[:-1].astype(np.float64)
        top = logits.max(axis=-1, keepdims=True)
        lse = np.log(np.exp(logits - top).sum(axis=-1)) + top[:, 0]
        return float((logits[np.arange(len(ids) - 1), ids[1:]] - lse).sum())

    def logits(self, ids: list[int]) -> np.ndarray:
        """The logits [len(ids), vocab] of one forward pass over `ids`."""
        feeds = {
            "input_ids": np.asarray([ids], np.int64),
            "attention_mask": np.ones((1, len(ids)), np.int64),
            "position_ids": np.arange(len(ids), dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32),
        }
        self.request.reset_state()  # the KV cache lives in the request's state
        self.request.infer(feeds)
        logits = np.array(self.request.get_tensor("logits").data[0])
        self.request.reset_state()
        return logits


SCORER_IDLE_S = 30.0


class IdleScorer:
    """The PromptScorer, compiled when first used and freed `idle_s` seconds after its last
    use: it holds a second compiled copy of the weights beside the pipeline's (SmolLM2-1.7B's
    shape at fp32: 5 GB more anonymous memory, 11.5 GB more resident), which only the gate and
    the smoke test ask for; the model serves without it."""

    def __init__(self, files: GenAIModelFiles, idle_s: float = SCORER_IDLE_S):
        self.files, self.idle_s = files, idle_s
        self.lock = threading.Lock()
        self.scorer: PromptScorer | None = None
        self.used_at = 0.0
        self.timer: threading.Timer | None = None
        self.closed = False

    @contextlib.contextmanager
    def use(self) -> Iterator[PromptScorer]:
        with self.lock:
            try:
                self.scorer = self.scorer or PromptScorer(self.files)
                yield self.scorer
            finally:
                self.used_at = time.monotonic()
                if self.timer is None:
                    self.timer = threading.Timer(self.idle_s, self.free_if_idle)
                    self.timer.daemon = True
                    self.timer.start()

    def free_if_idle(self) -> None:
        with self.lock:
            self.timer = None
            left = self.idle_s - (time.monotonic() - self.used_at)
            if left > 0 and not self.closed:  # used since: wait out the rest
                self.timer = threading.Timer(left, self.free_if_idle)
                self.timer.daemon = True
                self.timer.start()
            else:
                self.scorer = None

    def close(self) -> None:
        with self.lock:
            if self.timer is not None:
                self.timer.cancel()
            self.timer, self.scorer, self.closed = None, None, True


class GenAIEngine(Streaming):
    """The loop around one ContinuousBatchingPipeline (the Generator's `engine`)."""

    loop_name = "genai-loop"

    def __init__(
        self,
        model: GenAIModel,
        tokenizer: ChatTokenizer,
        eos: list[int],
        processors: DecodeSettings,
        batching: Batching,
    ):
        import openvino_genai as ovg

        self.ovg, self.model, self.tokenizer, self.eos = ovg, model, tokenizer, set(eos)
        self.processors, self.max_rows = processors, max(1, batching.max_rows)
        self.step_tokens, self.max_context = max(1, batching.step_tokens), batching.max_context
        self.pipe = model.pipeline(self.max_rows, self.step_tokens, self.max_context)
        self.ids = itertools.count(1)
        self._init_loop()
        self.running: dict[int, Running] = {}
        self.scoring = IdleScorer(model.files)
        # Structured output needs the tokenizer's vocabulary as an OpenVINO IR beside the model.
        found = os.path.isfile(os.path.join(model.files.directory, TOKENIZER_IRS[0]))
        self.unconstrained = (
            ""
            if found
            else (
                f"this release has no {TOKENIZER_IRS[0]} beside its model (the export could not "
                "convert its tokenizer), which OpenVINO GenAI's structured output needs"
            )
        )

    # the loop ---------------------------------------------------------------------------------
    def close(self) -> None:
        super().close()
        self.running.clear()
        self.scoring.close()
        self.pipe = None

    def _loop(self) -> None:
        while True:
            with self.wake:
                if not self._wait_for_work():
                    return
                joining = list(self.waiting)
                self.waiting.clear()
            try:  # nothing a step raises ends the loop: every later request would hang
                self._admit(joining)
                self._stop_gone()
                if self.running:
                    self.pipe.step()
                    self.pace(len(self.running))
                    self._read()
            except Exception as exc:  # a failed step fails its sequences, not the server
                for run in list(self.running.values()):
                    if run.seq.finish is None:
                        self._fail(run.seq, f"generation failed: {type(exc).__name__}: {exc}")
                self.running.clear()
                # Its state after a failed step is unknown: a new pipeline for what comes.
                self.pipe = self.model.pipeline(self.max_rows, self.step_tokens, self.max_context)

    def _admit(self, joining: list[Sequence]) -> None:
        for seq in joining:
            if seq.gone():
                self._finish(seq, "cancelled")
                continue
            try:
                if seq.want_logprob or seq.score:
                    self._score(seq)
                handle = self.pipe.add_request(
                    next(self.ids), self.ovg_tensor(seq.prompt), self._config(seq)
                )
            except Exception as exc:  # a request the pipeline refuses fails alone
                self._fail(seq, f"generation refused: {type(exc).__name__}: {exc}")
                continue
            self.running[id(seq)] = Running(seq, handle)

    def _score(self, seq: Sequence) -> None:
        """The prompt's log-probability and the continuation's scores `seq` asks for."""
        with self.scoring.use() as scorer:
            if seq.want_logprob:
                seq.prompt_logprob = scorer(seq.prompt)
            if seq.score:
                whole = seq.prompt + seq.score
                seq.score_logprob, seq.score_matches = score_continuation(
                    scorer.logits(whole),
                    whole,
                    len(seq.prompt),
                    processors_for(self.processors, seq),
                )

    def _stop_gone(self) -> None:
        """Sequences whose client left stop now, not at their next token."""
        for run in list(self.running.values()):
            if run.seq.finish is None and run.seq.gone():
                self._finish(run.seq, "cancelled")
                self._end(run)

    def _read(self) -> None:
        status = self.ovg.GenerationStatus
        for run in list(self.running.values()):
            seq, new = run.seq, []
            while run.handle.can_read():  # never read() what is not there: it blocks
                for out in run.handle.read().values():
                    new.extend(out.generated_ids)
            for token in new:
                if self._take(seq, token):
                    break
            if seq.finish is None and run.handle.get_status() != status.RUNNING:
                if run.handle.get_status() == status.IGNORED:
                    self._fail(seq, "generation failed: the KV cache could not hold this sequence")
                else:  # a length or stop the pipeline saw first
                    self._finish(
                        seq,
                        "length" if len(seq.generated) >= seq.sampling.max_new_tokens else "stop",
                    )
            if seq.finish is not None:
                self._end(run)

    def _end(self, run: Running) -> None:
        if run.handle.get_status() == self.ovg.GenerationStatus.RUNNING:
            run.handle.stop()  # a stop string or a client gone: its KV blocks go at the next step
        self.running.pop(id(run.seq), None)

    # requests -----------------------------------------------------------------------------------
    def ovg_tensor(self, ids: list[int]) -> Any:
        import openvino as ov

        return ov.Tensor(np.asarray([ids], dtype=np.int64))

    def _config(self, seq: Sequence) -> Any:
        """The request's GenerationConfig: its sampling, the model's end-of-text ids and its
        processors (repetition penalty; min_length as new tokens)."""
        p, cfg = seq.sampling, self.ovg.GenerationConfig()
        cfg.max_new_tokens = int(p.max_new_tokens)
        eos = sorted(self.eos)
        cfg.set_eos_token_id(eos[0])
        cfg.stop_token_ids = set(eos)
        cfg.repetition_penalty = float(p.repetition_penalty)
        if seq.grammar:
            constraint = self.ovg.StructuredOutputConfig()
            constraint.grammar = seq.grammar
            cfg.structured_output_config = constraint
        if self.processors.min_length:
            cfg.min_new_tokens = max(0, self.processors.min_length - len(seq.prompt))
        if p.temperature > 0:
            cfg.do_sample = True
            cfg.temperature = float(p.temperature)
            cfg.top_p = float(p.top_p)
            if p.top_k:
                cfg.top_k = int(p.top_k)
            cfg.rng_seed = (
                int(p.seed)
                if p.seed is not None
                else int(np.random.default_rng().integers(0, 2**31))
            )
        else:
            cfg.do_sample = False
        return cfg
