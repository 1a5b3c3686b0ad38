"""/v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text routes over a
speech recognition release (Whisper). A multipart upload: `file` (WAV, FLAC, OGG, MP3, M4A,
WebM), `model`, `language`, `response_format` (json, text, srt, vtt, verbose_json),
`timestamp_granularities[]` and `temperature`. The release decodes greedily, one 30-second
window a clip, without a prompt: `temperature` above 0, a `prompt`, word timestamps, `stream`
and any field OpenAI's API does not define are each a 400 naming the field, never silently
ignored. Segments (verbose_json, srt, vtt) are the clip's window: one segment from 0 to the
clip's duration."""

from __future__ import annotations

from typing import Any

import numpy as np
from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.datastructures import UploadFile

from .bodies import Json
from .errors import bad_request
from .state import only_model, timed, triton_of

router = APIRouter()
KINDS = ("speech_recognition",)
FORMATS = ("json", "text", "srt", "vtt", "verbose_json")
# The form fields read; the others OpenAI defines are refused with why, unknown ones as unknown.
FIELDS = {"file", "model", "language", "response_format", "temperature"}
FIELDS |= {"timestamp_granularities[]", "timestamp_granularities"}
NOT_HONOURED = {
    "prompt": "this release decodes without a prompt: leave prompt out",
    "stream": "streamed transcripts are not served: leave stream out",
    "chunking_strategy": "clips are transcribed in 30-second windows: leave chunking_strategy out",
    "include[]": "log probabilities are not returned: leave include[] out",
}
MAX_FIELDS = 16


def clock(seconds: float, comma: bool) -> str:
    """A subtitle timestamp: 00:00:01,250 (SRT) or 00:00:01.250 (WebVTT)."""
    ms = int(round(seconds * 1000))
    h, rest = divmod(ms, 3_600_000)
    m, rest = divmod(rest, 60_000)
    s, ms = divmod(rest, 1000)
    return f"{h:02d}:{m:02d}:{s:02d}{',' if comma else '.'}{ms:03d}"


def formatted(fmt: str, task: str, text: str, language: str, seconds: float) -> Response:
    """The answer in `fmt`: OpenAI's shapes, the segments being the clip's one window."""
    segment = {"id": 0, "seek": 0, "start": 0.0, "end": round(seconds, 3), "text": text}
    segment.update(temperature=0.0, tokens=[])
    if fmt == "json":
        return Json({"text": text})
    if fmt == "text":
        return PlainTextResponse(text)
    if fmt == "verbose_json":
        return Json(
            {
                "task": task,
                "language": language,
                "duration": round(seconds, 3),
                "text": text,
                "segments": [segment] if text else [],
            }
        )
    cue = f"{clock(0.0, fmt == 'srt')} --> {clock(seconds, fmt == 'srt')}\n{text.strip()}\n"
    if fmt == "srt":
        return PlainTextResponse(f"1\n{cue}" if text else "")
    return PlainTextResponse(f"WEBVTT\n\n{cue}" if text else "WEBVTT\n", media_type="text/vtt")


def check_fields(form: Any) -> None:
    """A 400 for each field the release cannot honour, or does not know."""
    for name in form:
        if name in NOT_HONOURED and str(form.get(name) or "").strip() not in ("", "false"):
            raise bad_request(f"{name}: {NOT_HONOURED[name]}", param=name)
        if name not in FIELDS and name not in NOT_HONOURED:
            raise bad_request(
                f"{name} is not a field of this route (it takes {', '.join(sorted(FIELDS))})",
                param=name,
            )
    temperature = str(form.get("temperature") or "0")
    try:
        hot = float(temperature) != 0.0
    except ValueError:
        raise bad_request(f"temperature {temperature!r} is not a number", "temperature") from None
    if hot:
        raise bad_request(
            "temperature: this release decodes greedily (temperature 0) only", "temperature"
        )
    for grain in form.getlist("timestamp_granularities[]") + form.getlist(
        "timestamp_granularities"
    ):
        if grain != "segment":
            raise bad_request(
                f"timestamp_granularities: {grain!r} timestamps are not served (segment is)",
                param="timestamp_granularities[]",
            )


async def read_form(request: Request) -> tuple[Any, bytes]:
    """The upload's fields and its file's bytes; a 400 for a body that is not one."""
    if "multipart/form-data" not in request.headers.get("content-type", ""):
        raise bad_request("send a multipart/form-data upload with the audio as `file`", "file")
    form = await request.form(max_files=1, max_fields=MAX_FIELDS)
    upload = form.get("file")
    if not isinstance(upload, UploadFile):
        raise bad_request("file is missing: upload the audio file as `file`", param="file")
    check_fields(form)
    return form, await upload.read()


async def speech_to_text(request: Request, task: str) -> Response:
    form, data = await read_form(request)
    fmt = str(form.get("response_format") or "json")
    if fmt not in FORMATS:
        raise bad_request(
            f"response_format {fmt!r} is not one of {', '.join(FORMATS)}", "response_format"
        )
    name = str(form.get("model") or "") or await only_model(request, *KINDS)
    request.state.model = name
    triton = triton_of(request)
    model = await triton.model(name, KINDS, request.url.path)
    arrays = {"AUDIO": np.array([[data]], dtype=np.object_)}
    language = str(form.get("language") or "")
    if language:
        arrays["LANGUAGE"] = np.array([[language.encode("utf-8")]], dtype=np.object_)
    if task == "translate":
        arrays["TASK"] = np.array([[b"translate"]], dtype=np.object_)
    out = await timed(request, triton.infer(model, arrays, prompt_param="file"))
    text = out["TRANSCRIPT"][0, 0].decode("utf-8")
    spoken = out["SPOKEN_LANGUAGE"][0, 0].decode("utf-8")
    return formatted(fmt, task, text, spoken, float(out["DURATION"][0, 0]))


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    return await speech_to_text(request, "transcribe")


@router.post("/v1/audio/translations")
async def translations(request: Request) -> Response:
    return await speech_to_text(request, "translate")
