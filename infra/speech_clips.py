"""Validation speech for the speech-recognition releases, synthesised at set-up with Debian's
espeak-ng from releases/data/speech-sentences.txt: nothing recorded, nothing downloaded.

    .venv/bin/python infra/speech_clips.py [OUT]     (default releases/data/speech)

OUT gets one clip per sentence in several voices and speeds (most as WAV at espeak-ng's 22.05 kHz,
some re-encoded with PyAV: FLAC at 16 kHz, MP3 at 22.05 kHz, Ogg/Opus at 48 kHz), two clips
past Whisper's 30 s window (about 45 s as WAV and 60 s as MP3, sentences one after another in one
voice), 2 s of silence, and transcripts.tsv (file name TAB reference text, no header; the
silence's text is empty). A run is written beside OUT and
renamed into place when complete, with a stamp of what made it (the sentences, this plan,
espeak-ng's and PyAV's versions): a rerun that finds the same stamp does nothing, and a killed
run never leaves a folder that looks finished."""

from __future__ import annotations

import argparse
import hashlib
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
SENTENCES = ROOT / "releases" / "data" / "speech-sentences.txt"
DEFAULT_OUT = ROOT / "releases" / "data" / "speech"
STAMP = ".complete"

VOICES = ("en-us", "en-gb", "en-us+f3", "en-gb+m3")
SPEEDS = (140, 175, 210)  # words per minute
# The sentences' formats, in turn (five, so that every voice and speed meets every format).
FORMATS = ("wav", "flac", "mp3", "wav", "opus")
# Format: (file suffix, PyAV container, PyAV codec, sample rate, bit rate).
ENCODINGS = {
    "flac": (".flac", "flac", "flac", 16000, None),
    "mp3": (".mp3", "mp3", "libmp3lame", 22050, 64000),
    "opus": (".ogg", "ogg", "libopus", 48000, 32000),
}
# The long clips: (name, voice, speed, first sentence, least seconds).
LONG = (("long-45s.wav", "en-us", 175, 0, 45.0), ("long-60s.mp3", "en-gb+m3", 160, 12, 60.0))
PAUSE_S = 0.4  # between the long clips' sentences


@dataclass(frozen=True)
class Clip:
    """One clip to make: its file name, what is said, and how."""

    name: str
    text: str
    voice: str
    speed: int


def espeak() -> str:
    """espeak-ng's path, or exit saying how to install it."""
    path = shutil.which("espeak-ng")
    if path is None:
        sys.exit(
            "speech_clips: espeak-ng is missing; install Debian's text-to-speech with "
            "`apt-get install espeak-ng` (infra/setup.sh does, as root)"
        )
    return path


def read_sentences(path: Path = SENTENCES) -> list[str]:
    """The shipped sentences: one a line, blank lines and `#` comments skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]


def plan(sentences: list[str]) -> list[Clip]:
    """One clip per sentence, voices, speeds and formats taken in turn."""
    clips = []
    for i, text in enumerate(sentences):
        voice, speed = VOICES[i % len(VOICES)], SPEEDS[i % len(SPEEDS)]
        fmt = FORMATS[i % len(FORMATS)]
        suffix = ENCODINGS[fmt][0] if fmt in ENCODINGS else ".wav"
        slug = voice.replace("+", "-")
        clips.append(Clip(f"{i + 1:02d}-{slug}-{speed}{suffix}", text, voice, speed))
    return clips


def synthesise(exe: str, text: str, voice: str, speed: int, work: Path) -> tuple[np.ndarray, int]:
    """espeak-ng's speech for `text`: 16-bit mono samples and their rate."""
    wav = work / "espeak.wav"
    run = subprocess.run(
        [exe, "-v", voice, "-s", str(speed), "-w", str(wav), text], capture_output=True, text=True
    )
    if run.returncode != 0 or not wav.exists():
        sys.exit(f"speech_clips: espeak-ng -v {voice} failed ({run.returncode}): {run.stderr}")
    with wave.open(str(wav)) as w:
        rate, frames = w.getframerate(), w.readframes(w.getnframes())
    wav.unlink()
    return np.frombuffer(frames, dtype="<i2"), rate


def write_wav(path: Path, pcm: np.ndarray, rate: int) -> None:
    """16-bit mono PCM as a plain WAV file."""
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.astype("<i2").tobytes())


