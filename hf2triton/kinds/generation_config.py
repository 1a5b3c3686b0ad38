"""How a sequence-to-sequence model generates: its generation config read, checked against what
the served decoder implements (hf2triton.serving.seq2seq), and overridden by the spec's
`generation:` section."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import Field, model_validator

from hf2triton.errors import SpecError, UnsupportedModelError
from hf2triton.kinds.data import model_max_length
from hf2triton.serving.seq2seq import DecodeSettings
from hf2triton.util.specbase import MaxLength, SpecPath, Strict, unless

# GenerationConfig fields the served decoder implements (hf2triton.serving.decoding.process_scores).
# Any other field that changes greedy or beam search is refused when it differs from its default.
UNSUPPORTED = (
    "min_new_tokens",
    "encoder_repetition_penalty",
    "renormalize_logits",
    "remove_invalid_values",
    "exponential_decay_length_penalty",
    "suppress_tokens",
    "begin_suppress_tokens",
    "sequence_bias",
    "guidance_scale",
    "encoder_no_repeat_ngram_size",
    "diversity_penalty",
    "num_beam_groups",
    "constraints",
    "force_words_ids",
    "stop_strings",
    "watermarking_config",
    "penalty_alpha",
    "dola_layers",
    "forced_decoder_ids",
    "token_healing",
)


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
        None,
        description="target language code; M2M100-style models force it as the first "
        "generated token (forced BOS). Required when the model translates into many languages",
    )
    max_new_tokens: int | None = Field(
        None, ge=1, le=4096, description="default: the model's generation_config max_length - 1"
    )
    num_beams: int | None = Field(
        None, ge=1, le=16, description="default: the model's generation_config (1: greedy)"
    )
    max_input_length: MaxLength = Field(
        None, description="source truncation length; default: the model's"
    )
    thresholds: GenerationThresholds = GenerationThresholds()
    references: SpecPath | None = Field(
        None,
        description="UTF-8 file of reference translations, one per line of "
        "validation.sentences: BLEU and chrF against them are measured and reported",
    )

    @model_validator(mode="after")
    def _reference_gates_need_references(self) -> GenerationSpec:
        t = self.thresholds
        wanted = t.min_reference_bleu is not None or t.min_reference_chrf is not None
        return unless(
            wanted and self.references is None,
            self,
            "thresholds.min_reference_bleu/min_reference_chrf need reference "
            "translations: give generation.references",
        )


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


def model_generation_config(
    model_dir: str | Path,
    config: Any,
    what: str,
    also_refused: tuple[str, ...] = (),
    allowed: tuple[str, ...] = (),
) -> Any:
    """The model's GenerationConfig (from its config where it has none), refused when it sets
    a field the served decoder does not implement (UNSUPPORTED but `allowed`, and
    `also_refused`): its `what` would differ from PyTorch's. Shared by translation and text
    generation."""
    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(str(model_dir))
    except OSError:
        gen = GenerationConfig.from_model_config(config)
    default = GenerationConfig()
    odd = [
        k
        for k in (*UNSUPPORTED, *also_refused)
        if k not in allowed and getattr(gen, k, None) != getattr(default, k, None)
    ]
    if odd:
        raise UnsupportedModelError(
            f"the model's generation config sets {odd}, which the served decoder does not "
            f"implement; its {what} would differ from PyTorch's"
        )
    return gen


def eos_and_pad(gen: Any, config: Any) -> tuple[list[int], int]:
    """End-of-sequence ids and the pad id, from the generation config, else the model config
    (pad: the first eos where the model has none)."""
    eos = gen.eos_token_id if gen.eos_token_id is not None else config.eos_token_id
    eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos]) if e is not None]
    pad = gen.pad_token_id if gen.pad_token_id is not None else config.pad_token_id
    return eos_ids, int(pad if pad is not None else (eos_ids or [0])[0])


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


def resolve_translation_config(model_dir: str | Path, spec: GenerationSpec) -> TranslationConfig:
    """Decoding settings from the model's generation config, overridden by the spec's
    `generation:` section; refuses settings the served decoder does not implement."""
    from transformers import AutoConfig

    model_dir = Path(model_dir)
    config = AutoConfig.from_pretrained(str(model_dir))
    if not getattr(config, "is_encoder_decoder", False):
        raise UnsupportedModelError(
            f"{model_dir} ({config.model_type}) is not an encoder-decoder model: task "
            "'translation' serves text2text-generation models such as M2M100 or Marian"
        )
    gen = model_generation_config(model_dir, config, "translations")
    tok = load_tokenizer(model_dir, spec.source_lang)
    langs = _language_ids(tok)
    bos = forced_bos(spec.target_lang, langs, gen, tok, model_dir.name)
    start = gen.decoder_start_token_id
    if start is None:
        start = config.decoder_start_token_id
    if start is None:
        raise UnsupportedModelError(f"{model_dir}: no decoder_start_token_id in its config")
    limit = decoder_positions(config)
    max_new = spec.max_new_tokens or min(limit, max(1, int(gen.max_length or 20) - 1))
    if max_new > limit:
        raise SpecError(
            f"generation.max_new_tokens {max_new} is more than this model's decoder can "
            f"position ({limit}); lower it"
        )
    settings = decode_settings(
        gen,
        config,
        start=int(start),
        bos=bos,
        max_new=int(max_new),
        num_beams=int(spec.num_beams or gen.num_beams or 1),
    )
    max_input = spec.max_input_length or model_max_length(model_dir)
    return TranslationConfig(
        source_lang=spec.source_lang,
        target_lang=spec.target_lang,
        target_langs=langs,
        max_input_length=int(max_input),
        max_new_tokens_limit=limit,
        decode=settings.to_dict(),
    )


def forced_bos(
    target_lang: str | None, langs: dict[str, int], gen: Any, tok: Any, model: str
) -> int | None:
    """The token every translation starts with: the spec's target language's, else the model's
    own forced BOS; SpecError for a language the tokenizer lacks, or none chosen where the model
    translates into many."""
    if target_lang is not None:
        if target_lang not in langs:
            raise SpecError(
                f"generation.target_lang {target_lang!r} is not a target language of this "
                f"model's tokenizer ({type(tok).__name__}): "
                + (f"use one of {sorted(langs)[:12]}..." if langs else "remove the key")
            )
        return langs[target_lang]
    if langs and gen.forced_bos_token_id is None:
        raise SpecError(
            f"generation.target_lang is required: {model} translates into "
            f"{len(langs)} languages (e.g. {', '.join(sorted(langs)[:6])})"
        )
    return gen.forced_bos_token_id


def decoder_positions(config: Any) -> int:
    """The most new tokens the decoder can position. A few positions stay free: M2M100 and
    BART offset theirs by 2, and the start token is one."""
    positions = (
        getattr(config, "max_target_positions", None)
        or getattr(config, "max_position_embeddings", None)
        or 1024
    )
    return max(1, min(int(positions) - 3, 4096))


def model_processors(gen: Any, repetition_penalty: float | None = None) -> dict[str, Any]:
    """The logits processors of the model's generation config the served decoder applies (the
    repetition penalty `repetition_penalty` when given, e.g. the spec's), as DecodeSettings'
    fields: one place for every kind that decodes."""
    return {
        "min_length": int(gen.min_length or 0),
        "no_repeat_ngram_size": int(gen.no_repeat_ngram_size or 0),
        "repetition_penalty": repetition_penalty or float(gen.repetition_penalty or 1.0),
        "bad_words_ids": [list(map(int, b)) for b in (gen.bad_words_ids or [])],
    }


def decode_settings(
    gen: Any, config: Any, *, start: int, bos: int | None, max_new: int, num_beams: int
) -> DecodeSettings:
    """The served decoder's settings: the model's generation config (its logits processors, its
    forced EOS), each translation started with `start` then `bos` and at most `max_new` tokens
    long, searched with `num_beams` beams."""
    eos_ids, pad = eos_and_pad(gen, config)
    forced_eos = gen.forced_eos_token_id
    if forced_eos is not None and not isinstance(forced_eos, list):
        forced_eos = [forced_eos]
    return DecodeSettings(
        decoder_start_token_id=start,
        eos_token_ids=eos_ids,
        pad_token_id=pad,
        max_new_tokens=max_new,
        num_beams=num_beams,
        forced_bos_token_id=None if bos is None else int(bos),
        forced_eos_token_id=forced_eos,
        **model_processors(gen),
        length_penalty=float(gen.length_penalty if gen.length_penalty is not None else 1.0),
        early_stopping=gen.early_stopping,
    )
