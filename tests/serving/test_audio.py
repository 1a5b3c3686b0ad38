"""The served path's audio decoding and Whisper features (hf2triton.serving.audio) against
transformers' `WhisperFeatureExtractor` (its torch path, what PyTorch references get): speech
spoken by espeak-ng (infra/setup.sh installs it; those cases skip where it is missing), a tone,
silence and a full 30 s window; a chirp encoded by PyAV in every format served, at other rates
and in stereo, decoded to 16 kHz mono of its duration and level; and the inputs it refuses, each
with why."""

from __future__ import annotations

import io
import os
import shutil
import struct
import subprocess
import wave

import numpy as np
import pytest

from hf2triton.serving.audio import SAMPLE_RATE, AudioRefused, LogMel, decode

# The largest difference measured against the torch path (float32 STFT there, float64 here) is
# 6e-5, on a 30 s sweep, where bins far below the peak meet float32's rounding; 0 on silence.
PARITY = 1e-4
SPOKEN = (
    "The quick brown fox jumps over the lazy dog. Whisper turns speech into text, "
    "and this sentence checks that the served features are the ones it was trained on."
)


def encoded(wave_: np.ndarray, rate: int, fmt: str, codec: str, **options: str) -> bytes:
    """`wave_` (channels, samples) of float32 at `rate` encoded by PyAV as `codec` in `fmt`."""
    import av

    layout = "mono" if wave_.shape[0] == 1 else "stereo"
    out = io.BytesIO()
    with av.open(out, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=rate, layout=layout, options=options)
        interleaved = np.ascontiguousarray(wave_.T.reshape(1, -1), dtype=np.float32)
        frame = av.AudioFrame.from_ndarray(interleaved, format="flt", layout=layout)
        frame.sample_rate, frame.pts = rate, 0
        for packet in [*stream.encode(frame), *stream.encode(None)]:
            container.mux(packet)
    return out.getvalue()


def chirp(rate: int, seconds: float, channels: int = 1) -> np.ndarray:
    """A sweep from 200 Hz up 600 Hz a second at 0.3 of full scale, (channels, samples)."""
    t = np.arange(round(rate * seconds)) / rate
    sweep = (0.3 * np.sin(2 * np.pi * (200 * t + 300 * t**2))).astype(np.float32)
    return np.stack([sweep] * channels)


def wav(wave_: np.ndarray, rate: int = SAMPLE_RATE) -> bytes:
    return encoded(wave_.reshape(1, -1), rate, "wav", "pcm_s16le")


@pytest.fixture(scope="module")
def speech() -> bytes:
    """A WAV of espeak-ng speaking SPOKEN (22,050 Hz, about 9 s)."""
    if shutil.which("espeak-ng") is None:
        why = "espeak-ng is not installed (infra/setup.sh installs it)"
        if os.environ.get("CI") == "true":
            pytest.fail(f"{why}: CI must exercise the spoken clips")
        pytest.skip(why)
    return subprocess.run(
        ["espeak-ng", "--stdout", SPOKEN], capture_output=True, check=True, timeout=60
    ).stdout


@pytest.fixture(scope="module")
def extractor():
    from transformers import WhisperFeatureExtractor

    return WhisperFeatureExtractor()


def clip(name: str, speech: bytes) -> np.ndarray:
    """The 16 kHz samples of one parity case, as decode gives them."""
    if name == "speech":
        return decode(speech)
    if name == "speech, a full 30 s window":
        spoken = decode(speech)
        return decode(wav(np.resize(spoken, 30 * SAMPLE_RATE)))
    if name == "tone":
        t = np.arange(2 * SAMPLE_RATE) / SAMPLE_RATE
        return decode(wav((0.5 * np.sin(2 * np.pi * 440 * t)).astype(np.float32)))
    if name == "chirp, a full 30 s window":
        return decode(wav(chirp(SAMPLE_RATE, 30.0)[0]))
    return decode(wav(np.zeros(SAMPLE_RATE, np.float32)))  # silence


CLIPS = ["speech", "speech, a full 30 s window", "tone", "chirp, a full 30 s window", "silence"]


