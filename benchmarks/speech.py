"""A speech recogniser released with `hf2triton release` (`task: automatic-speech-recognition`)
and measured on real speech files of mixed lengths, as ratios in one run: a Whisper of
openai/whisper-tiny.en's exact shape (d_model 384, 4 encoder and 4 decoder layers of 6 heads,
feed-forward 1,536, 80 mel bins, 1,500 encoder and 448 decoder positions), random weights (the
hub is out of reach here), with the small Whisper tokenizer of tests/tiny_models (Whisper's own
code and special tokens, a byte-level vocabulary of ~1,900 tokens instead of 51,864: the output
layer is smaller than the real one's, the rest of the work the same). `speech.max_new_tokens`
is fixed (96) so that every engine does bounded work; the served, in-process and PyTorch sides
decode greedily and write the same tokens (the gate checks that):

- audio seconds transcribed per second (the inverse real-time factor), one clip a gRPC request,
  closed loop, 1 and 8 clients, against the same version directory's serving core in-process
  (`hf2triton.serving.load(version_dir).answer`, the same runtime, precision and code: decode,
  log-mel, encoder, greedy decoder, long clips window after window) in dynamic batches of 8
  requests;
- served against PyTorch `generate` (transformers, hf2triton.kinds.speech_recognition.
  TorchWhisper: clips of one window in batches of 8, longer clips alone with their attention
  mask and `return_timestamps=True`, as transformers transcribes long-form);
- p50/p99 latency of a clip of about 5 s at 1 client;
- the candidate the gate shipped, and each candidate's figures from the validation report;
- with `--faster-whisper`: the peer faster-whisper (PyPI faster-whisper 1.2.1 on CTranslate2)
  transcribing the same clips with 8 clients (threads on one `WhisperModel`, `num_workers=8`),
  on the same model directory converted by CTranslate2's converter at the shipped precision
  (int8 for an int8 candidate, else float32): greedy, `temperature=0`, no VAD, no conditioning
  on the previous window, the same `max_new_tokens` (its own decoding rules otherwise, so its
  token counts may differ from the others'). ctranslate2 and faster-whisper (without
  their dependencies, which .venv has) are installed with `pip install --target .cache/ct2` and
  run with .venv's python in a child process with .cache/ct2 on PYTHONPATH (the converter needs
  torch and transformers, the peer av, tokenizers and onnxruntime: all .venv's).

Traffic: the repository's validation speech (releases/data/speech: espeak-ng, several voices and
speeds, WAV/FLAC/MP3/OGG, made by infra/speech_clips.py), 2.6 s to 62 s, silence left out, drawn
at random: the same list for every side.

    .venv/bin/python benchmarks/speech.py [--seconds 15] [--quiet-wait 600] [--faster-whisper]
        [--runtime openvino-genai:fp32]

`--runtime` releases on one candidate (runtime and precision) instead of the spec's search, to
measure a candidate the gate would not ship on these random weights (OpenVINO GenAI's
WhisperPipeline: one clip a call, its own log-mel and decoding loop in C++).

Writes benchmarks/results/speech-<UTC time>.{json,md}. Everything runs on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import harness as bench  # noqa: E402
from images import gate_figures  # noqa: E402
from load import CpuMeter, TritonGrpc  # noqa: E402
from runtimes import cpu_flags  # noqa: E402

from hf2triton.release.load import closed_loop  # noqa: E402
from hf2triton.util.net import free_ports  # noqa: E402

SPEECH = ROOT / "releases" / "data" / "speech"
MODEL_NAME = "whisper-tiny-en"
BATCH = 8
CLIENTS = (1, 8)
MAX_NEW_TOKENS = 96
SHORT_S = 5.0  # the latency clip's length, about
# pip install --target .cache/ct2 --no-deps ctranslate2 faster-whisper==1.2.1
CT2 = ROOT / ".cache" / "ct2"
PEER = "faster-whisper 1.2.1"

Clip = tuple[bytes, float]  # an audio file and its length in seconds
# openai/whisper-tiny.en's sizes (transformers' default init_std: its own random weights).
WHISPER_TINY_EN = {
    "d_model": 384,
    "encoder_layers": 4,
    "decoder_layers": 4,
    "encoder_attention_heads": 6,
    "decoder_attention_heads": 6,
    "encoder_ffn_dim": 1536,
    "decoder_ffn_dim": 1536,
}


def build_whisper_tiny_en(out: Path) -> Path:
    """openai/whisper-tiny.en's shape (39M parameters but for the output layer), random, with
    tests/tiny_models' tokenizer and whisper-tiny.en's generation config on its ids."""
    from tests.tiny_models import build_tiny_whisper

    return build_tiny_whisper(out, seed=0, sizes=WHISPER_TINY_EN)


def speech_files() -> list[Path]:
    from hf2triton.kinds.modality import AUDIO_SUFFIXES

    found = sorted(p for p in SPEECH.iterdir() if p.suffix in AUDIO_SUFFIXES)
    return [p for p in found if not p.name.startswith("silence")]


def traffic(n: int = 300) -> tuple[list[Clip], Clip, dict[str, float]]:
    """`n` clips drawn at random from the validation speech, the clip nearest SHORT_S, and what
    the drawn list holds."""
    from hf2triton.serving.audio import decode

    pool = [(p.read_bytes(), 0.0) for p in speech_files()]
    pool = [(b, len(decode(b)) / 16000) for b, _ in pool]
    drawn = random.Random(0).choices(pool, k=n)
    short = min(pool, key=lambda c: abs(c[1] - SHORT_S))
    lengths = np.array([s for _, s in drawn])
    return (
        drawn,
        short,
        {
            "files": len(pool),
            "shortest_s": round(min(s for _, s in pool), 2),
            "longest_s": round(max(s for _, s in pool), 2),
            "mean_s": round(float(lengths.mean()), 2),
            "share_over_30s": round(float((lengths > 30).mean()), 3),
            "latency_clip_s": round(short[1], 2),
        },
    )


def spec_file(path: Path, model: Path, ports: dict, runtime: str | None) -> Path:
    """releases/whisper-tiny-en.yaml on the random model; the gate judges against PyTorch
    alone (random weights say nothing like the sentences spoken). `runtime` ("name" or
    "name:precision") releases on that candidate alone, not the spec's search."""
    spec = yaml.safe_load((ROOT / "releases" / "whisper-tiny-en.yaml").read_text())
    if runtime:
        name, _, precision = runtime.partition(":")
        spec["runtime"] = {"candidates": [{"name": name, "precision": precision or "fp32"}]}
    spec["source"] = {"path": str(model), "model_id": f"random/{model.name}"}
    spec["validation"]["audio"] = str(SPEECH)
    spec["speech"]["max_new_tokens"] = MAX_NEW_TOKENS
    spec["speech"]["thresholds"] = {"max_wer": spec["speech"]["thresholds"]["max_wer"]}
    spec["deploy"].update(ports)
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def audio_inputs(data: bytes) -> dict[str, np.ndarray]:
    return {"AUDIO": np.array([[data]], dtype=np.object_)}


