"""hf2triton/serving/decoding.py: the logits processors, sampling warpers, stop strings and the
greedy and beam searches that translation and text generation pick their tokens with. A small
Markov chain stands in for a decoder (its next-token log-probabilities depend on the last token
only), so each search's outcome is known by hand."""

from __future__ import annotations

import numpy as np
import pytest

from hf2triton.serving.decoding import (
    DecodeSettings,
    beam,
    greedy,
    pick,
    process_scores,
    stop_at,
    unsure_tail,
    warp,
)

EOS, START, A, B, C = 0, 1, 2, 3, 4


def settings(**changes) -> DecodeSettings:
    base = DecodeSettings(
        decoder_start_token_id=START, eos_token_ids=[EOS], pad_token_id=9, max_new_tokens=4
    )
    return base.with_request() if not changes else DecodeSettings(**{**base.to_dict(), **changes})


def scores_after(ids: list[int], s: DecodeSettings, vocab: int = 8) -> np.ndarray:
    return process_scores(np.ones((1, vocab), np.float32), np.array([ids], np.int64), s)[0]


def test_settings_round_trip_and_take_a_requests_overrides():
    s = settings(num_beams=2, bad_words_ids=[[3]])
    assert DecodeSettings.from_dict(s.to_dict()) == s
    changed = s.with_request(max_new_tokens=7, num_beams=1, forced_bos_token_id=5)
    assert (changed.max_new_tokens, changed.num_beams, changed.forced_bos_token_id) == (7, 1, 5)
    assert s.with_request() is s and s.max_length == 5  # the start token and 4 new ones
    assert not settings().changes_scores() and settings(min_length=2).changes_scores()


def test_each_logits_processor_takes_out_what_it_forbids():
    scores = process_scores(
        np.array([[2.0, -2.0, 1.0, 1.0]], np.float32),
        np.array([[0, 1]], np.int64),
        settings(repetition_penalty=2.0),
    )
    assert scores.tolist() == [[1.0, -4.0, 1.0, 1.0]]  # seen tokens less likely, both signs
    banned = scores_after([A, B, A], settings(no_repeat_ngram_size=2))
    assert banned[B] == -np.inf and np.isfinite(np.delete(banned, B)).all()
    bad = settings(bad_words_ids=[[C], [A, B], [EOS]])
    assert scores_after([START, A], bad)[[B, C]].tolist() == [-np.inf, -np.inf]
    assert scores_after([START, C], bad)[B] == 1.0  # [A, B] only bans B after A
    assert scores_after([START, A], bad)[EOS] == 1.0  # an eos never becomes a bad word
    assert scores_after([START], settings(min_length=3))[EOS] == -np.inf
    assert scores_after([START, A, B], settings(min_length=3))[EOS] == 1.0
    forced = scores_after([START], settings(forced_bos_token_id=C))
    assert forced.argmax() == C and np.isinf(np.delete(forced, C)).all()
    last = scores_after([START, A, A, A], settings(forced_eos_token_id=[EOS]))
    assert last.argmax() == EOS and np.isinf(np.delete(last, EOS)).all()


def test_warpers_keep_the_top_k_and_the_top_p_nucleus():
    logits = np.log(np.array([[0.5, 0.3, 0.15, 0.05]], np.float32))
    assert np.isfinite(warp(logits, 1.0, 2, 1.0)).tolist() == [[True, True, False, False]]
    assert np.isfinite(warp(logits, 1.0, 0, 0.7)).tolist() == [[True, True, False, False]]
    assert np.isfinite(warp(logits, 1.0, 0, 0.01)).tolist() == [[True, False, False, False]]
    hot = warp(logits, 2.0, 0, 1.0)
    assert np.allclose(hot, logits / 2)
    rng = np.random.default_rng(0)
    drawn = {int(pick(warp(logits, 1.0, 2, 1.0), rng)[0]) for _ in range(200)}
    assert drawn == {0, 1}  # sampling draws only what the warpers kept, each of them
    again = [pick(logits, np.random.default_rng(5))[0] for _ in range(2)]
    assert again[0] == again[1] and pick(logits)[0] == 0


