"""Decoding, ported from transformers' `generate` with numpy only: the settings (GenerationConfig's
fields the served model implements), the logits processors, sampling (temperature, top-k, top-p)
and stop strings, and greedy and beam search over any decoder step function. Translation
(seq2seq.py) and text generation (causal.py, one row at a time in its in-flight batch) both pick
their next tokens here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

import numpy as np

NEG_INF = np.float32(-np.inf)
# One decoder step: (last tokens [N, 1], encoder states, encoder mask, KV cache or None for the
# first step) -> (logits of the next token [N, V], the KV cache after it).
Step = Callable[[np.ndarray, np.ndarray, np.ndarray, Any], tuple[np.ndarray, Any]]


# --- settings and logits processors ---------------------------------------------------------


@dataclass(frozen=True)
class DecodeSettings:
    """Everything `generate` needs that is not the model: mirrors transformers' GenerationConfig
    fields the served model implements. Unknown or unsupported settings are refused upstream."""

    decoder_start_token_id: int
    eos_token_ids: list[int]
    pad_token_id: int
    max_new_tokens: int
    num_beams: int = 1
    forced_bos_token_id: int | None = None
    forced_eos_token_id: list[int] | None = None
    min_length: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    bad_words_ids: list[list[int]] = field(default_factory=list)
    length_penalty: float = 1.0
    early_stopping: bool | str = False

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DecodeSettings:
        return cls(**data)

    def with_request(
        self,
        max_new_tokens: int | None = None,
        num_beams: int | None = None,
        forced_bos_token_id: int | None = None,
    ) -> DecodeSettings:
        changes: dict[str, Any] = {}
        if max_new_tokens is not None:
            changes["max_new_tokens"] = int(max_new_tokens)
        if num_beams is not None:
            changes["num_beams"] = int(num_beams)
        if forced_bos_token_id is not None:
            changes["forced_bos_token_id"] = int(forced_bos_token_id)
        return replace(self, **changes) if changes else self

    def changes_scores(self) -> bool:
        """Whether process_scores would change any score (else greedy is a plain argmax)."""
        return (
            self.repetition_penalty != 1.0
            or self.no_repeat_ngram_size > 0
            or bool(self.bad_words_ids)
            or self.min_length > 0
            or self.forced_bos_token_id is not None
            or self.forced_eos_token_id is not None
        )

    @property
    def max_length(self) -> int:
        return self.max_new_tokens + 1  # the decoder prompt is the start token alone


def process_scores(scores: np.ndarray, input_ids: np.ndarray, s: DecodeSettings) -> np.ndarray:
    """transformers' logits processors, in its order, on scores [N, V] for sequences [N, cur]."""
    cur_len = input_ids.shape[1]
    if s.repetition_penalty != 1.0:
        for row, ids in enumerate(input_ids):
            picked = scores[row, ids]
            scores[row, ids] = np.where(
                picked < 0, picked * s.repetition_penalty, picked / s.repetition_penalty
            )
    n = s.no_repeat_ngram_size
    if n > 0 and cur_len + 1 >= n:
        for row, ids in enumerate(input_ids.tolist()):
            prefix = tuple(ids[cur_len - n + 1 :])
            banned = [
                ids[i + n - 1]
                for i in range(cur_len - n + 1)
                if tuple(ids[i : i + n - 1]) == prefix
            ]
            scores[row, banned] = NEG_INF
    if s.bad_words_ids:
        bad = [b for b in s.bad_words_ids if not any(b == [e] for e in s.eos_token_ids)]
        for row, ids in enumerate(input_ids.tolist()):
            for seq in bad:
                if len(seq) == 1 or ids[len(ids) - len(seq) + 1 :] == seq[:-1]:
                    scores[row, seq[-1]] = NEG_INF
    if s.min_length > 0 and cur_len < s.min_length:
        scores[:, s.eos_token_ids] = NEG_INF
    if s.forced_bos_token_id is not None and cur_len == 1:
        scores[:] = NEG_INF
        scores[:, s.forced_bos_token_id] = 0
    if s.forced_eos_token_id is not None and cur_len == s.max_length - 1:
        scores[:] = NEG_INF
        scores[:, s.forced_eos_token_id] = 0
    return scores