@pytest.mark.parametrize("name", CLIPS)
def test_features_are_the_extractors_input_features(name, extractor, request):
    speech = request.getfixturevalue("speech") if name.startswith("speech") else b""
    samples = clip(name, speech)
    if "30 s" in name:
        assert len(samples) == 30 * SAMPLE_RATE
    want = extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np").input_features[0]
    got = LogMel(extractor.to_dict()).features(samples)
    assert got.dtype == np.float32 and got.shape == want.shape == (80, 3000)
    assert np.abs(got - want).max() <= PARITY, name


def test_the_mel_filters_are_transformers_and_other_sizes_follow_the_config():
    from transformers import WhisperFeatureExtractor

    for size in (80, 128):  # 128 bins: large-v3 and turbo
        extractor = WhisperFeatureExtractor(feature_size=size)
        features = LogMel(extractor.to_dict())
        assert np.abs(features.mel_filters - extractor.mel_filters).max() <= 1e-6
        samples = decode(wav(chirp(SAMPLE_RATE, 4.0)[0]))
        want = extractor(samples, sampling_rate=SAMPLE_RATE, return_tensors="np")
        assert np.abs(features.features(samples) - want.input_features[0]).max() <= PARITY


def test_a_window_holds_30_s_and_a_longer_clip_is_for_the_caller_to_split(extractor):
    features = LogMel(extractor.to_dict())
    for clip_ in (chirp(SAMPLE_RATE, 1.0)[0], np.zeros(10, np.float32)):
        found = features.features(clip_)
        assert found.shape == (80, 3000) and found.dtype == np.float32
    with pytest.raises(ValueError, match="480,001 samples, over the 480,000 .* split it"):
        features.features(np.zeros(30 * SAMPLE_RATE + 1, np.float32))


