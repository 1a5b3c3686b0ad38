"""Served translation: TEXT [batch, 1] in, with optional per-text MAX_NEW_TOKENS, NUM_BEAMS
(INT32) and TARGET_LANG (BYTES); TRANSLATION [batch, 1] and TRUNCATED [batch, 1] out. Texts with
the same decoding settings are generated together, in token-aware sub-batches; the decoding
itself is seq2seq.py and decoding.py (ported from transformers' `generate`), on the runtime
serving.json names."""

from __future__ import annotations

from typing import Any

import numpy as np

from . import seq2seq
from .base import TEXT, TRUNCATED, ServedModel, Tensor, column, int_column, text_column, texts
from .decoding import DecodeSettings
from .text import plan_sub_batches


class Translator(ServedModel):
    # TEXT is required; the others are optional per-request overrides of the release's
    # defaults (serving.json), one value per text.
    inputs = (
        TEXT,
        Tensor("MAX_NEW_TOKENS", "INT32", optional=True),
        Tensor("NUM_BEAMS", "INT32", optional=True),
        Tensor("TARGET_LANG", "STRING", optional=True),
    )
    outputs = (Tensor("TRANSLATION", "STRING"), TRUNCATED)

    def __init__(self, directory: str, settings: dict[str, Any]):
        self.tokenizer, self.model, self.defaults = seq2seq.load_serving(
            directory, settings, threads=int(settings.get("intra_op_threads", 0))
        )
        self.target_langs = {k: int(v) for k, v in settings.get("target_langs", {}).items()}
        self.max_new_tokens_limit = int(settings["max_new_tokens_limit"])
        self.max_beams = int(settings.get("max_beams", 16))
        self.max_batch_tokens = int(settings.get("max_batch_tokens", 0))

    @classmethod
    def from_directory(cls, directory: str, settings: dict[str, Any]) -> Translator:
        return cls(directory, settings)

    def parse(self, arrays: dict[str, np.ndarray]) -> list[tuple[str, DecodeSettings]]:
        rows = text_column(arrays, "TEXT")
        n = len(rows)
        max_new = int_column(arrays, "MAX_NEW_TOKENS", n)
        beams = int_column(arrays, "NUM_BEAMS", n)
        lang_arr = column(arrays, "TARGET_LANG", required=False)
        if lang_arr is not None and lang_arr.shape != (n, 1):
            raise ValueError(
                f"TARGET_LANG needs one value per text: shape [{n}, 1], got {list(lang_arr.shape)}"
            )
        langs = (
            [r[0] for r in texts(lang_arr, "TARGET_LANG")] if lang_arr is not None else [None] * n
        )
        out = []
        for text, m, b, lang in zip(rows, max_new, beams, langs):
            if m is not None and not 1 <= m <= self.max_new_tokens_limit:
                raise ValueError(f"MAX_NEW_TOKENS {m} is outside 1..{self.max_new_tokens_limit}")
            if b is not None and not 1 <= b <= self.max_beams:
                raise ValueError(f"NUM_BEAMS {b} is outside 1..{self.max_beams}")
            bos = None
            if lang:
                if lang not in self.target_langs:
                    known = ", ".join(sorted(self.target_langs)[:20]) or "none"
                    raise ValueError(
                        f"TARGET_LANG {lang!r} is not one of this model's target "
                        f"languages ({known})"
                    )
                bos = self.target_langs[lang]
            out.append((text, self.defaults.with_request(m, b, bos)))
        return out

    def run(self, rows: list[tuple[str, DecodeSettings]]) -> dict[str, list[np.ndarray]]:
        ids, cut = self.tokenizer.encode([text for text, _ in rows])
        translated: list[str] = [""] * len(rows)
        groups: dict[tuple, list[int]] = {}  # texts with the same decoding settings go together
        for k, (_, s) in enumerate(rows):
            groups.setdefault((s.max_new_tokens, s.num_beams, s.forced_bos_token_id), []).append(k)
        for members in groups.values():
            settings = rows[members[0]][1]
            lengths = [len(ids[k]) for k in members]
            for part in plan_sub_batches(lengths, self.max_batch_tokens):
                chosen = [members[i] for i in part]
                generated = self.model.generate(
                    [ids[k] for k in chosen], settings, settings.pad_token_id
                )
                for k, text in zip(chosen, self.tokenizer.decode(generated)):
                    translated[k] = text
        return {
            "TRANSLATION": [np.array([t.encode("utf-8")], dtype=np.object_) for t in translated],
            "TRUNCATED": [np.array([c], dtype=bool) for c in cut],
        }

    def translate(self, texts_: list[str], num_beams: int | None = None) -> list[str]:
        """Translations of `texts_` run as one dynamic batch (the gate's in-process path)."""
        s = self.defaults.with_request(num_beams=num_beams)
        out = self.run([(t, s) for t in texts_])["TRANSLATION"]
        return [row[0].decode("utf-8") for row in out]