class Timed(CpuMeter):
    """The CPU meter, also noting when the measured window opened and closed."""

    def start(self) -> None:
        super().start()
        self.opened = time.monotonic()

    def stop(self) -> None:
        super().stop()
        self.closed = time.monotonic()


class AudioClient:
    """One clip a gRPC request; notes when each was answered and how long its audio was."""

    def __init__(self, url: str):
        self.grpc = TritonGrpc(
            url,
            MODEL_NAME,
            output="DURATION",
            inputs=audio_inputs,  # type: ignore[arg-type] # audio, not texts
        )
        self.answered: list[tuple[float, float]] = []

    async def __call__(self, clip: Clip) -> None:
        await self.grpc(clip[0])  # type: ignore[arg-type] # audio bytes, not a text
        self.answered.append((time.monotonic(), clip[1]))

    async def close(self) -> None:
        await self.grpc.close()


def served(url: str, clips: list[Clip], clients: int, seconds: float, pid: int | None) -> dict:
    """A closed loop of `clients` over `clips`: audio seconds per second, requests per second,
    latency, the CPU used."""

    async def main() -> tuple[Any, Timed, AudioClient]:
        client, meter = AudioClient(url), Timed(pid)
        try:
            r = await closed_loop(
                client, clips, clients, seconds, min(4.0, seconds / 2), None, 120.0, meter
            )
        finally:
            await client.close()
        return r, meter, client

    r, meter, client = asyncio.run(main())
    audio = sum(s for t, s in client.answered if meter.opened <= t <= meter.closed)
    point = {
        "audio_s_per_s": audio / r.seconds,
        "rps": r.rps,
        "p50_ms": r.p50_ms,
        "p99_ms": r.p99_ms,
        "requests": r.requests,
        "errors": r.errors,
        "first_error": r.failures[0] if r.failures else None,
        **meter.cores(r.seconds),  # and who else used the machine meanwhile
    }
    bench.log(
        f"  served @{clients}: {point['audio_s_per_s']:.1f} audio s/s, {r.rps:.2f} req/s, "
        f"p50 {r.p50_ms:.0f} ms, p99 {r.p99_ms:.0f} ms, {r.errors} errors"
    )
    return point


