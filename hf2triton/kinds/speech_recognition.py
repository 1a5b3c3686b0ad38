"""Kind `speech_recognition` (`task: automatic-speech-recognition`): Whisper checkpoints
(`WhisperForConditionalGeneration`: English-only `.en` models and multilingual ones) served with
an encoded audio file in and its transcript out (hf2triton.serving.speech), on optimum's
`automatic-speech-recognition-with-past` export: encoder, decoder and decoder with past.

The gate scores each candidate's transcripts by word error rate against PyTorch `generate`'s
(greedy) on the validation clips, with the margin's bound over clips, and against the clips'
reference transcripts where `validation.audio` has a transcripts.tsv (both reported). Clips are
decoded by the served path's decoder (hf2triton.serving.audio) for PyTorch too; PyTorch's
features are the model's own `WhisperFeatureExtractor`'s, so the served log-mel is judged
against them.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import Field

from hf2triton.errors import ExportError, SpecError, UnsupportedModelError
from hf2triton.kinds.base import KINDS, Data, Limits, read_json, save_fast_tokenizer
from hf2triton.kinds.margin import Sample
from hf2triton.kinds.modality import AudioKind, read_audio
from hf2triton.kinds.roles import TextAnswerGate
from hf2triton.kinds.torch_reference import abs_difference, batched
from hf2triton.kinds.translation import onnx_files_with_data, serving_files
from hf2triton.serving.audio import decode
from hf2triton.serving.seq2seq import ONNX_FILES, Seq2SeqModel
from hf2triton.serving.speech import Transcriber, WhisperDecode
from hf2triton.util import quiet
from hf2triton.util.specbase import Strict

TRANSCRIPTS_FILE = "transcripts.tsv"  # beside the validation clips: name TAB reference
# The encoder's IR: what names an OpenVINO GenAI candidate (its WhisperPipeline's directory).
WHISPER_IR_FILE = "openvino_encoder_model.xml"


class SpeechThresholds(Strict):
    max_wer: float = Field(
        0.05,
        ge=0,
        le=10,
        description="largest word error rate of the served transcripts against PyTorch "
        "generate's (greedy) on the validation clips, at the margin's 95% bound over clips",
    )
    max_reference_wer: float | None = Field(
        None,
        ge=0,
        le=10,
        description="largest word error rate against the clips' reference transcripts "
        "(validation.audio's transcripts.tsv); unset: reported, not judged",
    )


class SpeechSpec(Strict):
    """`task: automatic-speech-recognition`: how clips are transcribed by default (a request
    may name its own language and task)."""

    language: str | None = Field(
        None,
        description="language code of the speech ('en', 'de'); unset: a multilingual model "
        "detects it per clip, an English-only one speaks English",
    )
    task: Literal["transcribe", "translate"] = Field(
        "transcribe", description="transcribe, or translate into English (multilingual models)"
    )
    max_new_tokens: int = Field(
        224, ge=1, le=440, description="most tokens of one 30-second window's transcript"
    )
    max_seconds: float = Field(
        600.0,
        gt=0,
        le=3600,
        description="longest clip served (seconds); a clip past one 30-second window is "
        "transcribed whole, window after window (Whisper's sequential long-form decoding, with "
        "segment timestamps)",
    )
    max_bytes: int = Field(
        25_000_000, ge=1000, description="largest audio file served (bytes), as OpenAI's limit"
    )
    thresholds: SpeechThresholds = SpeechThresholds()


@dataclass(frozen=True)
class SpeechConfig:
    """What serving needs: the decoding settings read off generation_config.json, the
    tokenizer's clean-up, the defaults and limits."""

    decode: dict[str, Any]  # hf2triton.serving.speech.WhisperDecode's fields
    max_target_positions: int
    clean_up_tokenization_spaces: bool
    language: str | None
    task: str | None
    max_seconds: float
    max_bytes: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def whisper_decode(model_dir: str, options: SpeechSpec) -> tuple[dict[str, Any], int]:
    """WhisperDecode's fields from the model's generation_config.json, and its decoder's
    positions; UnsupportedModelError for a model that is not a Whisper."""
    config = read_json(Path(model_dir) / "config.json")
    if config.get("model_type") != "whisper":
        raise UnsupportedModelError(
            f"{model_dir} is a {config.get('model_type')!r} model: automatic-speech-"
            "recognition releases Whisper checkpoints (WhisperForConditionalGeneration)"
        )
    gen = read_json(Path(model_dir) / "generation_config.json")
    if gen.get("no_timestamps_token_id") is None:
        raise UnsupportedModelError(
            f"{model_dir}'s generation_config.json has no no_timestamps_token_id, which "
            "Whisper's decoding needs: save the model again with a current transformers"
        )
    eos = gen.get("eos_token_id", config.get("eos_token_id"))
    multilingual = bool(gen.get("is_multilingual"))
    languages = {k.strip("<|>"): int(v) for k, v in (gen.get("lang_to_id") or {}).items()}
    decode = {
        "decoder_start_token_id": int(gen["decoder_start_token_id"]),
        "eos_token_id": int(eos[0] if isinstance(eos, list) else eos),
        "max_new_tokens": options.max_new_tokens,
        "no_timestamps_token_id": gen.get("no_timestamps_token_id"),
        "suppress_tokens": list(gen.get("suppress_tokens") or []),
        "begin_suppress_tokens": list(gen.get("begin_suppress_tokens") or []),
        "languages": languages if multilingual else {},
        "tasks": dict(gen.get("task_to_id") or {}) if multilingual else {},
        "max_initial_timestamp_index": gen.get("max_initial_timestamp_index"),
    }
    return decode, int(config.get("max_target_positions", 448))