def warp(scores: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """transformers' sampling warpers in its order (temperature, top-k, top-p) on scores [N, V]:
    tokens outside the kept set get -inf."""
    if temperature != 1.0:
        scores = scores / np.float32(temperature)
    if 0 < top_k < scores.shape[-1]:
        kth = -np.partition(-scores, top_k - 1, axis=-1)[:, top_k - 1 : top_k]
        scores = np.where(scores < kth, NEG_INF, scores)
    if top_p < 1.0:
        order = np.argsort(scores, axis=-1, kind="stable")  # ascending, as transformers sorts
        ranked = np.take_along_axis(scores, order, axis=-1)
        probs = np.exp(ranked - ranked.max(axis=-1, keepdims=True))
        cumulative = np.cumsum(probs / probs.sum(axis=-1, keepdims=True), axis=-1)
        drop = cumulative <= (1 - top_p)
        drop[:, -1] = False  # the most likely token always stays
        dropped = np.zeros_like(drop)
        np.put_along_axis(dropped, order, drop, axis=-1)
        scores = np.where(dropped, NEG_INF, scores)
    return scores.astype(np.float32, copy=False)


def pick(scores: np.ndarray, rng: np.random.Generator | None = None) -> np.ndarray:
    """The next token of each row: the best (greedy, `rng` None) or drawn from the softmax of
    the (warped) scores."""
    if rng is None:
        return scores.argmax(axis=-1).astype(np.int64)
    probs = np.exp(scores - scores.max(axis=-1, keepdims=True)).astype(np.float64)
    probs /= probs.sum(axis=-1, keepdims=True)
    return np.array([rng.choice(len(p), p=p) for p in probs], dtype=np.int64)


def stop_at(text: str, stops: list[str]) -> int:
    """Where the first stop string begins in `text` (-1: none does): the text ends there."""
    found = [i for i in (text.find(s) for s in stops if s) if i >= 0]
    return min(found) if found else -1


def unsure_tail(text: str, stops: list[str]) -> int:
    """How many trailing characters of `text` may still become a stop string (or are an
    unfinished UTF-8 character, decoded as U+FFFD): a stream holds them back."""
    keep = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), keep, -1):
            if text.endswith(s[:n]):
                keep = n
                break
    while keep < len(text) and text[len(text) - keep - 1] == "\ufffd":
        keep += 1
    return keep


