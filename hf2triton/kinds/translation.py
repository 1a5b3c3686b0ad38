"""Kind `translation` (`task: translation`): encoder-decoder models (M2M100, Marian, ...)
served with greedy or beam search on ONNX Runtime (hf2triton.serving.seq2seq, ported from
transformers' `generate`). The gate scores served translations with sacreBLEU BLEU and chrF
against PyTorch `generate`'s, and against reference translations when the spec gives them.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import numpy as np
from pydantic import Field, model_validator

from hf2triton.errors import ExportError, SpecError, UnsupportedModelError
from hf2triton.kinds.base import Data, Limits, ModelKind, read_lines
from hf2triton.kinds.embedding import model_max_length
from hf2triton.kinds.torch_reference import batched
from hf2triton.serving.seq2seq import ONNX_FILES, DecodeSettings, OrtSeq2Seq, Seq2SeqTokenizer
from hf2triton.specbase import MaxLength, SpecPath, Strict, unless


Bleu = Annotated[float, Field(ge=0.0, le=100.0)]


class GenerationThresholds(Strict):
    """sacrebleu scores (0-100) of the candidate's translations."""

    min_bleu: Bleu = Field(90.0, description="BLEU against the fp32 PyTorch translations")
    min_chrf: Bleu = Field(95.0, description="chrF against the fp32 PyTorch translations")
    min_reference_bleu: Bleu | None = Field(
        None, description="BLEU against `references`; needs `references`"
    )
    min_reference_chrf: Bleu | None = Field(
        None, description="chrF against `references`; needs `references`"
    )


class GenerationSpec(Strict):
    """`task: translation`: how the served model generates (the defaults of every request)."""

    source_lang: str | None = Field(
        None, description="source language code for multilingual tokenizers (M2M100: 'en')"
    )
    target_lang: str | None = Field(
        None, description="target language code; M2M100-style models force it as the first "
        "generated token (forced BOS). Required when the model translates into many languages"
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=4096, description="default: the model's generation_config max_length - 1"
    )
    num_beams: int | None = Field(
        None, ge=1, le=16, description="default: the model's generation_config (1: greedy)"
    )
    max_input_length: MaxLength = Field(None, description="source truncation length; default: "
                                       "the model's")
    thresholds: GenerationThresholds = GenerationThresholds()
    references: SpecPath | None = Field(
        None, description="UTF-8 file of reference translations, one per line of "
        "validation.sentences: BLEU and chrF against them are measured and reported")

    @model_validator(mode="after")
    def _reference_gates_need_references(self) -> GenerationSpec:
        t = self.thresholds
        wanted = t.min_reference_bleu is not None or t.min_reference_chrf is not None
        return unless(wanted and self.references is None, self,
                       "thresholds.min_reference_bleu/min_reference_chrf need reference "
                       "translations: give generation.references")

# GenerationConfig fields the served decoder implements (hf2triton.seq2seq.process_scores).
# Any other field that changes greedy or beam search is refused when it differs from its default.
UNSUPPORTED = (
    "min_new_tokens", "encoder_repetition_penalty", "renormalize_logits",
    "remove_invalid_values", "exponential_decay_length_penalty", "suppress_tokens",
    "begin_suppress_tokens", "sequence_bias", "guidance_scale", "encoder_no_repeat_ngram_size",
    "diversity_penalty", "num_beam_groups", "constraints", "force_words_ids", "stop_strings",
    "watermarking_config", "penalty_alpha", "dola_layers", "forced_decoder_ids", "token_healing",
)
TOKENIZER_DIR = "serving-tokenizer"  # written by export, beside the ONNX files


@dataclass(frozen=True)
class TranslationConfig:
    """Everything the served translator needs besides its ONNX files; goes into serving.json."""

    source_lang: str | None
    target_lang: str | None
    target_langs: dict[str, int]  # language code -> forced BOS token id (per-request choice)
    max_input_length: int
    max_new_tokens_limit: int  # what a request may ask for: the decoder's positions allow it
    decode: dict[str, Any]  # DecodeSettings.to_dict()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def settings(self) -> DecodeSettings:
        return DecodeSettings.from_dict(self.decode)


def load_tokenizer(model_dir: str | Path, source_lang: str | None = None):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if source_lang is not None:
        if not hasattr(tok, "src_lang"):
            raise SpecError(
                f"generation.source_lang {source_lang!r}: this model's tokenizer "
                f"({type(tok).__name__}) has no source language to set; remove the key"
            )
        try:
            tok.src_lang = source_lang
        except (KeyError, ValueError):
            raise SpecError(
                f"generation.source_lang {source_lang!r} is not a language of this model's "
                f"tokenizer ({type(tok).__name__})"
            ) from None
    return tok