def word_errors(hypothesis: str, reference: str) -> tuple[int, int]:
    """(word edits, reference words) of one transcript, both normalised as Whisper's English
    evaluations compare them roughly: lower case, no punctuation, single spaces."""
    import jiwer

    clean = jiwer.Compose(
        [
            jiwer.ToLowerCase(),
            jiwer.RemovePunctuation(),
            jiwer.RemoveMultipleSpaces(),
            jiwer.Strip(),
        ]
    )
    ref, hyp = clean(reference), clean(hypothesis)
    if not ref:
        return len(hyp.split()), 0
    if not hyp:
        return len(ref.split()), len(ref.split())
    found = jiwer.process_words(ref, hyp)
    edits = found.substitutions + found.deletions + found.insertions
    return edits, len(ref.split())


def wer_of(edits: float, words: float) -> float:
    """Word edits over reference words; with no reference words (silence), 0 if nothing was
    said and 1 otherwise."""
    return float(edits / words) if words else float(edits > 0)


def wer(hypotheses: list[str], references: list[str]) -> tuple[float, Sample]:
    """Corpus word error rate (edits over reference words, over every clip) and its Sample."""
    pairs = np.array([word_errors(h, r) for h, r in zip(hypotheses, references)], np.float64)
    sample = Sample(pairs.reshape(-1, 2), lambda s: wer_of(s[0], s[1]))
    return wer_of(*pairs.sum(axis=0)), sample