def rate(run: Callable[[list[bytes]], Any], clips: list[Clip], seconds: float) -> dict:
    """Audio seconds per second of `run(batch)` over batches of BATCH clips in the list's order,
    for `seconds` after one warm-up batch."""
    run([b for b, _ in clips[:BATCH]])
    audio, batches, i = 0.0, 0, BATCH
    started = time.perf_counter()
    while time.perf_counter() - started < seconds:
        part = [clips[(i + k) % len(clips)] for k in range(BATCH)]
        run([b for b, _ in part])
        audio, batches, i = audio + sum(s for _, s in part), batches + 1, i + BATCH
    wall = time.perf_counter() - started
    return {"audio_s_per_s": audio / wall, "batches": batches, "seconds": round(wall, 1)}


def in_process(version_dir: Path, clips: list[Clip], seconds: float) -> dict:
    """The served version's serving core, dynamic batches of BATCH requests."""
    from hf2triton import serving

    model = serving.load(str(version_dir))
    found = rate(lambda part: model.answer([audio_inputs(b) for b in part]), clips, seconds)
    bench.log(f"  in-process: {found['audio_s_per_s']:.1f} audio s/s")
    return found


def pytorch(model_dir: Path, clips: list[Clip], seconds: float) -> dict:
    """transformers' greedy `generate` (TorchWhisper): windows in batches of BATCH, long clips
    alone, long-form."""
    from hf2triton.kinds.speech_recognition import SpeechRecognitionKind, SpeechSpec, TorchWhisper

    options = SpeechSpec(max_new_tokens=MAX_NEW_TOKENS)
    kind = SpeechRecognitionKind(options, None)  # type: ignore[arg-type] # no validation data
    whisper = TorchWhisper(model_dir, kind.resolve(str(model_dir)))
    found = rate(lambda part: whisper.transcribe(part, size=BATCH), clips, seconds)
    bench.log(f"  PyTorch generate: {found['audio_s_per_s']:.1f} audio s/s")
    return found