def write_encoded(path: Path, pcm: np.ndarray, rate: int, fmt: str) -> None:
    """16-bit mono PCM encoded with PyAV as `fmt` (a key of ENCODINGS), resampled to its rate;
    bit-exact muxing, so that no random stream serial or version string changes the bytes."""
    import av

    _, container, codec, out_rate, bit_rate = ENCODINGS[fmt]
    with av.open(str(path), "w", format=container, options={"fflags": "+bitexact"}) as out:
        stream = out.add_stream(codec, rate=out_rate, layout="mono")
        if bit_rate:
            stream.bit_rate = bit_rate
        stream.codec_context.options = {"flags": "+bitexact"}
        frame = av.AudioFrame.from_ndarray(pcm.astype("<i2")[None, :], format="s16", layout="mono")
        frame.sample_rate = rate
        frame.pts = 0
        for packet in stream.encode(frame):
            out.mux(packet)
        for packet in stream.encode(None):
            out.mux(packet)


def write_clip(path: Path, pcm: np.ndarray, rate: int) -> None:
    """The clip in the format its file name's suffix says."""
    fmt = next((f for f, e in ENCODINGS.items() if e[0] == path.suffix), None)
    if fmt is None:
        write_wav(path, pcm, rate)
    else:
        write_encoded(path, pcm, rate, fmt)


def long_clip(exe: str, sentences: list[str], spec: tuple, work: Path) -> tuple[str, float]:
    """Sentences from `spec`'s first on, one voice, until the clip is `spec`'s length; written
    to `work`. Returns the text said and the clip's seconds."""
    name, voice, speed, first, least_s = spec
    parts, said, rate, seconds = [], [], 22050, 0.0
    for k in range(len(sentences)):
        text = sentences[(first + k) % len(sentences)]
        pcm, rate = synthesise(exe, text, voice, speed, work)
        parts += [pcm, np.zeros(int(PAUSE_S * rate), dtype="<i2")]
        said.append(text)
        seconds = sum(len(p) for p in parts) / rate
        if seconds >= least_s:
            break
    write_clip(work / name, np.concatenate(parts), rate)
    return " ".join(said), seconds


def make(out_dir: Path, sentences: list[str]) -> list[tuple[str, str, float]]:
    """Every clip and transcripts.tsv in `out_dir`; (name, text, seconds) of each."""
    exe = espeak()
    made = []
    for clip in plan(sentences):
        pcm, rate = synthesise(exe, clip.text, clip.voice, clip.speed, out_dir)
        write_clip(out_dir / clip.name, pcm, rate)
        made.append((clip.name, clip.text, len(pcm) / rate))
    for spec in LONG:
        text, seconds = long_clip(exe, sentences, spec, out_dir)
        made.append((spec[0], text, seconds))
    write_wav(out_dir / "silence-2s.wav", np.zeros(32000, dtype="<i2"), 16000)
    made.append(("silence-2s.wav", "", 2.0))
    rows = "".join(f"{name}\t{text}\n" for name, text, _ in made)
    (out_dir / "transcripts.tsv").write_text(rows, encoding="utf-8")
    return made


def stamp(sentences: list[str]) -> str:
    """What the clips are made from: a new stamp means the folder is made again."""
    import av

    version = subprocess.run([espeak(), "--version"], capture_output=True, text=True).stdout
    recipe = repr((sentences, VOICES, SPEEDS, FORMATS, ENCODINGS, LONG, PAUSE_S))
    recipe += version + av.__version__ + Path(__file__).read_text(encoding="utf-8")
    return hashlib.sha256(recipe.encode()).hexdigest()


def up_to_date(out: Path, want: str) -> bool:
    """Whether `out` was made from `want`'s stamp and still has every clip it lists."""
    if not (out / STAMP).exists() or (out / STAMP).read_text().strip() != want:
        return False
    rows = (out / "transcripts.tsv").read_text(encoding="utf-8").splitlines()
    return all((out / row.split("\t")[0]).is_file() for row in rows)


def build(out: Path = DEFAULT_OUT, sentences_path: Path = SENTENCES) -> bool:
    """Make `out` unless it is complete and up to date; True when it was made."""
    sentences = read_sentences(sentences_path)
    want = stamp(sentences)
    if up_to_date(out, want):
        return False
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}-partial-*"):
        if time.time() - stale.stat().st_mtime > 600:  # a run takes seconds: this one was killed
            shutil.rmtree(stale, ignore_errors=True)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}-partial-", dir=out.parent))
    try:
        work.chmod(0o755)
        made = make(work, sentences)
        (work / STAMP).write_text(want + "\n")
        if out.exists():
            shutil.rmtree(out)
        work.rename(out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for name, _, seconds in made:
        print(f"  {name:28s} {seconds:5.1f} s", file=sys.stderr)
    return True


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", nargs="?", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--sentences", type=Path, default=SENTENCES)
    args = parser.parse_args(argv)
    started = time.monotonic()
    made = build(args.out, args.sentences)
    state = "made" if made else "up to date"
    print(f"speech clips: {args.out} {state} ({time.monotonic() - started:.1f} s)", file=sys.stderr)


if __name__ == "__main__":
    main()
