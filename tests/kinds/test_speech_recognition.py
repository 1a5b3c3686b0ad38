"""Kind `speech_recognition` (task: automatic-speech-recognition) end to end on a tiny
random-weight Whisper: encoder, decoder and decoder-with-past exported, the gate's word error
rate against PyTorch `generate` (greedy) on speech synthesised at set-up (releases/data/speech:
espeak-ng, several voices and speeds, WAV, FLAC, MP3 and Ogg/Opus files), MLflow (SQLite) and a
real Triton server on free ports. Clients send audio files and get PyTorch's transcripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from hf2triton.kinds.modality import AUDIO_SUFFIXES
from hf2triton.kinds.speech_recognition import SpeechRecognitionKind, SpeechSpec, TorchWhisper
from hf2triton.spec import load_spec
from tests.conftest import free_port, tiny_spec
from tests.kinds.kind_release import RELEASES, report
from tests.tiny_models import PHOTOS, build_tiny_whisper

SPEECH = RELEASES / "data" / "speech"
MAX_NEW_TOKENS = 24  # random weights ramble: a short budget keeps greedy steps clear of ties


def clips() -> list[Path]:
    """The synthesised validation clips (made by infra/setup.sh; made here if missing)."""
    from infra.speech_clips import build

    build(SPEECH)
    return sorted(p for p in SPEECH.iterdir() if p.suffix in AUDIO_SUFFIXES)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_whisper(tmp_path_factory.mktemp("models") / "tiny-whisper")


def release_whisper(tmp_path_factory, model_dir: Path, label: str, **extra):
    """The tiny Whisper released to a Triton of its own on free ports (yields what it made)."""
    from hf2triton.flows.release import release_model
    from hf2triton.targets import triton_local

    clips()
    tmp = tmp_path_factory.mktemp(label)
    ports = {
        "http_port": free_port(),
        "grpc_port": free_port(),
        "metrics_port": free_port(),
        "openai": {"port": free_port()},
    }
    path = tiny_spec(
        tmp / "whisper.yaml",
        model_dir,
        ports,
        name="tiny-whisper",
        task="automatic-speech-recognition",
        embedding=None,
        speech={"max_new_tokens": MAX_NEW_TOKENS},
        registry__model_name="tiny-whisper",
        source__model_id="fixtures/tiny-whisper",
        validation__audio=str(SPEECH),
        validation__sentences=None,
        validation__smoke_sentences=6,
        validation__judge_all=True,
        **extra,
    )
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(tmp / "home"))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        try:
            yield {"summary": release_model(load_spec(path)), "ports": ports, "home": tmp / "home"}
        finally:
            triton_local.stop_server()


@pytest.fixture(scope="module")
def whisper(tmp_path_factory, model_dir):
    yield from release_whisper(tmp_path_factory, model_dir, "whisper")


def pytorch_transcripts(model_dir: Path, files: list[Path], **options) -> list[str]:
    kind = SpeechRecognitionKind(SpeechSpec(max_new_tokens=MAX_NEW_TOKENS, **options), None)
    return TorchWhisper(model_dir, kind.resolve(str(model_dir))).transcribe([str(f) for f in files])


def infer(client_module, port: int, blobs: list[bytes]) -> tuple[list[str], np.ndarray]:
    """Transcripts and durations of one request of `blobs` as AUDIO."""
    client = client_module.InferenceServerClient(f"127.0.0.1:{port}")
    arr = np.array([[b] for b in blobs], dtype=np.object_)
    inp = client_module.InferInput("AUDIO", list(arr.shape), "BYTES")
    inp.set_data_from_numpy(arr)
    out = client.infer("tiny-whisper", [inp])
    said = [t.decode("utf-8") for t in out.as_numpy("TRANSCRIPT")[:, 0]]
    return said, out.as_numpy("DURATION")[:, 0]


def test_served_transcripts_of_every_format_are_pytorch_generates(whisper, model_dir):
    files = clips()
    assert {f.suffix for f in files} == {".wav", ".flac", ".mp3", ".ogg"}
    expected = pytorch_transcripts(model_dir, files)
    assert len(set(expected)) > len(files) // 2  # the random model says different things
    blobs = [f.read_bytes() for f in files]
    for client, port in ((httpclient, "http_port"), (grpcclient, "grpc_port")):
        at = whisper["ports"][port]
        one_by_one = [t for b in blobs for t in infer(client, at, [b])[0]]
        together, seconds = infer(client, at, blobs[:8])  # deploy.max_batch_size clips at once
        assert one_by_one == expected
        assert together == expected[:8]
    assert 2.5 < seconds.min() and seconds.max() < 6.0  # the first eight are 2.6 to 5.6 s


def test_a_clip_past_one_window_is_transcribed_whole_with_timestamped_segments(whisper):
    import json

    client = httpclient.InferenceServerClient(f"127.0.0.1:{whisper['ports']['http_port']}")
    for name, seconds in (("long-45s.wav", 45.7), ("long-60s.mp3", 62.1)):
        arr = np.array([[(SPEECH / name).read_bytes()]], dtype=np.object_)
        inp = httpclient.InferInput("AUDIO", [1, 1], "BYTES")
        inp.set_data_from_numpy(arr)
        out = client.infer("tiny-whisper", [inp])
        segments = json.loads(out.as_numpy("SEGMENTS")[0, 0])
        transcript = out.as_numpy("TRANSCRIPT")[0, 0].decode()
        assert abs(float(out.as_numpy("DURATION")[0, 0]) - seconds) < 0.1
        # several windows, their segments in order, their texts the transcript
        assert len(segments) > 2 and segments[-1]["start"] > 30.0, segments
        starts = [g["start"] for g in segments]
        assert starts == sorted(starts) and all(g["end"] >= g["start"] for g in segments)
        assert "".join(g["text"] for g in segments) == transcript


def test_the_gate_judged_word_error_rate_against_pytorch_and_the_transcripts(whisper):
    rep = report(whisper)
    assert rep["kind"] == "speech_recognition"
    assert rep["items"] == len(clips())
    by_name = {c["name"]: c for c in rep["candidates"]}
    for name, entry in by_name.items():
        assert {"wer", "reference_wer", "exact_match"} <= set(entry["metrics"]), name
        if entry["metrics"]["wer"] > 0.05:  # beyond the limit: it does not ship
            assert "wer" in entry["misses"], name
    # int8 rewrites this random model's transcripts (WER 0.85 here): refused on WER.
    refused = {n for n, e in by_name.items() if "wer" in e["misses"]}
    assert "dynamic-int8/qint8/per-channel" in refused
    shipped = by_name[whisper["summary"]["variant"]]
    assert not shipped["misses"] and shipped["metrics"]["wer"] <= 0.05
    # random weights say nothing of the sentences spoken: reported, not judged by default;
    # PyTorch's own transcripts are scored against them too, the shipped one's figure when
    # it wrote the same words
    assert shipped["metrics"]["reference_wer"] > 0.5
    assert rep["pytorch"]["reference_wer"] > 0.5
    if shipped["metrics"]["exact_match"] == 1.0:
        assert rep["pytorch"]["reference_wer"] == pytest.approx(shipped["metrics"]["reference_wer"])


def test_a_reference_limit_pytorch_itself_misses_is_named_as_the_models(
    tmp_path_factory, model_dir
):
    """A limit on the words spoken that PyTorch's own transcripts miss: nothing ships, and the
    refusal says the model itself misses it (no export could pass), with PyTorch's figure."""
    from hf2triton.errors import AccuracyGateError

    with pytest.raises(AccuracyGateError) as refused:
        next(
            release_whisper(
                tmp_path_factory,
                model_dir,
                "whisper-refused",
                runtime__candidates=[{"name": "onnxruntime", "precision": "fp32"}],
                quantization__method="none",
                speech__thresholds={"max_reference_wer": 0.3},
            )
        )
    message = str(refused.value)
    assert "reference_wer" in message and "> 0.3" in message
    assert "PyTorch's own answers miss too (reference_wer " in message
    assert "the model itself, not its export, misses reference_wer." in message