def log_softmax(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, in x's own float type."""
    m = x.max(axis=-1, keepdims=True)
    shifted = x - m
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(x.dtype)


def _topk(x: np.ndarray, k: int) -> np.ndarray:
    """Indices of the k largest values per row, largest first (stable among equals)."""
    return np.argsort(-x, axis=-1, kind="stable")[:, :k]


# --- search ---------------------------------------------------------------------------------------


def greedy(step: Step, hidden: np.ndarray, mask: np.ndarray, s: DecodeSettings) -> list[list[int]]:
    """transformers' greedy search: the best token each step until every row has ended."""
    n = hidden.shape[0]
    seqs = np.full((n, 1), s.decoder_start_token_id, dtype=np.int64)
    unfinished = np.ones(n, dtype=bool)
    eos = np.array(s.eos_token_ids, dtype=np.int64)
    past = None
    while True:
        logits, past = step(seqs[:, -1:], hidden, mask, past)
        scores = process_scores(logits.astype(np.float32, copy=True), seqs, s)
        nxt = pick(scores)
        nxt = np.where(unfinished, nxt, s.pad_token_id)
        seqs = np.concatenate([seqs, nxt[:, None]], axis=1)
        unfinished &= ~np.isin(nxt, eos)
        if seqs.shape[1] >= s.max_length or not unfinished.any():
            break
    return seqs.tolist()


def beam(step: Step, hidden: np.ndarray, mask: np.ndarray, s: DecodeSettings) -> list[list[int]]:
    """transformers' vectorised beam search (4.5x), step for step."""
    batch, beams = hidden.shape[0], s.num_beams
    hidden = np.repeat(hidden, beams, axis=0)
    mask = np.repeat(mask, beams, axis=0)
    eos = np.array(s.eos_token_ids, dtype=np.int64)
    # Enough candidates that `beams` of them still run on when the best ones end at an eos.
    keep = max(2, 1 + len(eos)) * beams
    fill = s.pad_token_id if s.pad_token_id is not None else int(eos[0])
    state = _Beams.start(batch, beams, s, fill)
    past = None
    cur = 1
    while True:
        flat = state.running[:, :, :cur].reshape(batch * beams, cur)
        logits, past = step(flat[:, -1:], hidden, mask, past)
        logp = process_scores(log_softmax(logits.astype(np.float32)), flat, s)
        found = _candidates(state, logp, keep, eos, cur, s.max_length)
        reorder = state.run_on(found)
        state.merge_finished(found, cur, s)
        # the KV cache follows the beams that continue
        flat_idx = (reorder + np.arange(batch)[:, None] * beams).reshape(-1)
        past = {k: (v if ".encoder." in k else v[flat_idx]) for k, v in past.items()}
        cur += 1
        state.update_improvable(cur, s)
        if state.done(found.hits, s):
            return state.best(fill)


# Added to a score, takes its beam out of the running (transformers' -1e9).
_OUT = np.float32(-1.0e9)


class _Candidates(NamedTuple):
    """One step's best `keep` continuations of each row's beams, [batch, keep] each."""

    scores: np.ndarray  # summed log-probabilities
    src_beam: np.ndarray  # the beam each continues
    token: np.ndarray  # its new token
    seqs: np.ndarray  # [batch, keep, max_length]: the beam with the token
    hits: np.ndarray  # whether it ends there (an eos, or the length limit)


def _candidates(
    state: _Beams, logp: np.ndarray, keep: int, eos: np.ndarray, cur: int, max_length: int
) -> _Candidates:
    """The best `keep` continuations per row of the running beams, given each beam's next-token
    log-probabilities `logp` [batch * beams, vocab] at position `cur`."""
    batch, beams = state.running_scores.shape
    vocab = logp.shape[-1]
    acc = (logp.reshape(batch, beams, vocab) + state.running_scores[:, :, None]).reshape(
        batch, beams * vocab
    )
    top = _topk(acc, keep)
    scores = np.take_along_axis(acc, top, axis=1)
    src_beam, token = top // vocab, top % vocab
    seqs = state.running[np.arange(batch)[:, None], src_beam].copy()
    seqs[:, :, cur] = token
    hits = np.isin(token, eos) | (cur + 1 >= max_length)
    return _Candidates(scores, src_beam, token, seqs, hits)


@dataclass
class _Beams:
    """Beam search's state, `beams` per row of the batch: the running beams (tokens so far, summed
    log-probabilities) and the best finished hypotheses yet (tokens, length-penalised scores,
    lengths, and whether the slot holds one); `improvable` [batch, 1] says whether a running
    beam of the row may still beat them."""

    running: np.ndarray  # [batch, beams, max_length]
    running_scores: np.ndarray  # [batch, beams]
    sequences: np.ndarray  # [batch, beams, max_length]
    scores_done: np.ndarray  # [batch, beams]
    finished: np.ndarray  # [batch, beams]
    lengths_done: np.ndarray  # [batch, beams]
    improvable: np.ndarray  # [batch, 1]

    @classmethod
    def start(cls, batch: int, beams: int, s: DecodeSettings, fill: int) -> _Beams:
        """Every beam the start token alone; all but the first out of the running, or the first
        step would pick the same tokens once per beam."""
        running = np.full((batch, beams, s.max_length), fill, dtype=np.int64)
        running[:, :, 0] = s.decoder_start_token_id
        running_scores = np.zeros((batch, beams), dtype=np.float32)
        running_scores[:, 1:] = _OUT
        return cls(
            running=running,
            running_scores=running_scores,
            sequences=running.copy(),
            scores_done=np.full((batch, beams), _OUT, dtype=np.float32),
            finished=np.zeros((batch, beams), dtype=bool),
            lengths_done=np.full((batch, beams), 1, dtype=np.int64),
            improvable=np.ones((batch, 1), dtype=bool),
        )

    def run_on(self, found: _Candidates) -> np.ndarray:
        """The best candidates that did not end become the running beams; the beam each came
        from, [batch, beams] (the KV cache is reordered by it)."""
        beams = self.running.shape[1]
        alive = found.scores + found.hits.astype(np.float32) * _OUT
        nxt = _topk(alive, beams)
        self.running = np.take_along_axis(found.seqs, nxt[:, :, None], axis=1)
        self.running_scores = np.take_along_axis(alive, nxt, axis=1)
        return np.take_along_axis(found.src_beam, nxt, axis=1)

    def merge_finished(self, found: _Candidates, cur: int, s: DecodeSettings) -> None:
        """The candidates that ended among the top `beams` join the finished hypotheses, scored
        with the length penalty; each row keeps its best `beams`. A row whose hypotheses are
        all final (early_stopping true) or that can no longer improve takes none."""
        beams = self.running.shape[1]
        just_done = found.hits & (np.arange(found.hits.shape[1]) < beams)[None, :]
        # The generated length: transformers' cur_len + 1 less the decoder prompt (one token).
        done_scores = (found.scores / np.float32((cur + 1 - 1) ** s.length_penalty)).astype(
            np.float32
        )
        full = self.finished.all(axis=-1, keepdims=True) & (s.early_stopping is True)
        done_scores += full.astype(np.float32) * _OUT
        done_scores += (~self.improvable).astype(np.float32) * _OUT
        done_scores += (~just_done).astype(np.float32) * _OUT
        merged_seq = np.concatenate([self.sequences, found.seqs], axis=1)
        merged_scores = np.concatenate([self.scores_done, done_scores], axis=1)
        merged_done = np.concatenate([self.finished, just_done], axis=1)
        merged_len = np.concatenate([self.lengths_done, np.full_like(found.token, cur + 1)], axis=1)
        best = _topk(merged_scores, beams)
        self.sequences = np.take_along_axis(merged_seq, best[:, :, None], axis=1)
        self.scores_done = np.take_along_axis(merged_scores, best, axis=1)
        self.finished = np.take_along_axis(merged_done, best, axis=1)
        self.lengths_done = np.take_along_axis(merged_len, best, axis=1)

    def update_improvable(self, cur: int, s: DecodeSettings) -> None:
        """Whether each row's best running beam, at the best length it may reach, could still
        beat the row's worst finished hypothesis (once not, the row stays done)."""
        if s.early_stopping == "never" and s.length_penalty > 0.0:
            best_len = s.max_length - 1
        else:
            best_len = cur - 1
        best_running = self.running_scores[:, :1] / np.float32(best_len**s.length_penalty)
        worst_done = np.where(self.finished, self.scores_done.min(axis=1, keepdims=True), _OUT)
        self.improvable = self.improvable & (best_running > worst_done).any(axis=-1, keepdims=True)

    def done(self, hits: np.ndarray, s: DecodeSettings) -> bool:
        """Whether the search ends: no row can improve, every hypothesis is final (early_stopping
        true), or every candidate of this step ended."""
        open_beam = not (self.finished.all() and s.early_stopping is True)
        return not (self.improvable.any() and open_beam and not hits.all())

    def best(self, fill: int) -> list[list[int]]:
        """Each row's best finished hypothesis, padded with `fill` to the longest, as
        transformers trims all rows to the longest output and pads the rest."""
        out = [
            self.sequences[b, 0, : int(self.lengths_done[b, 0])].tolist()
            for b in range(self.sequences.shape[0])
        ]
        width = max(len(x) for x in out)
        return [x + [fill] * (width - len(x)) for x in out]