def _language_ids(tok) -> dict[str, int]:
    table = getattr(tok, "lang_code_to_id", None)
    if isinstance(table, dict) and table:
        return {str(k): int(v) for k, v in table.items()}
    return {}


def resolve_translation_config(model_dir: str | Path, spec: Any) -> TranslationConfig:
    """Decoding settings from the model's generation config, overridden by the spec's
    `generation:` section; refuses settings the served decoder does not implement."""
    from transformers import AutoConfig, GenerationConfig

    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir))
    if not getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{model_dir} ({config.model_type}) is not an encoder-decoder model: task "
            "'translation' serves text2text-generation models such as M2M100 or Marian"
        )
    try:
        gen = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:
        gen = GenerationConfig.from_model_config(config)
    default = GenerationConfig()
    odd = [k for k in UNSUPPORTED if getattr(gen, k, None) != getattr(default, k, None)]
    if odd:
        raise UnsupportedModelError(
            f"the model's generation config sets {odd}, which the served decoder does not "
            "implement; its translations would differ from PyTorch's"
        )
    tok = load_tokenizer(model_dir, spec.source_lang)
    langs = _language_ids(tok)
    forced_bos = gen.forced_bos_token_id
    if spec.target_lang is not None:
        if spec.target_lang not in langs:
            raise SpecError(
                f"generation.target_lang {spec.target_lang!r} is not a target language of this "
                f"model's tokenizer ({type(tok).__name__}): "
                + (f"use one of {sorted(langs)[:12]}..." if langs else "remove the key")
            )
        forced_bos = langs[spec.target_lang]
    elif langs and forced_bos is None:
        raise SpecError(
            f"generation.target_lang is required: {model_dir.name} translates into "
            f"{len(langs)} languages (e.g. {', '.join(sorted(langs)[:6])})"
        )
    eos = gen.eos_token_id if gen.eos_token_id is not None else config.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    pad = gen.pad_token_id if gen.pad_token_id is not None else config.pad_token_id
    start = gen.decoder_start_token_id
    if start is None:
        start = config.decoder_start_token_id
    if start is None:
        raise UnsupportedModelError(f"{model_dir}: no decoder_start_token_id in its config")
    positions = getattr(config, "max_target_positions", None) or getattr(
        config, "max_position_embeddings", None) or 1024
    # A few positions stay free: M2M100 and BART offset theirs by 2, and the start token is one.
    limit = max(1, min(int(positions) - 3, 4096))
    max_new = spec.max_new_tokens or min(limit, max(1, int(gen.max_length or 20) - 1))
    if max_new > limit:
        raise SpecError(
            f"generation.max_new_tokens {max_new} is more than this model's decoder can "
            f"position ({limit}); lower it"
        )
    forced_eos = gen.forced_eos_token_id
    if forced_eos is not None and not isinstance(forced_eos, list):
        forced_eos = [forced_eos]
    settings = DecodeSettings(
        decoder_start_token_id=int(start), eos_token_ids=eos_ids,
        pad_token_id=int(pad if pad is not None else eos_ids[0]), max_new_tokens=int(max_new),
        num_beams=int(spec.num_beams or gen.num_beams or 1),
        forced_bos_token_id=None if forced_bos is None else int(forced_bos),
        forced_eos_token_id=forced_eos, min_length=int(gen.min_length or 0),
        no_repeat_ngram_size=int(gen.no_repeat_ngram_size or 0),
        repetition_penalty=float(gen.repetition_penalty or 1.0),
        bad_words_ids=[list(map(int, b)) for b in (gen.bad_words_ids or [])],
        length_penalty=float(gen.length_penalty if gen.length_penalty is not None else 1.0),
        early_stopping=gen.early_stopping,
    )
    max_input = spec.max_input_length or model_max_length(model_dir)
    return TranslationConfig(
        source_lang=spec.source_lang, target_lang=spec.target_lang, target_langs=langs,
        max_input_length=int(max_input), max_new_tokens_limit=limit, decode=settings.to_dict(),
    )