def eleven_minutes() -> bytes:
    """A WAV of 11 minutes of silence (8 kHz, 8-bit: 5 MB), over speech.max_seconds."""
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(1)
        w.setframerate(8000)
        w.writeframes(b"\x80" * 8000 * 660)
    return buf.getvalue()


def test_bad_audio_gets_a_clear_error_and_the_server_serves_on(whisper):
    port = whisper["ports"]["http_port"]
    bad = {
        b"": "empty",
        b"hello, this is not audio at all" * 4: "not an audio file",
        sorted(PHOTOS.glob("*.png"))[0].read_bytes(): "no audio stream",
        eleven_minutes(): "longer than 600 s",
    }
    for blob, words in bad.items():
        with pytest.raises(InferenceServerException) as err:
            infer(httpclient, port, [blob])
        assert words in str(err.value), str(err.value)
    said, _ = infer(httpclient, port, [clips()[0].read_bytes()])
    assert len(said) == 1


def asked_in(served, blobs: list[bytes], language: bytes) -> tuple[list[str], set[bytes]]:
    """Each clip answered with LANGUAGE `language`: the transcripts and the languages the
    answers name."""
    rows = [
        {
            "AUDIO": np.array([[b]], dtype=np.object_),
            "LANGUAGE": np.array([[language]], dtype=np.object_),
        }
        for b in blobs
    ]
    asked = served.answer(rows)
    return [a["TRANSCRIPT"][0, 0].decode() for a in asked], {
        a["SPOKEN_LANGUAGE"][0, 0] for a in asked
    }


