"""Encoded audio files to Whisper's log-mel input features, as its Hugging Face feature extractor
makes them: the one implementation the gate and Triton share for audio kinds.

`decode` opens what a client sends (WAV, FLAC, MP3, OGG with Vorbis or Opus, M4A/AAC, WebM) with
PyAV (FFmpeg's libraries), refusing what is not audio of a sane size and length (AudioRefused,
naming why), and resamples its first audio stream to 16 kHz float32 as it decodes, averaging the
channels to mono (as Whisper's own loaders do), so that any rate and layout come out alike and an
over-long file is refused as soon as its limit is passed, not after decoding it whole.

`LogMel` is `WhisperFeatureExtractor` in numpy, built from the model's preprocessor_config.json:
the slaney mel filter bank, a periodic Hann window over frames reflect-padded by n_fft // 2, the
power spectrum, log10 floored at 1e-10 and clamped at the clip's maximum less 8, then
(x + 4) / 4, on a clip zero-padded to the window's 30 s (the caller splits longer audio).
tests/serving/test_audio.py holds the features to the extractor's `input_features` (its torch
path, which PyTorch references get) on speech, tones, silence and a full window, and the decoding
to each format's duration.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from typing import Any

import numpy as np

SAMPLE_RATE = 16000  # what every Whisper checkpoint hears
FORMATS = "WAV, FLAC, MP3, OGG (Vorbis or Opus), M4A (AAC) or WebM"
# Sample rates a clip may have: a lower one turns each sample into thousands at 16 kHz.
MIN_RATE, MAX_RATE = 1_000, 384_000
MEL_FLOOR = 1e-10  # the power under which log10 is not taken
MAX_FREQUENCY = 8000.0  # transformers' filter bank stops here whatever the rate


class AudioRefused(ValueError):
    """An input that is not one audio file the served path takes; the message says why and what
    to send instead."""


def decode(data: bytes, max_seconds: float = 600.0, max_bytes: int = 50_000_000) -> np.ndarray:
    """The float32 mono 16 kHz samples (1-D) of the first audio stream in `data` (an encoded
    file); AudioRefused when it is empty, too large, not audio, damaged, of a codec there is no
    decoder for, silent of samples, or longer than `max_seconds`."""
    if not data:
        raise AudioRefused(f"the audio is empty (0 bytes): send an encoded audio file ({FORMATS})")
    if len(data) > max_bytes:
        raise AudioRefused(
            f"the audio file is {len(data):,} bytes, over the {max_bytes:,} this model takes: "
            "send a shorter or more compressed file"
        )
    import av

    try:
        container = av.open(io.BytesIO(data), metadata_errors="ignore")
    except av.FFmpegError as exc:
        raise AudioRefused(
            f"not an audio file FFmpeg can read, or its header is damaged or cut short "
            f"({exc.strerror or exc}): send {FORMATS} bytes"
        ) from None
    with container:
        stream = audio_stream(container)
        mono = Mono(limit=int(max_seconds * SAMPLE_RATE))
        damaged = mono.decode(container, stream)
    if not mono.count and damaged:
        raise AudioRefused(
            f"the audio is zero-length: none of it decodes ({damaged} damaged packets): send it "
            f"whole, or re-encode it as {FORMATS}"
        )
    if not mono.count:
        raise AudioRefused("the audio is zero-length (it decodes to no samples): send a clip")
    return np.concatenate(mono.chunks)


def audio_stream(container: Any) -> Any:
    """The container's first audio stream, refused when there is none or it has no decoder."""
    streams = container.streams
    if not streams.audio:
        found = " and ".join(sorted({s.type for s in streams})) or "no streams at all"
        raise AudioRefused(f"the file has no audio stream (it holds {found}): send {FORMATS} audio")
    stream = streams.audio[0]
    if stream.codec_context is None:
        raise AudioRefused(
            "the audio's codec is unsupported (there is no decoder for it here): re-encode it "
            f"as {FORMATS}"
        )
    return stream