def test_stop_strings_cut_the_text_and_hold_back_what_may_become_one():
    assert stop_at("hello world. bye", ["bye", "."]) == 11
    assert stop_at("hello", ["x", ""]) == -1
    assert unsure_tail("say STO", ["STOP"]) == 3  # "STO" may still become "STOP"
    assert unsure_tail("say ST", ["STOP", "T"]) == 2
    assert unsure_tail("done", ["STOP"]) == 0
    assert unsure_tail("caf\ufffd", []) == 1  # half a UTF-8 character so far


def markov(table: dict[int, dict[int, float]], vocab: int = 5):
    """A decoder step over a Markov chain: next-token probabilities by the last token."""
    logp = np.full((vocab, vocab), -30.0, np.float32)
    for last, nxt in table.items():
        for token, p in nxt.items():
            logp[last, token] = np.log(p)

    def step(tokens, hidden, mask, past):
        rows = tokens.shape[0]
        return logp[tokens[:, -1]], {"cache": np.zeros((rows, 1), np.float32)}

    return step


# After the start, A is likelier than B, but every way on from A is poor and B ends surely.
TRAP = {
    START: {A: 0.6, B: 0.4},
    A: {EOS: 0.34, A: 0.33, C: 0.33},
    B: {EOS: 0.98, C: 0.02},
    C: {EOS: 1.0},
}


def test_greedy_takes_the_likeliest_token_each_step_and_pads_rows_that_ended():
    hidden, mask = np.zeros((2, 3, 4), np.float32), np.ones((2, 3), np.int64)
    step = markov({**TRAP, START: {A: 0.6, B: 0.4}})
    assert greedy(step, hidden[:1], mask[:1], settings()) == [[START, A, EOS]]
    s = settings(max_new_tokens=3)
    long = markov({START: {A: 1.0}, A: {A: 0.9, EOS: 0.1}})
    assert greedy(long, hidden[:1], mask[:1], s) == [[START, A, A, A]]  # stopped at the length
    short, longer = (
        markov({START: {C: 0.9}, C: {EOS: 1.0}}),
        markov({START: {A: 1.0}, A: {B: 1.0}, B: {EOS: 1.0}}),
    )

    def rows(tokens, hidden, mask, past):  # row 0 ends after one token, row 1 after three
        first, _ = short(tokens[:1], hidden, mask, past)
        second, cache = longer(tokens[1:], hidden, mask, past)
        return np.concatenate([first, second]), cache

    out = greedy(rows, hidden, mask, s)
    assert out == [[START, C, EOS, 9], [START, A, B, EOS]]  # 9: the pad id
    # min_length counts the start token: no end before three tokens
    assert greedy(step, hidden[:1], mask[:1], settings(min_length=3)) == [[START, A, A, EOS]]


@pytest.mark.parametrize("num_beams", [2, 3])
def test_beam_search_finds_the_likelier_sequence_greedy_misses(num_beams):
    hidden, mask = np.zeros((1, 3, 4), np.float32), np.ones((1, 3), np.int64)
    s = settings(num_beams=num_beams, max_new_tokens=3)
    step = markov(TRAP)
    assert greedy(step, hidden, mask, s) == [[START, A, EOS]]  # p 0.6 * 0.34 = 0.20
    assert beam(step, hidden, mask, s) == [[START, B, EOS]]  # p 0.4 * 0.98 = 0.39


def test_beam_search_rows_are_independent_and_padded_to_the_longest():
    hidden, mask = np.zeros((2, 3, 4), np.float32), np.ones((2, 3), np.int64)
    s = settings(num_beams=2, max_new_tokens=3)
    out = beam(markov(TRAP), hidden, mask, s)
    assert out == [[START, B, EOS], [START, B, EOS]]
    chain = markov({START: {C: 1.0}, C: {A: 1.0}, A: {EOS: 1.0}})
    assert beam(chain, hidden[:1], mask[:1], s) == [[START, C, A, EOS]]