def test_a_multilingual_model_detects_the_language_or_takes_the_one_asked(tmp_path, model_dir):
    """In-process (no Triton): the served path of a multilingual Whisper against PyTorch
    `generate`, with the language detected per clip, given in the spec, and asked per request."""
    from hf2triton.release.export import optimum_export

    multi = build_tiny_whisper(tmp_path / "multi", seed=1, multilingual=True)
    files = clips()[:6]
    blobs = [f.read_bytes() for f in files]
    out = tmp_path / "export"
    kind = SpeechRecognitionKind(SpeechSpec(max_new_tokens=MAX_NEW_TOKENS), None)
    optimum_export(str(multi), out, kind.onnx_task, 18, kind.main_file)
    cfg = kind.resolve(str(multi))
    kind.prepare_export(str(multi), out, cfg)
    served = kind.open_candidate(str(out), str(out), kind.serving_json(cfg, str(out)))
    assert served.transcribe(blobs) == pytorch_transcripts(multi, files)  # detected
    german = pytorch_transcripts(multi, files, language="de")
    assert asked_in(served, blobs, b"de") == (german, {b"de"})
    refused = served.answer(
        [
            {
                "AUDIO": np.array([[blobs[0]]], dtype=np.object_),
                "LANGUAGE": np.array([[b"xx"]], dtype=np.object_),
            }
        ]
    )
    assert "LANGUAGE 'xx' is not one of this model's" in refused[0]


def test_the_openai_sdk_transcribes_uploads_in_every_response_format(whisper, model_dir):
    from openai import BadRequestError, OpenAI

    port = whisper["ports"]["openai"]["port"]
    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
    files = clips()
    wav, mp3 = (next(f for f in files if f.suffix == s) for s in (".wav", ".mp3"))
    expected = pytorch_transcripts(model_dir, [wav, mp3])
    for path, want in zip((wav, mp3), expected):
        with path.open("rb") as f:
            assert client.audio.transcriptions.create(model="tiny-whisper", file=f).text == want
    with wav.open("rb") as f:
        verbose = client.audio.transcriptions.create(
            model="tiny-whisper",
            file=f,
            response_format="verbose_json",
            timestamp_granularities=["segment"],
        )
    assert verbose.text == expected[0] and 4.9 < verbose.duration < 5.1
    assert [(s.start, s.end, s.text) for s in verbose.segments] == [
        (0.0, verbose.duration, expected[0])
    ]
    with wav.open("rb") as f:
        srt = client.audio.transcriptions.create(
            model="tiny-whisper", file=f, response_format="srt"
        )
    end = f"{verbose.duration:06.3f}".replace(".", ",")
    assert srt == f"1\n00:00:00,000 --> 00:00:{end}\n{expected[0].strip()}\n"
    with wav.open("rb") as f:  # no model named: the one speech model served
        plain = client.audio.transcriptions.create(model="", file=f, response_format="text")
    assert plain.strip() == expected[0].strip()
    refused = {
        "temperature": {"temperature": 0.7},
        "prompt": {"prompt": "a glossary of terms"},
        "timestamp_granularities": {"timestamp_granularities": ["word"]},
    }
    for words, extra in refused.items():
        with wav.open("rb") as f, pytest.raises(BadRequestError) as err:
            client.audio.transcriptions.create(model="tiny-whisper", file=f, **extra)
        assert words in str(err.value), str(err.value)
    long_ones = [SPEECH / "long-45s.wav", SPEECH / "long-60s.mp3"]  # past one window
    for path, want in zip(long_ones, pytorch_transcripts(model_dir, long_ones)):
        with path.open("rb") as f:
            found = client.audio.transcriptions.create(
                model="tiny-whisper", file=f, response_format="verbose_json"
            )
        assert found.text == want and found.duration > 45.0
        assert len(found.segments) > 2 and found.segments[-1].start > 30.0
    with wav.open("rb") as f, pytest.raises(BadRequestError, match="translate"):
        client.audio.translations.create(model="tiny-whisper", file=f)  # English-only


# ---- OpenVINO GenAI's WhisperPipeline: the same release, served by the other runtime ---------
GENAI_FP32 = {"name": "openvino-genai", "precision": "fp32"}


@pytest.fixture(scope="module")
def genai_whisper(tmp_path_factory, model_dir):
    """The tiny Whisper released on OpenVINO GenAI alone: no ONNX export, optimum-intel's IRs
    with f32 weights and the same IRs' weights compressed to int8 by NNCF, both judged."""
    yield from release_whisper(
        tmp_path_factory, model_dir, "genai-whisper", runtime__candidates=[GENAI_FP32]
    )