def with_ct2(args: list[str], seconds: float) -> str:
    """`args` run by .venv's python with .cache/ct2 on PYTHONPATH; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(CT2), "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=seconds
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{args[:3]} failed:\n{proc.stderr[-3000:]}")
    return proc.stdout


def faster_whisper(model: Path, out: Path, shipped: str, seconds: float) -> dict:
    """The model directory converted by CTranslate2's converter at the shipped precision, then
    faster-whisper on it in a child process (this script's --peer-worker)."""
    precision = "int8" if "int8" in shipped else "float32"
    converter = "ctranslate2.converters.transformers"
    copy = ["tokenizer.json", "preprocessor_config.json"]
    convert = ["-m", converter, "--model", str(model), "--output_dir", str(out)]
    with_ct2([*convert, "--quantization", precision, "--copy_files", *copy], 600)
    worker = [__file__, "--peer-worker", str(out), "--compute-type", precision]
    found = json.loads(with_ct2([*worker, "--seconds", str(seconds)], 600).splitlines()[-1])
    bench.log(f"  {PEER} @8: {found['audio_s_per_s']:.1f} audio s/s ({precision})")
    return {"package": PEER, "compute_type": precision, **found}


def peer_worker(ct2_dir: str, compute_type: str, seconds: float) -> None:
    """(In the child process) 8 closed-loop clients (threads) transcribing the traffic's clips
    in turn with one faster-whisper WhisperModel: the audio seconds answered inside a window of
    `seconds`, per second, after a warm-up round."""
    import io
    import itertools
    from concurrent.futures import ThreadPoolExecutor

    from faster_whisper import WhisperModel  # type: ignore[import-not-found] # in .cache/ct2

    clips, _, _ = traffic()
    model = WhisperModel(ct2_dir, device="cpu", compute_type=compute_type, num_workers=8)
    options: dict[str, Any] = {"beam_size": 1, "temperature": 0.0, "vad_filter": False}
    options.update(condition_on_previous_text=False, max_new_tokens=MAX_NEW_TOKENS)
    turn, answered = itertools.count(), []

    def one(clip: Clip) -> None:
        segments, _ = model.transcribe(io.BytesIO(clip[0]), language="en", **options)
        "".join(s.text for s in segments)

    def client(until: float) -> None:
        while time.monotonic() < until:
            clip = clips[next(turn) % len(clips)]
            one(clip)
            answered.append((time.monotonic(), clip[1]))

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, clips[:8]))
        opened = time.monotonic()
        list(pool.map(client, [opened + seconds] * 8))
    audio = [s for t, s in answered if t <= opened + seconds]
    found = {"audio_s_per_s": sum(audio) / seconds, "requests": len(audio), "clients": 8}
    print(json.dumps(found))


def arguments() -> argparse.Namespace:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=15)
    ap.add_argument("--quiet-wait", type=float, default=600)
    ap.add_argument("--faster-whisper", action="store_true", help="measure the peer too")
    ap.add_argument("--runtime", help="release on this candidate alone, e.g. openvino-genai:fp32")
    ap.add_argument("--peer-worker", help=argparse.SUPPRESS)  # the peer's child process
    ap.add_argument("--compute-type", default="float32", help=argparse.SUPPRESS)
    return ap.parse_args()


def main() -> None:
    args = arguments()
    if args.peer_worker:
        return peer_worker(args.peer_worker, args.compute_type, args.seconds)
    quiet = bench.wait_for_quiet(max_wait_s=args.quiet_wait) if args.quiet_wait else {}
    clips, short, described = traffic()
    cli = [str(ROOT / ".venv" / "bin" / "hf2triton")]
    with tempfile.TemporaryDirectory(prefix="hf2triton-speech-") as tmp_name:
        tmp, home = Path(tmp_name), Path(tmp_name) / "home"
        model = build_whisper_tiny_en(tmp / "whisper-tiny.en-shape")
        http, grpc, metrics, openai = free_ports(4)
        ports: dict[str, Any] = {"http_port": http, "grpc_port": grpc, "metrics_port": metrics}
        ports["openai"] = {"port": openai}
        spec = spec_file(tmp / "spec.yaml", model, ports, args.runtime)
        summary, release_s = bench.release(cli, spec, home, ROOT)
        bench.log(f"released {summary['variant']} in {release_s:.0f} s")
        try:
            pid, at = bench.server_pid(home), f"127.0.0.1:{grpc}"
            points = {n: served(at, clips, n, args.seconds, pid) for n in CLIENTS}
            latency = served(at, [short], 1, args.seconds / 2, pid)
            version = home / "triton" / "models" / MODEL_NAME / str(summary["mlflow"]["version"])
            candidates = gate_figures(home)
        finally:
            bench.stop_server(cli, home, ROOT)
        limit = in_process(version, clips, args.seconds)
        torch_rate = pytorch(model, clips, args.seconds)
        peer: dict | None = None
        if args.faster_whisper:
            peer = faster_whisper(model, tmp / "ct2", summary["variant"], args.seconds)
    measured: dict[str, Any] = {"points": points, "latency": latency, "limit": limit}
    measured.update(torch=torch_rate, peer=peer)
    path = write_record(summary, release_s, candidates, measured, {**described, "quiet": quiet})
    bench.log(f"wrote {path}")


