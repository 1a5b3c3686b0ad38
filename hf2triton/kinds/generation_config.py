"""How a sequence-to-sequence model generates: its generation config read, checked against what
the served decoder implements (hf2triton.serving.seq2seq), and overridden by the spec's
`generation:` section."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hf2triton.errors import SpecError, UnsupportedModelError
from hf2triton.kinds.base import model_max_length
from hf2triton.serving.seq2seq import DecodeSettings

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


def resolve_translation_config(model_dir: str | Path, spec: Any) -> TranslationConfig:
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
    eos_ids, pad = eos_and_pad(gen, config)
    start = gen.decoder_start_token_id
    if start is None:
        start = config.decoder_start_token_id
    if start is None:
        raise UnsupportedModelError(f"{model_dir}: no decoder_start_token_id in its config")
    positions = (
        getattr(config, "max_target_positions", None)
        or getattr(config, "max_position_embeddings", None)
        or 1024
    )
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
        decoder_start_token_id=int(start),
        eos_token_ids=eos_ids,
        pad_token_id=pad,
        max_new_tokens=int(max_new),
        num_beams=int(spec.num_beams or gen.num_beams or 1),
        forced_bos_token_id=None if forced_bos is None else int(forced_bos),
        forced_eos_token_id=forced_eos,
        min_length=int(gen.min_length or 0),
        no_repeat_ngram_size=int(gen.no_repeat_ngram_size or 0),
        repetition_penalty=float(gen.repetition_penalty or 1.0),
        bad_words_ids=[list(map(int, b)) for b in (gen.bad_words_ids or [])],
        length_penalty=float(gen.length_penalty if gen.length_penalty is not None else 1.0),
        early_stopping=gen.early_stopping,
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