def test_the_whisper_pipeline_ships_what_it_judged_and_serves_pytorchs_transcripts(
    genai_whisper, model_dir
):
    rep = report(genai_whisper)
    by_name = {c["name"]: c for c in rep["candidates"]}
    assert set(by_name) == {
        "openvino-ir on openvino-genai fp32",
        "openvino-ir/int8 on openvino-genai fp32",
    }
    # int8 weights change this random model's words (WER 0.58 here): refused, f32 ships.
    assert "wer" in by_name["openvino-ir/int8 on openvino-genai fp32"]["misses"]
    shipped = by_name[genai_whisper["summary"]["variant"]]
    assert shipped["name"] == "openvino-ir on openvino-genai fp32"
    assert shipped["metrics"]["exact_match"] == 1.0 and not shipped["misses"]
    files = clips()
    expected = pytorch_transcripts(model_dir, files)
    blobs = [f.read_bytes() for f in files]
    for client, port in ((httpclient, "http_port"), (grpcclient, "grpc_port")):
        at = genai_whisper["ports"][port]
        assert [t for b in blobs for t in infer(client, at, [b])[0]] == expected
        assert infer(client, at, blobs[:8])[0] == expected[:8]  # a batch: one clip at a time


def test_the_whisper_pipeline_transcribes_a_long_clip_whole_with_segments(genai_whisper):
    import json

    client = httpclient.InferenceServerClient(f"127.0.0.1:{genai_whisper['ports']['http_port']}")
    arr = np.array([[(SPEECH / "long-60s.mp3").read_bytes()]], dtype=np.object_)
    inp = httpclient.InferInput("AUDIO", [1, 1], "BYTES")
    inp.set_data_from_numpy(arr)
    out = client.infer("tiny-whisper", [inp])
    segments = json.loads(out.as_numpy("SEGMENTS")[0, 0])
    assert len(segments) > 2 and segments[-1]["start"] > 30.0, segments
    starts = [g["start"] for g in segments]
    assert starts == sorted(starts) and all(g["end"] >= g["start"] for g in segments)
    with pytest.raises(InferenceServerException, match="not an audio file"):
        infer(httpclient, genai_whisper["ports"]["http_port"], [b"not audio" * 20])


def test_the_whisper_pipeline_takes_the_language_of_the_spec_or_the_request(tmp_path):
    """In-process (no Triton): a multilingual Whisper's IRs on OpenVINO GenAI against PyTorch
    `generate`, in the spec's language and in the one a request asks. Without a language in
    the spec the runtime refuses the model, saying why (the pipeline detects a language but
    does not say which)."""
    from hf2triton.runtimes.openvino_genai import OpenVinoGenAI, convert_stateful, tokenizer_ir
    from hf2triton.serving.runtimes import RuntimeUnavailable

    multi = build_tiny_whisper(tmp_path / "multi", seed=1, multilingual=True)
    files = clips()[:6]
    blobs = [f.read_bytes() for f in files]
    out = tmp_path / "ir"
    kind = SpeechRecognitionKind(SpeechSpec(max_new_tokens=MAX_NEW_TOKENS, language="en"), None)
    convert_stateful(str(multi), out, kind.onnx_task)
    assert tokenizer_ir(multi, out) == ""
    cfg = kind.resolve(str(multi))
    kind.prepare_export(str(multi), out, cfg)
    runtime = {**GENAI_FP32, "device": "cpu"}
    settings = kind.serving_json(cfg, str(out), runtime=runtime)
    served = kind.open_candidate(str(out / "openvino_encoder_model.xml"), str(out), settings)
    assert served.engine is not None  # the pipeline serves it, not the ONNX path
    english = pytorch_transcripts(multi, files, language="en")
    german = pytorch_transcripts(multi, files, language="de")
    assert english != german
    assert served.transcribe(blobs) == english
    assert asked_in(served, blobs, b"de") == (german, {b"de"})

    detecting = SpeechRecognitionKind(SpeechSpec(max_new_tokens=MAX_NEW_TOKENS), None)
    assert "set speech.language" in OpenVinoGenAI.refuses(detecting, str(multi))
    assert OpenVinoGenAI.refuses(kind, str(multi)) == ""
    cfg = detecting.resolve(str(multi))
    with pytest.raises(RuntimeUnavailable, match="does not report the language it detects"):
        detecting.open_candidate(
            str(out / "openvino_encoder_model.xml"),
            str(out),
            detecting.serving_json(cfg, str(out), runtime=runtime),
        )