class Mono:
    """Decoded frames resampled to 16 kHz float32 as they come and averaged to mono (a new
    resampler whenever the frames' format, layout or rate changes), refused once more than
    `limit` samples are in."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.chunks: list[np.ndarray] = []
        self.count = 0
        self._resampler: Any = None
        self._setup: tuple[str, str, int] | None = None

    def decode(self, container: Any, stream: Any) -> int:
        """Decodes `stream` to its end; the number of packets skipped as damaged (as
        faster-whisper's `decode_audio` skips them)."""
        import av

        damaged = 0
        try:
            for packet in container.demux(stream):
                try:
                    frames = packet.decode()
                except av.error.InvalidDataError:
                    damaged += 1
                    continue
                for frame in frames:
                    self.add(frame)
        except av.error.DecoderNotFoundError:
            raise AudioRefused(
                f"the audio's codec is unsupported (no decoder for it here): re-encode it as "
                f"{FORMATS}"
            ) from None
        except av.FFmpegError as exc:
            raise AudioRefused(
                f"the audio file is damaged ({exc.strerror or exc}) after "
                f"{self.count / SAMPLE_RATE:.1f} s: send it whole"
            ) from None
        self.flush()
        return damaged

    def add(self, frame: Any) -> None:
        import av

        rate = int(frame.sample_rate or 0)
        if not MIN_RATE <= rate <= MAX_RATE:
            raise AudioRefused(
                f"the audio's sample rate is {rate:,} Hz, outside {MIN_RATE:,} to {MAX_RATE:,} "
                "Hz: re-encode it at a usual rate (16, 44.1 or 48 kHz)"
            )
        # Checked before resampling: a frame of a low rate becomes many samples at 16 kHz.
        if self.count + frame.samples * SAMPLE_RATE / rate > self.limit:
            self.refuse(self.count + int(frame.samples * SAMPLE_RATE / rate))
        setup = (frame.format.name, frame.layout.name, frame.sample_rate)
        if setup != self._setup:
            self.flush()
            # The frames' own layout, averaged below: FFmpeg's float downmix to mono sums
            # stereo at 0.707 each (1.41 x the level); Whisper's loaders (s16) average.
            self._resampler = av.AudioResampler(format="fltp", rate=SAMPLE_RATE)
            self._setup = setup
        self.keep(self._resampler.resample(frame))

    def flush(self) -> None:
        if self._resampler is not None:
            self.keep(self._resampler.resample(None))

    def keep(self, frames: list[Any]) -> None:
        for frame in frames:
            samples = frame.to_ndarray().mean(axis=0, dtype=np.float32)  # (channels, n)
            self.chunks.append(samples)
            self.count += len(samples)
            if self.count > self.limit:
                self.refuse(self.count)

    def refuse(self, count: int) -> None:
        """The clip is over the limit: `count` samples in (or about to be)."""
        raise AudioRefused(
            f"the audio is longer than {self.limit / SAMPLE_RATE:g} s (decoding stopped at "
            f"{count / SAMPLE_RATE:.2f} s): send a shorter clip or split it"
        )


def slaney_mel_filters(n_fft: int, n_mels: int, sampling_rate: int) -> np.ndarray:
    """The (1 + n_fft // 2, n_mels) slaney-scale, slaney-normalised triangular filters from 0 to
    8 kHz: transformers' `mel_filter_bank(..., norm="slaney", mel_scale="slaney")`."""
    mels = np.linspace(hertz_to_mel(0.0), hertz_to_mel(MAX_FREQUENCY), n_mels + 2)
    edges = mel_to_hertz(mels)
    bins = np.linspace(0, sampling_rate // 2, 1 + n_fft // 2)
    slopes = edges[None, :] - bins[:, None]
    widths = np.diff(edges)
    down = -slopes[:, :-2] / widths[:-1]
    up = slopes[:, 2:] / widths[1:]
    filters = np.maximum(0.0, np.minimum(down, up))
    return filters * (2.0 / (edges[2:] - edges[:-2]))[None, :]


def hertz_to_mel(hertz: np.ndarray | float) -> np.ndarray:
    """Slaney's mel scale: linear to 1 kHz (15 mels), logarithmic above."""
    hertz = np.asarray(hertz, dtype=np.float64)
    linear = 3.0 * hertz / 200.0
    above = 15.0 + np.log(np.maximum(hertz, 1e-12) / 1000.0) * (27.0 / np.log(6.4))
    return np.where(hertz >= 1000.0, above, linear)


def mel_to_hertz(mels: np.ndarray) -> np.ndarray:
    linear = 200.0 * mels / 3.0
    above = 1000.0 * np.exp((np.log(6.4) / 27.0) * (mels - 15.0))
    return np.where(mels >= 15.0, above, linear)


class LogMel:
    """Whisper's log-mel features from its preprocessor_config.json (`feature_size`,
    `sampling_rate`, `hop_length`, `n_fft`, `n_samples` or `chunk_length`; transformers' defaults
    for any missing). `dither` is not applied: Whisper's checkpoints set it to 0."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        self.feature_size = int(config.get("feature_size", 80))
        self.sampling_rate = int(config.get("sampling_rate", SAMPLE_RATE))
        self.hop_length = int(config.get("hop_length", 160))
        self.n_fft = int(config.get("n_fft", 400))
        chunk = config.get("chunk_length", 30)
        self.n_samples = int(config.get("n_samples") or chunk * self.sampling_rate)
        self.frames = self.n_samples // self.hop_length
        self.mel_filters = slaney_mel_filters(self.n_fft, self.feature_size, self.sampling_rate)
        # Periodic Hann, as torch.hann_window and transformers' window_function(periodic=True).
        self.window = np.hanning(self.n_fft + 1)[:-1]

    def features(self, wave: np.ndarray) -> np.ndarray:
        """The float32 (feature_size, n_samples // hop_length) features of a mono clip at
        `sampling_rate` of at most n_samples, zero-padded to n_samples; ValueError when longer."""
        wave = np.asarray(wave, dtype=np.float32)
        if wave.ndim != 1:
            raise ValueError(f"a clip is one channel of samples (1-D), not shape {wave.shape}")
        if len(wave) > self.n_samples:
            raise ValueError(
                f"the clip is {len(wave):,} samples, over the {self.n_samples:,} one window "
                "holds: split it first"
            )
        padded = np.zeros(self.n_samples, dtype=np.float64)
        padded[: len(wave)] = wave
        return self._log_mel(padded)

    def whole(self, wave: np.ndarray) -> np.ndarray:
        """The float32 (feature_size, len(wave) // hop_length) features of a whole clip of any
        length, unpadded: what the feature extractor gives for long-form decoding
        (`padding="longest"`, `truncation=False`), one clip at a time."""
        wave = np.asarray(wave, dtype=np.float32)
        if wave.ndim != 1 or len(wave) < self.n_fft:
            raise ValueError(f"a clip is one channel of at least {self.n_fft} samples")
        return self._log_mel(wave.astype(np.float64))

    def _log_mel(self, samples: np.ndarray) -> np.ndarray:
        half = self.n_fft // 2
        signal = np.pad(samples, half, mode="reflect")
        frames = np.lib.stride_tricks.sliding_window_view(signal, self.n_fft)[:: self.hop_length]
        count = len(samples) // self.hop_length  # the STFT's last frame dropped
        log_spec = np.empty((self.feature_size, count), dtype=np.float64)
        for start in range(0, count, self.frames):  # a window's frames at a time: bounded memory
            stop = min(count, start + self.frames)
            spectrum = np.fft.rfft(frames[start:stop] * self.window, axis=-1)
            power = spectrum.real**2 + spectrum.imag**2
            log_spec[:, start:stop] = np.log10(np.maximum(power @ self.mel_filters, MEL_FLOOR)).T
        log_spec = np.maximum(log_spec, log_spec.max() - 8.0)
        return ((log_spec + 4.0) / 4.0).astype(np.float32)