def write_record(
    summary: dict, release_s: float, candidates: dict, measured: dict, described: dict
) -> Path:
    """The record (JSON) and its summary (Markdown, printed) under benchmarks/results."""
    points, latency = measured["points"], measured["latency"]
    limit, torch_rate = measured["limit"]["audio_s_per_s"], measured["torch"]["audio_s_per_s"]
    ratios = {f"served_{n}_over_in_process": points[n]["audio_s_per_s"] / limit for n in CLIENTS}
    ratios.update(
        {f"served_{n}_over_pytorch": points[n]["audio_s_per_s"] / torch_rate for n in CLIENTS}
    )
    peer = measured["peer"]
    if peer:
        ratios["served_8_over_faster_whisper"] = points[8]["audio_s_per_s"] / peer["audio_s_per_s"]
    record: dict[str, Any] = {
        "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "cpu": cpu_flags(),
        "command": "benchmarks/speech.py " + " ".join(sys.argv[1:]),
        "traffic": described,
        "max_new_tokens": MAX_NEW_TOKENS,
        "shipped": summary["variant"],
        # its WER against PyTorch generate's transcripts (and the spoken words'), at the gate
        # and in the smoke test
        "shipped_metrics": summary["metrics"],
        "candidates": candidates,
        "release_s": round(release_s, 1),
        "served": points,
        "latency_short_clip_1_client": latency,
        "in_process": measured["limit"],
        "pytorch_generate": measured["torch"],
        "peer": peer,
        "ratios": ratios,
        "goals": {"served_over_in_process": 0.8, "served_over_pytorch": 3.0},
    }
    lines = [
        f"# Speech: {MODEL_NAME} shape (random weights), {summary['variant']} shipped",
        "",
        "| | audio s/s | p50 ms | p99 ms |",
        "|---|---|---|---|",
        *(
            f"| served, {n} clients | {p['audio_s_per_s']:.1f} | {p['p50_ms']:.0f} | "
            f"{p['p99_ms']:.0f} |"
            for n, p in points.items()
        ),
        f"| served, {described['latency_clip_s']:.1f} s clip, 1 client | "
        f"{latency['audio_s_per_s']:.1f} | {latency['p50_ms']:.0f} | {latency['p99_ms']:.0f} |",
        f"| in-process, batches of {BATCH} | {limit:.1f} | | |",
        f"| PyTorch generate, batches of {BATCH} | {torch_rate:.1f} | | |",
        *(
            [f"| {PEER} ({peer['compute_type']}), 8 clients | {peer['audio_s_per_s']:.1f} | | |"]
            if peer
            else []
        ),
        "",
        "; ".join(f"{k}: {v:.2f}" for k, v in ratios.items())
        + " (goals: served / in-process >= 0.8, served / PyTorch >= 3)",
    ]
    print("\n".join(lines))
    return bench.save_record("speech", record, lines)


if __name__ == "__main__":
    main()