def test_a_whole_long_clip_is_the_extractors_long_form_features(extractor, speech):
    """Past one window, the whole clip unpadded: what transformers' long-form decoding reads
    (`padding="longest"`, `truncation=False`), frame for frame, its mask all real frames."""
    samples = decode(wav(np.resize(decode(speech), 47 * SAMPLE_RATE + 77)))
    want = extractor(
        samples,
        sampling_rate=SAMPLE_RATE,
        return_tensors="np",
        truncation=False,
        padding="longest",
        return_attention_mask=True,
    )
    got = LogMel(extractor.to_dict()).whole(samples)
    assert got.shape == want.input_features[0].shape == (80, len(samples) // 160)
    assert int(want.attention_mask.sum()) == got.shape[1]
    assert np.abs(got - want.input_features[0]).max() <= PARITY


FORMATS = {
    # name: (container, codec, rate, channels, encoder options, samples of codec delay allowed)
    "wav": ("wav", "pcm_s16le", 16000, 1, {}, 0),
    "flac": ("flac", "flac", 16000, 1, {}, 0),
    "mp3": ("mp3", "libmp3lame", 16000, 1, {}, 1152),
    "ogg opus": ("ogg", "libopus", 48000, 1, {}, 320),
    # FFmpeg's own Vorbis encoder (there is no libvorbis in PyAV's wheel) is stereo only.
    "ogg vorbis": ("ogg", "vorbis", 44100, 2, {"strict": "experimental"}, 1024),
    "m4a aac": ("ipod", "aac", 16000, 1, {}, 1024),
    "webm opus": ("webm", "libopus", 48000, 2, {}, 320),
    "wav 8 kHz": ("wav", "pcm_s16le", 8000, 1, {}, 0),
    "wav 96 kHz": ("wav", "pcm_s16le", 96000, 1, {}, 0),
    "wav 44.1 kHz stereo": ("wav", "pcm_s16le", 44100, 2, {}, 0),
    "flac 48 kHz stereo": ("flac", "flac", 48000, 2, {}, 0),
}


@pytest.mark.parametrize("name", list(FORMATS))
def test_every_format_decodes_to_16_khz_mono_of_its_duration_and_level(name):
    fmt, codec, rate, channels, options, delay = FORMATS[name]
    samples = decode(encoded(chirp(rate, 3.0, channels), rate, fmt, codec, **options))
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert abs(len(samples) - 3 * SAMPLE_RATE) <= delay, len(samples)
    # Channels are averaged: a stereo file of one signal twice is that signal, at its level.
    rms = float(np.sqrt(np.mean(samples**2)))
    assert abs(rms - 0.3 / np.sqrt(2)) <= 0.02, rms
    if not delay:  # lossless: the sweep itself, resampled to 16 kHz (the resampler's filter
        # rings over the abrupt first and last 10 ms; 3e-5 measured between)
        inner = slice(SAMPLE_RATE // 100, -SAMPLE_RATE // 100)
        assert np.abs(samples - chirp(SAMPLE_RATE, 3.0)[0])[inner].max() <= 1e-3


def test_stereo_is_the_average_of_its_channels():
    left = chirp(SAMPLE_RATE, 1.0)[0]
    both = np.stack([left, np.zeros_like(left)])
    samples = decode(encoded(both, SAMPLE_RATE, "wav", "pcm_s16le"))
    assert np.abs(samples - left / 2).max() <= 1e-4


def wav_of_codec(tag: int) -> bytes:
    """A WAV whose format tag names a codec (0x4242: none FFmpeg knows)."""
    fmt = struct.pack("<HHIIHH", tag, 1, 16000, 32000, 2, 16)
    payload = bytes(3200)
    body = b"WAVEfmt " + struct.pack("<I", len(fmt)) + fmt + b"data"
    body += struct.pack("<I", len(payload)) + payload
    return b"RIFF" + struct.pack("<I", len(body)) + body


def empty_wav() -> bytes:
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(16000)
        w.writeframes(b"")
    return out.getvalue()


def png() -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (8, 8), "red").save(out, format="PNG")
    return out.getvalue()


def video_only() -> bytes:
    """Three black 16 x 16 frames of FFV1 in Matroska, no sound."""
    import av

    out = io.BytesIO()
    with av.open(out, mode="w", format="matroska") as container:
        stream = container.add_stream("ffv1", rate=5)
        stream.width, stream.height, stream.pix_fmt = 16, 16, "yuv420p"
        for i in range(3):
            frame = av.VideoFrame.from_ndarray(np.zeros((16, 16, 3), np.uint8), format="rgb24")
            frame.pts = i
            for packet in stream.encode(frame):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


def three_hours() -> bytes:
    """A 3-hour MP3 (10 s of 8 kbit/s sweep, its frames repeated; about 11 MB)."""
    ten = encoded(chirp(SAMPLE_RATE, 10.0), SAMPLE_RATE, "mp3", "libmp3lame", b="8k")
    return ten * 1080


REFUSED = {
    "empty": (lambda: b"", {}, r"empty \(0 bytes\)"),
    "random bytes": (lambda: np.random.default_rng(0).bytes(4000), {}, "not an audio file"),
    "a text file": (lambda: b"not audio\n" * 50, {}, "not an audio file"),
    "a wav cut in its header": (lambda: wav(chirp(SAMPLE_RATE, 1.0)[0])[:20], {}, "header"),
    "a png image": (png, {}, r"no audio stream \(it holds video\)"),
    "a video without sound": (video_only, {}, r"no audio stream \(it holds video\)"),
    "an unknown codec": (lambda: wav_of_codec(0x4242), {}, "codec is unsupported"),
    "no samples": (empty_wav, {}, r"zero-length \(it decodes to no samples\)"),
    "over max_seconds": (
        lambda: wav(chirp(SAMPLE_RATE, 3.0)[0]),
        {"max_seconds": 1.0},
        r"longer than 1 s \(decoding stopped at 1\.\d\d s\)",
    ),
    "over max_bytes": (
        lambda: wav(chirp(SAMPLE_RATE, 3.0)[0]),
        {"max_bytes": 1000},
        "96,078 bytes, over the 1,000",
    ),
    # A rate that would turn each sample into 160 at 16 kHz: refused before resampling.
    "a sample rate of 100 Hz": (
        lambda: wav(np.zeros(60_000, np.float32), rate=100),
        {},
        "sample rate is 100 Hz, outside 1,000 to 384,000 Hz",
    ),
    # Refused once 600 s are decoded, not after decoding the three hours.
    "three hours": (three_hours, {}, r"longer than 600 s \(decoding stopped at 600\.\d\d s\)"),
}


@pytest.mark.parametrize("name", list(REFUSED))
def test_bad_audio_is_refused_naming_why(name):
    make, limits, says = REFUSED[name]
    with pytest.raises(AudioRefused, match=says):
        decode(make(), **limits)