def write_serving_tokenizer(model_dir: str | Path, out: Path,
                            source_lang: str | None) -> dict[str, Any]:
    """Write the files the served tokenizer reads into `out`; return its plan."""
    tok = load_tokenizer(model_dir, source_lang)
    out.mkdir(parents=True, exist_ok=True)
    clean = bool(getattr(tok, "clean_up_tokenization_spaces", False))
    if tok.is_fast:
        tok.backend_tokenizer.save(str(out / "tokenizer.json"))
        return {"kind": "tokenizers", "file": "tokenizer.json",
                "clean_up_tokenization_spaces": clean}
    name = type(tok).__name__
    if name == "M2M100Tokenizer":
        spm_source = spm_target = tok.spm_file
        style = "m2m100"
    elif name == "MarianTokenizer":
        if getattr(tok, "separate_vocabs", False):
            raise UnsupportedModelError(
                "Marian models with separate source and target vocabularies are not served yet"
            )
        spm_source, spm_target = tok.spm_files
        style = "marian"
    else:
        raise UnsupportedModelError(
            f"the served translator reads fast tokenizers (tokenizer.json) and the "
            f"sentencepiece tokenizers of M2M100 and Marian; this model's is {name}"
        )
    shutil.copyfile(spm_source, out / "source.spm")
    shutil.copyfile(spm_target, out / "target.spm")
    vocab = {**tok.get_vocab(), **getattr(tok, "lang_token_to_id", {})}
    (out / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    # Decoding goes id -> token as transformers does (ids past the vocabulary become unk).
    from transformers import AutoConfig

    size = max(int(AutoConfig.from_pretrained(str(model_dir)).vocab_size), len(tok))
    tokens = tok.convert_ids_to_tokens(list(range(size)))
    (out / "tokens.json").write_text(json.dumps(tokens, ensure_ascii=False), encoding="utf-8")
    sentinel = tok.build_inputs_with_special_tokens([-7])
    at = sentinel.index(-7)
    return {
        "kind": "sentencepiece", "spm_source": "source.spm", "spm_target": "target.spm",
        "vocab": "vocab.json", "tokens": "tokens.json", "unk_id": int(tok.unk_token_id),
        "prefix": sentinel[:at], "suffix": sentinel[at + 1:],
        "special_tokens": list(tok.all_special_tokens),
        "skip_ids": [int(i) for i in tok.all_special_ids], "style": style,
        "clean_up_tokenization_spaces": clean,
    }


def check_tokenizer(served: Seq2SeqTokenizer, tok, texts: list[str],
                    generated: list[list[int]]) -> None:
    """The served tokenizer must encode and decode exactly as transformers does."""
    ids, _ = served.encode(texts)
    want = tok(texts, truncation=True, max_length=served.max_length)["input_ids"]
    for text, got, exp in zip(texts, ids, want):
        if list(got) != list(exp):
            raise UnsupportedModelError(
                f"the served tokenizer encodes {text[:40]!r} as {got[:12]}... but transformers "
                f"as {list(exp)[:12]}...; this tokenizer cannot be served faithfully"
            )
    got_text = served.decode(generated)
    exp_text = tok.batch_decode(generated, skip_special_tokens=True)
    for seq, a, b in zip(generated, got_text, exp_text):
        if a != b:
            raise UnsupportedModelError(
                f"the served tokenizer decodes {seq[:12]}... as {a[:40]!r} but transformers as "
                f"{b[:40]!r}; this tokenizer cannot be served faithfully"
            )


class TorchTranslator:
    """The original PyTorch model and `generate`: the reference."""

    def __init__(self, model_dir: str | Path, cfg: TranslationConfig):
        import torch
        from transformers import AutoModelForSeq2SeqLM

        self._torch = torch
        self.cfg = cfg
        self.tokenizer = load_tokenizer(model_dir, cfg.source_lang)
        self.model = AutoModelForSeq2SeqLM.from_pretrained(str(model_dir)).eval()

    def generate(self, texts: list[str], num_beams: int | None = None,
                 batch_size: int = 16) -> list[list[int]]:
        s = self.cfg.settings
        kwargs = dict(
            do_sample=False, num_beams=num_beams or s.num_beams, max_new_tokens=s.max_new_tokens,
            num_return_sequences=1, decoder_start_token_id=s.decoder_start_token_id,
            eos_token_id=s.eos_token_ids, pad_token_id=s.pad_token_id,
            forced_bos_token_id=s.forced_bos_token_id, forced_eos_token_id=s.forced_eos_token_id,
            min_length=s.min_length, no_repeat_ngram_size=s.no_repeat_ngram_size,
            repetition_penalty=s.repetition_penalty, bad_words_ids=s.bad_words_ids or None,
            length_penalty=s.length_penalty, early_stopping=s.early_stopping,
        )
        out: list[list[int]] = []
        for chunk in batched(texts, batch_size):
            enc = self.tokenizer(chunk, padding=True, truncation=True,
                                 max_length=self.cfg.max_input_length, return_tensors="pt")
            with self._torch.inference_mode():
                ids = self.model.generate(**enc, **kwargs)
            out.extend(ids.tolist())
        return out

    def decode(self, sequences: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=True)


def strip_pad(seq: list[int], pad: int) -> list[int]:
    """A generated sequence without the padding `generate` appends to shorter rows."""
    end = len(seq)
    while end > 1 and seq[end - 1] == pad:
        end -= 1
    return list(seq[:end])


def bleu_chrf(hypotheses: list[str], references: list[str]) -> tuple[float, float]:
    """Corpus BLEU and chrF (sacrebleu defaults). Two identical corpora score 100 and 100."""
    import sacrebleu

    if hypotheses == references:
        return 100.0, 100.0  # sacrebleu gives 0 BLEU for identical empty strings
    bleu = sacrebleu.corpus_bleu(hypotheses, [references]).score
    chrf = sacrebleu.corpus_chrf(hypotheses, [references]).score
    return float(bleu), float(chrf)


def serving_files(directory: str | Path) -> dict[str, str]:
    """The ONNX files the served translator runs, by role, in `directory`."""
    return {role: str(Path(directory) / name) for role, name in ONNX_FILES.items()}


def compare_translation(model_dir: str, export_dir: Path, cfg: TranslationConfig,
                        sentences: list[str]) -> dict[str, Any]:
    """Check an fp32 export: encoder states within reach of PyTorch's (largest |diff|), greedy
    ORT generation equal to PyTorch `generate` token for token, and the served tokenizer equal to
    transformers'. Returns the figures; raises on a tokenizer that cannot be served."""
    reference = TorchTranslator(model_dir, cfg)
    plan = json.loads((export_dir / TOKENIZER_DIR / "plan.json").read_text())
    served = Seq2SeqTokenizer(str(export_dir / TOKENIZER_DIR), plan, cfg.max_input_length)
    model = OrtSeq2Seq(serving_files(export_dir))
    worst = 0.0
    torch = reference._torch
    for chunk in batched(sentences, 8):
        enc = reference.tokenizer(chunk, padding=True, truncation=True,
                                  max_length=cfg.max_input_length, return_tensors="np")
        with torch.inference_mode():
            want = reference.model.get_encoder()(
                input_ids=torch.from_numpy(enc["input_ids"]),
                attention_mask=torch.from_numpy(enc["attention_mask"]),
            ).last_hidden_state.float().numpy()
        got = model.encode(enc["input_ids"].astype(np.int64),
                           enc["attention_mask"].astype(np.int64))
        mask = enc["attention_mask"].astype(bool)
        diff = np.abs(want - got)[mask]
        worst = max(worst, float(diff.max()) if np.isfinite(diff).all() else float("inf"))
    greedy = cfg.settings.with_request(num_beams=1)
    want_ids = reference.generate(sentences, num_beams=1)
    check_tokenizer(served, reference.tokenizer, sentences, want_ids)
    ids, _ = served.encode(sentences)
    got_ids = [g for chunk in batched(ids, 8)
               for g in model.generate(chunk, greedy, greedy.pad_token_id)]
    pad = greedy.pad_token_id
    differ = [i for i, (a, b) in enumerate(zip(got_ids, want_ids))
              if strip_pad(a, pad) != strip_pad(b, pad)]
    return {"max_abs_diff": worst, "greedy_mismatches": len(differ),
            "first_mismatch": sentences[differ[0]] if differ else None}


def onnx_files_with_data(directory: str | Path) -> dict[str, Path]:
    """The served ONNX files of a seq2seq export or variant, with their external data files."""
    files: dict[str, Path] = {}
    for name in ONNX_FILES.values():
        src = Path(directory) / name
        for p in [src, *(q for q in src.parent.iterdir()
                         if q.name.startswith(name) and q.name != name)]:
            files[p.name] = p
    return files


class TranslationKind(ModelKind):
    name = "translation"
    task = "translation"
    section = "generation"
    Options = GenerationSpec
    onnx_task = "text2text-generation-with-past"  # encoder, decoder and decoder-with-past
    serving_class = "Translator"
    serving_modules = ("base", "text", "seq2seq", "translation")
    main_file = ONNX_FILES["encoder"]
    tunable = False  # generation load is another kind of traffic; not searched
    item_word = "sentences"

    def resolve(self, model_dir: str) -> TranslationConfig:
        return resolve_translation_config(model_dir, self.options)

    def read_data(self) -> Data:
        items = read_lines(self.spec.validation.sentences, "validation.sentences")
        extra = {}
        if self.options.references:
            refs = read_lines(self.options.references, "generation.references", "translations")
            if len(refs) != len(items):
                raise SpecError(
                    f"generation.references {self.options.references!r} has {len(refs)} "
                    f"translations for {len(items)} validation sentences: give one per "
                    "non-empty line of validation.sentences")
            extra["references"] = refs
        return Data(items, extra)

    def export_inputs(self, data: Data) -> list[str]:
        longest = sorted(data.items, key=len, reverse=True)[:4]
        return list(dict.fromkeys([*data.items[:20], *longest]))

    def prepare_export(self, model_dir: str, out: Path, cfg: TranslationConfig) -> None:
        plan = write_serving_tokenizer(model_dir, out / TOKENIZER_DIR, cfg.source_lang)
        (out / TOKENIZER_DIR / "plan.json").write_text(json.dumps(plan, indent=1))

    def check_export(self, model_dir: str, out: Path, cfg: TranslationConfig,
                     inputs: list[str]) -> dict[str, float]:
        found = compare_translation(model_dir, out, cfg, inputs)
        if found["greedy_mismatches"]:
            raise ExportError(
                f"greedy generation with the fp32 ONNX files differs from PyTorch generate on "
                f"{found['greedy_mismatches']} of {len(inputs)} sentences (first: "
                f"{found['first_mismatch'][:40]!r}); try another export.opset or report the "
                "model")
        return {"max_abs_diff": found["max_abs_diff"]}

    def settings(self, cfg: TranslationConfig, export_dir: str) -> dict[str, Any]:
        plan = json.loads((Path(export_dir) / TOKENIZER_DIR / "plan.json").read_text())
        return {"tokenizer": plan, "max_input_length": cfg.max_input_length,
                "decode": cfg.decode, "target_langs": cfg.target_langs,
                "max_new_tokens_limit": cfg.max_new_tokens_limit}

    def version_files(self, candidate: str, export_dir: str) -> dict[str, Path]:
        files = onnx_files_with_data(candidate)
        for p in sorted((Path(export_dir) / TOKENIZER_DIR).iterdir()):
            if p.is_file() and p.name != "plan.json":
                files[p.name] = p
        return files

    def file_settings(self, files: dict[str, str]) -> dict[str, Any]:
        some_tokenizer_file = next(v for k, v in files.items() if not k.endswith(".onnx")
                                   and ".onnx" not in k)
        return {"files": {role: files[name] for role, name in ONNX_FILES.items()},
                "tokenizer_dir": os.path.dirname(some_tokenizer_file)}

    def extract(self, answers: list[dict[str, np.ndarray]]) -> list[str]:
        return [(v.decode("utf-8") if isinstance(v, bytes) else str(v))
                for a in answers for v in a["TRANSLATION"][:, 0]]

    def reference(self, model_dir: str, cfg: TranslationConfig, data: Data) -> list[str]:
        model = TorchTranslator(model_dir, cfg)
        return model.decode(model.generate(data.items))

    def config_from_dict(self, data: dict[str, Any]) -> TranslationConfig:
        return TranslationConfig(**data)

    def score(self, reference: list[str], outputs: list[str], data: Data,
              cfg: TranslationConfig) -> tuple[dict[str, float], dict]:
        bleu, chrf = bleu_chrf(outputs, list(reference))
        same = [h == r for h, r in zip(outputs, reference)]
        metrics = {"bleu": bleu, "chrf": chrf, "exact_match": sum(same) / max(1, len(same))}
        if "references" in data.extra:
            metrics["reference_bleu"], metrics["reference_chrf"] = bleu_chrf(
                outputs, data.extra["references"])
        return metrics, {"differ": [
            {"text": str(data.items[i])[:200], "pytorch": reference[i][:200],
             "candidate": outputs[i][:200]} for i in range(len(same)) if not same[i]][:10]}

    def limits(self) -> Limits:
        t = self.options.thresholds
        out = {"bleu": (">=", t.min_bleu), "chrf": (">=", t.min_chrf)}
        if t.min_reference_bleu is not None:
            out["reference_bleu"] = (">=", t.min_reference_bleu)
        if t.min_reference_chrf is not None:
            out["reference_chrf"] = (">=", t.min_reference_chrf)
        return out

    def example(self, details: dict[str, Any]) -> str:
        first = (details.get("differ") or [None])[0]
        return (f"e.g. {first['text'][:40]!r} -> {first['candidate'][:40]!r}, PyTorch "
                f"{first['pytorch'][:40]!r}") if first else ""
