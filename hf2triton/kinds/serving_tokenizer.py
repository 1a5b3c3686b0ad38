"""The served translator's tokenizer: the files it reads written from the model's own tokenizer
(a fast tokenizer.json, or M2M100's and Marian's sentencepiece models), and a check that it
encodes and decodes exactly as transformers does."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from hf2triton.errors import UnsupportedModelError
from hf2triton.kinds.generation_config import load_tokenizer
from hf2triton.serving.seq2seq import Seq2SeqTokenizer


def write_serving_tokenizer(
    model_dir: str | Path, out: Path, source_lang: str | None
) -> dict[str, Any]:
    """Write the files the served tokenizer reads into `out`; return its plan."""
    tok = load_tokenizer(model_dir, source_lang)
    out.mkdir(parents=True, exist_ok=True)
    clean = bool(getattr(tok, "clean_up_tokenization_spaces", False))
    if tok.is_fast:
        tok.backend_tokenizer.save(str(out / "tokenizer.json"))
        return {
            "kind": "tokenizers",
            "file": "tokenizer.json",
            "clean_up_tokenization_spaces": clean,
        }
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
        "kind": "sentencepiece",
        "spm_source": "source.spm",
        "spm_target": "target.spm",
        "vocab": "vocab.json",
        "tokens": "tokens.json",
        "unk_id": int(tok.unk_token_id),
        "prefix": sentinel[:at],
        "suffix": sentinel[at + 1 :],
        "special_tokens": list(tok.all_special_tokens),
        "skip_ids": [int(i) for i in tok.all_special_ids],
        "style": style,
        "clean_up_tokenization_spaces": clean,
    }


def same_encoding(text: str, got: Any, want: Any) -> None:
    """Refuse a served tokenizer that encodes `text` as `got` where transformers gives `want`."""
    if list(got) != list(want):
        raise UnsupportedModelError(
            f"the served tokenizer encodes {text[:40]!r} as {list(got)[:12]}... but "
            f"transformers as {list(want)[:12]}...; this tokenizer cannot be served faithfully"
        )


def check_tokenizer(
    served: Seq2SeqTokenizer, tok, texts: list[str], generated: list[list[int]]
) -> None:
    """The served tokenizer must encode and decode exactly as transformers does."""
    ids, _ = served.encode(texts)
    want = tok(texts, truncation=True, max_length=served.max_length)["input_ids"]
    for text, got, exp in zip(texts, ids, want, strict=True):
        same_encoding(text, got, exp)
    got_text = served.decode(generated)
    exp_text = tok.batch_decode(generated, skip_special_tokens=True)
    for seq, a, b in zip(generated, got_text, exp_text):
        if a != b:
            raise UnsupportedModelError(
                f"the served tokenizer decodes {seq[:12]}... as {a[:40]!r} but transformers as "
                f"{b[:40]!r}; this tokenizer cannot be served faithfully"
            )
