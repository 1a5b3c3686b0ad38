"""The served Whisper decoding's own pieces against transformers' (4.57), case by case: the
timestamp rules (`WhisperTimeStampLogitsProcessor`) on random scores after every kind of
history, and the long-form segmentation (`_retrieve_segment`) of hand-written windows. The
release test (tests/kinds/test_speech_recognition.py) compares whole transcripts; these reach
the cases a random model may never produce."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation.logits_process import WhisperTimeStampLogitsProcessor
from transformers.models.whisper.generation_whisper import WhisperGenerationMixin

from hf2triton.kinds.margin import bound
from hf2triton.kinds.speech_recognition import wer
from hf2triton.serving.speech import WhisperDecode, timestamp_rules, window_segments

EOS, START, NO_TIMESTAMPS, VOCAB = 266, 267, 372, 1874
BEGIN = NO_TIMESTAMPS + 1  # <|0.00|>
SETTINGS = WhisperDecode(
    decoder_start_token_id=START,
    eos_token_id=EOS,
    max_new_tokens=64,
    no_timestamps_token_id=NO_TIMESTAMPS,
    max_initial_timestamp_index=50,
)
T = BEGIN + 100  # <|2.00|>
HISTORIES = {
    "nothing yet": [],
    "a timestamp": [T],
    "a timestamp, text": [T, 40],
    "a timestamp pair": [T, T + 40],
    "a closed segment, text": [T, 40, 41, T + 40, T + 40, 42],
    "text, then a timestamp": [T, 40, 41, T + 40],
    "text only": [40, 41, 42],
}


@pytest.mark.parametrize("history", list(HISTORIES))
def test_the_timestamp_rules_are_transformers(history):
    seq = HISTORIES[history]
    config = GenerationConfig(
        no_timestamps_token_id=NO_TIMESTAMPS, eos_token_id=EOS, max_initial_timestamp_index=50
    )
    theirs = WhisperTimeStampLogitsProcessor(config, begin_index=1)
    rng = np.random.default_rng(len(seq))
    took_timestamp = set()
    for trial in range(40):
        scores = rng.normal(0.0, 2.0, (1, VOCAB)).astype(np.float32)
        scores[0, BEGIN:] += rng.normal(-2.0, 1.5)  # sometimes the timestamps win together
        want = theirs(torch.tensor([[START, *seq]]), torch.from_numpy(scores.copy())).numpy()
        got = scores.copy()
        timestamp_rules(got, np.array([seq], dtype=np.int64).reshape(1, -1), SETTINGS)
        assert np.array_equal(np.isneginf(got), np.isneginf(want)), (history, trial)
        assert got.argmax() == want.argmax()
        took_timestamp.add(bool(want.argmax() >= BEGIN))
    # What the rules decide: a window opens on a timestamp, a pair is followed by text, and
    # after text the timestamps taken together sometimes win and sometimes do not.
    expected = {"nothing yet": {True}, "a timestamp pair": {False}, "text only": {True, False}}
    assert took_timestamp == expected.get(history, took_timestamp)


WINDOWS = {
    "no timestamps": [40, 41, 42],
    "nothing at all": [],
    "one timestamp at the end": [BEGIN, 40, 41, BEGIN + 250],
    "segments, the last one open": [BEGIN, 40, BEGIN + 100, BEGIN + 100, 41, 42, BEGIN + 300],
    "segments, ended by a pair": [
        BEGIN,
        40,
        BEGIN + 100,
        BEGIN + 120,
        41,
        BEGIN + 300,
        BEGIN + 300,
    ],
    "segments, then text cut off": [BEGIN, 40, BEGIN + 100, BEGIN + 100, 41, 42],
    "timestamps only": [BEGIN + 10, BEGIN + 10, BEGIN + 20, BEGIN + 20],
}


@pytest.mark.parametrize("window", list(WINDOWS))
@pytest.mark.parametrize("seek, frames", [(0, 3000), (4570, 1630)])
def test_a_windows_segments_and_next_seek_are_transformers(window, seek, frames):
    tokens = WINDOWS[window]
    want, want_offset = WhisperGenerationMixin._retrieve_segment(
        seek_sequence=torch.tensor(tokens, dtype=torch.long),
        seek_outputs=[None],
        time_offset=torch.tensor([seek * 0.01], dtype=torch.float64),
        timestamp_begin=BEGIN,
        seek_num_frames=torch.tensor([frames]),
        time_precision=0.02,
        time_precision_features=0.01,
        input_stride=2,
        prev_idx=0,
        idx=0,
        return_token_timestamps=False,
        decoder_input_ids=torch.zeros((1, 1), dtype=torch.long),
    )
    got, offset = window_segments(tokens, seek, frames, BEGIN)
    assert offset == int(want_offset)
    assert [g.tokens for g in got] == [w["tokens"].tolist() for w in want]
    for g, w in zip(got, want):
        assert g.start == pytest.approx(float(w["start"])) and g.end == pytest.approx(
            float(w["end"])
        )


def test_word_error_rate_counts_silence_and_its_margin_resamples_clips():
    said = ["the cat sat", "", "a dog", ""]
    truth = ["the cat sat down", "", "a dog", "hello"]
    value, sample = wer(said, truth)
    assert value == pytest.approx(2 / 7)  # one deletion, one deletion of the silent miss
    assert wer([""], [""])[0] == 0.0 and wer(["oops"], [""])[0] == 1.0
    silent, sample_silent = wer(["", ""], ["", ""])
    assert silent == 0.0 and bound(sample_silent, "<=") == 0.0  # nothing said of silence
    assert bound(sample, "<=") >= value
