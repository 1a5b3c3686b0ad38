"""/v1/audio/transcriptions and /v1/audio/translations: OpenAI's speech-to-text routes over a
speech recognition release (Whisper). A multipart upload: `file` (WAV, FLAC, OGG, MP3, M4A,
WebM), `model`, `language`, `response_format` (json, text, srt, vtt, verbose_json),
`timestamp_granularities[]` and `temperature`. The release decodes greedily, one 30-second
window after another for a longer clip, without a prompt: `temperature` above 0, a `prompt`,
word timestamps, `stream` and any field OpenAI's API does not define are each a 400 naming the
field, never silently ignored. Segments (verbose_json, srt, vtt) are the release's SEGMENTS: a
clip of one window is one segment from 0 to its duration, a longer clip's are the segments its
predicted timestamps mark."""

from __future__ import annotations

import json
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


def subtitles(fmt: str, segments: list[dict[str, Any]]) -> str:
    """The segments as SRT or WebVTT cues."""
    srt = fmt == "srt"
    cues = [
        f"{clock(g['start'], srt)} --> {clock(g['end'], srt)}\n{g['text'].strip()}\n"
        for g in segments
    ]
    if srt:
        return "\n".join(f"{i}\n{cue}" for i, cue in enumerate(cues, 1))
    return "WEBVTT\n\n" + "\n".join(cues)


def formatted(fmt: str, task: str, out: dict[str, np.ndarray]) -> Response:
    """The answer in `fmt`, in OpenAI's shapes."""
    text = out["TRANSCRIPT"][0, 0].decode("utf-8")
    if fmt == "json":
        return Json({"text": text})
    if fmt == "text":
        return PlainTextResponse(text)
    found = json.loads(out["SEGMENTS"][0, 0])
    if fmt in ("srt", "vtt"):
        media = "text/plain" if fmt == "srt" else "text/vtt"
        return PlainTextResponse(subtitles(fmt, found), media_type=media)
    segments = [
        {"id": i, "seek": int(round(g["start"] * 100)), **g, "temperature": 0.0, "tokens": []}
        for i, g in enumerate(found)
    ]
    return Json(
        {
            "task": task,
            "language": out["SPOKEN_LANGUAGE"][0, 0].decode("utf-8"),
            "duration": round(float(out["DURATION"][0, 0]), 3),
            "text": text,
            "segments": segments,
        }
    )


def check_fields(form: Any, task: str) -> None:
    """A 400 for each field the release cannot honour, or the route does not know."""
    if task == "translate" and form.get("language"):
        raise bad_request(
            "language is not a field of translations (the speech is translated into English "
            "from whatever language it is in)",
            param="language",
        )
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


async def read_form(request: Request, task: str) -> tuple[dict[str, Any], bytes]:
    """The upload's fields and its file's bytes (its spooled file closed); a 400 for a body
    that is not one."""
    if "multipart/form-data" not in request.headers.get("content-type", ""):
        raise bad_request("send a multipart/form-data upload with the audio as `file`", "file")
    async with request.form(max_files=1, max_fields=MAX_FIELDS) as form:
        upload = form.get("file")
        if not isinstance(upload, UploadFile):
            raise bad_request("file is missing: upload the audio file as `file`", param="file")
        check_fields(form, task)
        fields = {k: v for k, v in form.items() if isinstance(v, str)}
        return fields, await upload.read()


async def speech_to_text(request: Request, task: str) -> Response:
    form, data = await read_form(request, task)
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
    return formatted(fmt, task, out)


@router.post("/v1/audio/transcriptions")
async def transcriptions(request: Request) -> Response:
    return await speech_to_text(request, "transcribe")


@router.post("/v1/audio/translations")
async def translations(request: Request) -> Response:
    return await speech_to_text(request, "translate")