class TorchWhisper:
    """The original PyTorch Whisper: clips decoded by the served path's decoder, features by the
    model's own feature extractor, greedy `generate`, the processor's own decoding."""

    def __init__(self, model_dir: str | Path, cfg: SpeechConfig):
        import torch
        from transformers import AutoProcessor, WhisperForConditionalGeneration

        self._torch = torch
        self.cfg = cfg
        # transformers' Whisper `generate` passes its own logits processors to the generic
        # `generate` and warns of it on every call, and of the attention mask a window of
        # features does not need (every frame is real): nothing a user can act on.
        for prefix in ("A custom logits processor", "The attention mask is not set"):
            quiet.drop_log_message("transformers.generation.utils", prefix)
        self.processor = AutoProcessor.from_pretrained(str(model_dir))
        self.model = WhisperForConditionalGeneration.from_pretrained(str(model_dir)).eval()

    def waves(self, clips: list[Any]) -> list[np.ndarray]:
        return [decode(Path(c).read_bytes() if not isinstance(c, bytes) else c) for c in clips]

    def features(self, waves: list[np.ndarray]) -> np.ndarray:
        """The extractor's features of clips of one window (`waves`, decoded)."""
        fe = self.processor.feature_extractor
        return fe(waves, sampling_rate=fe.sampling_rate, return_tensors="np").input_features

    def generate(self, features: np.ndarray, max_new_tokens: int, **long_form: Any) -> list[str]:
        """Greedy `generate` of a batch of windows, or (with `attention_mask` and
        `return_timestamps`) of one long clip's whole features."""
        torch, cfg = self._torch, self.cfg
        multilingual = bool(cfg.decode["languages"])
        with torch.inference_mode():
            ids = self.model.generate(
                torch.from_numpy(features),
                max_new_tokens=max_new_tokens,
                num_beams=1,
                do_sample=False,
                language=cfg.language if multilingual else None,
                task=cfg.task if multilingual else None,
                **long_form,
            )
        return self.processor.batch_decode(ids, skip_special_tokens=True)

    def transcribe_long(self, wave: np.ndarray, budget: int) -> str:
        """One decoded clip past a window, as transformers transcribes it: its whole features,
        the attention mask, timestamps predicted (sequential long-form decoding)."""
        fe = self.processor.feature_extractor
        found = fe(
            [wave],
            sampling_rate=fe.sampling_rate,
            return_tensors="np",
            truncation=False,
            padding="longest",
            return_attention_mask=True,
        )
        mask = self._torch.from_numpy(found.attention_mask)
        return self.generate(
            found.input_features, budget, attention_mask=mask, return_timestamps=True
        )[0]

    def transcribe(self, clips: list[Any], size: int = 8) -> list[str]:
        """Each clip's transcript: clips of one window in batches of `size`, longer ones alone."""
        # The served path's budget (one rule): a window's tokens within the decoder's positions.
        s = WhisperDecode(**self.cfg.decode)
        prompt = s.prompt("en" if s.languages else None, "transcribe" if s.tasks else None)
        budget = s.budget(prompt, self.cfg.max_target_positions)
        fe = self.processor.feature_extractor
        window = fe.n_samples
        waves = self.waves(clips)
        # Past one window's frames: long-form, as the served path and transformers tell it.
        long = [len(w) // fe.hop_length * fe.hop_length > window for w in waves]
        said: list[str] = [""] * len(clips)
        for part in batched([i for i in range(len(clips)) if not long[i]], size):
            texts = self.generate(self.features([waves[i] for i in part]), budget)
            for i, text in zip(part, texts):
                said[i] = text
        for i in (i for i in range(len(clips)) if long[i]):
            said[i] = self.transcribe_long(waves[i], budget)
        return said


@KINDS.register
class SpeechRecognitionKind(TextAnswerGate[SpeechConfig], AudioKind[SpeechConfig]):
    name = "speech_recognition"
    task = "automatic-speech-recognition"
    section = "speech"
    Options = SpeechSpec
    onnx_task = "automatic-speech-recognition-with-past"
    serving_class = Transcriber
    answer_column = "TRANSCRIPT"
    item_key = "clip"  # the details name a differing clip by its file name
    main_file = ONNX_FILES["encoder"]
    tunable = False
    input_files = ("preprocessor_config.json", "tokenizer.json")

    def resolve(self, model_dir: str) -> SpeechConfig:
        decode_fields, positions = whisper_decode(model_dir, self.options)
        tok = read_json(Path(model_dir) / "tokenizer_config.json")
        language = self.options.language
        if language and decode_fields["languages"] and language not in decode_fields["languages"]:
            raise SpecError(
                f"speech.language {language!r} is not one of the model's languages "
                f"({', '.join(sorted(decode_fields['languages'])[:20])}, ...)"
            )
        if not decode_fields["languages"] and (language not in (None, "en")):
            raise SpecError(f"speech.language {language!r}: {model_dir} is English-only")
        if not decode_fields["tasks"] and self.options.task == "translate":
            raise SpecError("speech.task translate: an English-only model cannot translate")
        return SpeechConfig(
            decode=decode_fields,
            max_target_positions=positions,
            clean_up_tokenization_spaces=bool(tok.get("clean_up_tokenization_spaces", False)),
            language=language if decode_fields["languages"] else None,
            task=self.options.task if decode_fields["tasks"] else None,
            max_seconds=self.options.max_seconds,
            max_bytes=self.options.max_bytes,
        )

    def config_from_dict(self, data: dict[str, Any]) -> SpeechConfig:
        return SpeechConfig(**data)

    def read_data(self) -> Data:
        clips = read_audio(self.validation.audio, self.options.max_seconds)
        listed = Path(clips[0]).parent / TRANSCRIPTS_FILE
        if not listed.is_file():
            return Data(clips)
        said: dict[str, str] = {}
        for line in listed.read_text(encoding="utf-8").splitlines():
            if line.strip():
                name, _, text = line.partition("\t")
                said[name.strip()] = text.strip()
        missing = [Path(c).name for c in clips if Path(c).name not in said]
        if missing:
            raise SpecError(
                f"{listed} has no transcript for {', '.join(missing[:5])}: give one line per "
                "clip (file name TAB transcript; an empty transcript for a silent clip)"
            )
        return Data(clips, {"references": [said[Path(c).name] for c in clips]})

    def prepare_export(self, model_dir: str, out: Path, cfg: SpeechConfig) -> None:
        super().prepare_export(model_dir, out, cfg)
        save_fast_tokenizer(model_dir, out)

    def check_export(
        self, model_dir: str, out: Path, cfg: SpeechConfig, inputs: list[Any]
    ) -> dict[str, float]:
        """The encoder's states within reach of PyTorch's, and the fp32 graphs' greedy
        transcripts equal to PyTorch `generate`'s on `inputs`; with no ONNX export (every
        runtime tried makes its own graphs, OpenVINO GenAI), nothing to check here: the gate
        judges each candidate's transcripts."""
        if not (out / ONNX_FILES["encoder"]).is_file():
            return {"max_abs_diff": 0.0}  # no graph here to differ (as text_generation's)
        reference = TorchWhisper(model_dir, cfg)
        encoder = Seq2SeqModel(serving_files(out))
        worst = 0.0
        torch = reference._torch
        for part in batched(list(inputs), 4):
            feats = reference.features(reference.waves(part)).astype(np.float32)
            with torch.inference_mode():
                want = reference.model.get_encoder()(torch.from_numpy(feats)).last_hidden_state
            got = encoder.run("encoder", {"input_features": feats})[0]
            worst = max(worst, abs_difference(want.float().numpy(), got))
        served = self.open_candidate(str(out), str(out), self.serving_json(cfg, str(out)))
        got_text = served.transcribe([Path(p).read_bytes() for p in inputs])
        want_text = reference.transcribe(list(inputs))
        differ = [i for i, (a, b) in enumerate(zip(got_text, want_text)) if a != b]
        if differ:
            i = differ[0]
            raise ExportError(
                f"greedy transcripts of the fp32 ONNX files differ from PyTorch generate's on "
                f"{len(differ)} of {len(inputs)} clips (first: {Path(inputs[i]).name}: "
                f"{got_text[i][:40]!r}, PyTorch {want_text[i][:40]!r}); try another "
                "export.opset or report the model"
            )
        return {"max_abs_diff": worst}

    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        """The ONNX files of a candidate (a directory), or for OpenVINO GenAI (the candidate is
        the encoder's IR) every file of the IRs' directory, which its WhisperPipeline reads
        together; the preprocessor and tokenizer.json the export's either way."""
        graph = Path(candidate)
        if graph.name == WHISPER_IR_FILE:
            files = {p.name: p for p in sorted(graph.parent.iterdir()) if p.is_file()}
        else:
            files = onnx_files_with_data(candidate)
        for name in self.input_files:
            files[name] = Path(export_dir) / name
        return files

    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        if WHISPER_IR_FILE in files:
            return {
                "whisper_ir": files[WHISPER_IR_FILE],
                "preprocessor": files["preprocessor_config.json"],
                "tokenizer_file": files["tokenizer.json"],
            }
        return {
            "files": {role: files[name] for role, name in ONNX_FILES.items()},
            "preprocessor": files["preprocessor_config.json"],
            "tokenizer_file": files["tokenizer.json"],
        }

    def settings(self, cfg: SpeechConfig, export_dir: str) -> dict[str, Any]:
        found = cfg.to_dict()
        found["tokenizer"] = {
            "kind": "tokenizers",
            "clean_up_tokenization_spaces": found.pop("clean_up_tokenization_spaces", False),
        }
        return found

    openai_route = "/audio/transcriptions"

    def openai_body(self, request: dict[str, np.ndarray]) -> dict[str, Any]:
        """The clip uploaded as a client uploads a file (multipart), verbose_json asked."""
        return {"file": bytes(request["AUDIO"][0, 0]), "response_format": "verbose_json"}

    def openai_answer(
        self, body: Any, request: dict[str, np.ndarray], cfg: SpeechConfig
    ) -> dict[str, np.ndarray]:
        return {
            "TRANSCRIPT": np.array([[body["text"].encode("utf-8")]], dtype=np.object_),
            "SPOKEN_LANGUAGE": np.array([[body["language"].encode("utf-8")]], dtype=np.object_),
            "DURATION": np.array([[body["duration"]]], dtype=np.float32),
        }

    def reference(self, model_dir: str, cfg: SpeechConfig, data: Data) -> list[str]:
        return TorchWhisper(model_dir, cfg).transcribe(data.items)

    def score(
        self, reference: list[str], outputs: list[str], data: Data, cfg: SpeechConfig
    ) -> tuple[dict[str, float], dict]:
        same = [h == r for h, r in zip(outputs, reference)]
        metrics = {
            "wer": wer(outputs, list(reference))[0],
            "exact_match": sum(same) / max(1, len(same)),
        }
        if "references" in data.extra:
            metrics["reference_wer"] = wer(outputs, data.extra["references"])[0]
        differ = [
            {
                "clip": Path(str(data.items[i])).name,
                "pytorch": reference[i][:200],
                "candidate": outputs[i][:200],
            }
            for i in range(len(same))
            if not same[i]
        ]
        return metrics, {"differ": differ[:10]}

    def pytorch_scores(
        self, reference: list[str], data: Data, cfg: SpeechConfig
    ) -> dict[str, float]:
        if "references" not in data.extra:
            return {}
        return {"reference_wer": wer(list(reference), data.extra["references"])[0]}

    def samples(
        self, reference: list[str], outputs: list[str], data: Data, cfg: SpeechConfig
    ) -> dict[str, Sample]:
        found = {"wer": wer(outputs, list(reference))[1]}
        if "references" in data.extra:
            found["reference_wer"] = wer(outputs, data.extra["references"])[1]
        return found

    def limits(self) -> Limits:
        t = self.options.thresholds
        out = {"wer": ("<=", t.max_wer)}
        if t.max_reference_wer is not None:
            out["reference_wer"] = ("<=", t.max_reference_wer)
        return out
