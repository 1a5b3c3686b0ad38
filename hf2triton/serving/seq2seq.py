"""Encoder-decoder models the served translator runs: their tokenizer, and their encoder and
decoder ONNX files opened by a runtime (runtimes/) as the step function that decoding.py's
greedy and beam search (ported from transformers' `generate`) call.

Part of the serving core (see the package's docstring): numpy, a runtime's library, and
sentencepiece or tokenizers (whichever the model's tokenizer needs) only.
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from . import decoding, runtimes
from .decoding import DecodeSettings

# ONNX files a text2text-generation-with-past export is served from (the merged decoder is not
# used: quantized merged decoders break on some ONNX Runtime versions and need an If node).
ONNX_FILES = {
    "encoder": "encoder_model.onnx",
    "decoder": "decoder_model.onnx",
    "decoder_with_past": "decoder_with_past_model.onnx",
}


# --- tokenization -------------------------------------------------------------------------------


# transformers' `clean_up_tokenization`, pattern by pattern, in its order.
CLEAN_UP = {
    " .": ".",
    " ?": "?",
    " !": "!",
    " ,": ",",
    " ' ": "'",
    " n't": "n't",
    " 'm": "'m",
    " 's": "'s",
    " 've": "'ve",
    " 're": "'re",
}


def clean_up_tokenization(text: str) -> str:
    """transformers' `clean_up_tokenization`, applied when the tokenizer asks for it."""
    for pattern, replacement in CLEAN_UP.items():
        text = text.replace(pattern, replacement)
    return text


def clean_up_tail(text: str) -> int:
    """How many trailing characters of a cleaned-up text a later token may still rewrite (a
    proper start of one of clean_up_tokenization's patterns, e.g. " '" before "s"): a stream
    holds them back, so the pieces it sent join to the whole text."""
    for n in range(min(max(map(len, CLEAN_UP)) - 1, len(text)), 0, -1):
        tail = text[-n:]
        if any(len(p) > n and p.startswith(tail) for p in CLEAN_UP):
            return n
    return 0


class Seq2SeqTokenizer:
    """Encode source texts to ids and decode generated ids, as transformers' tokenizer does.

    `plan` (a dict, stored in serving.json) names the files in `directory`:
    - kind "tokenizers": `file` is a tokenizer.json (fast tokenizer, post-processor included);
    - kind "sentencepiece": `spm_source`/`spm_target`, `vocab` (token -> id, added tokens
      included), `unk_id`, `prefix`/`suffix` ids around the pieces, `special_tokens` (strings
      decoded verbatim), `tokens` (id -> token), `skip_ids` (dropped when decoding) and `style`
      ("m2m100" or "marian", how pieces and special tokens are joined back into text).
    """

    def __init__(self, directory: str, plan: dict[str, Any], max_length: int):
        self.plan = plan
        self.max_length = int(max_length)
        self.clean_up = bool(plan.get("clean_up_tokenization_spaces", False))
        if plan["kind"] == "tokenizers":
            from tokenizers import Tokenizer

            self.fast = Tokenizer.from_file(os.path.join(directory, plan["file"]))
            self.fast.no_padding()
            self.fast.enable_truncation(max_length=self.max_length)
        elif plan["kind"] == "sentencepiece":
            import sentencepiece as spm

            self.sp_source = spm.SentencePieceProcessor(
                model_file=os.path.join(directory, plan["spm_source"])
            )
            self.sp_target = spm.SentencePieceProcessor(
                model_file=os.path.join(directory, plan["spm_target"])
            )
            with open(os.path.join(directory, plan["vocab"]), encoding="utf-8") as f:
                self.vocab: dict[str, int] = json.load(f)
            with open(os.path.join(directory, plan["tokens"]), encoding="utf-8") as f:
                self.tokens: list[str] = json.load(f)
            self.unk_id = int(plan["unk_id"])
            self.unk_token = self.tokens[self.unk_id]
            self.prefix, self.suffix = list(plan["prefix"]), list(plan["suffix"])
            self.special_tokens = set(plan["special_tokens"])
            self.skip_ids = set(plan["skip_ids"])
            self.style = plan["style"]
        else:
            raise ValueError(f"unknown tokenizer kind {plan['kind']!r}")

    def encode(self, texts: list[str]) -> tuple[list[list[int]], list[bool]]:
        """Token ids of each text (special tokens added) and whether it was truncated."""
        if self.plan["kind"] == "tokenizers":
            encs = self.fast.encode_batch(texts)
            return [e.ids for e in encs], [len(e.overflowing) > 0 for e in encs]
        room = self.max_length - len(self.prefix) - len(self.suffix)
        out, truncated = [], []
        for text in texts:
            pieces = self.sp_source.encode(text, out_type=str)
            ids = [self.vocab.get(p, self.unk_id) for p in pieces]
            truncated.append(len(ids) > room)
            out.append(self.prefix + ids[:room] + self.suffix)
        return out, truncated

    def decode(self, sequences: list[list[int]]) -> list[str]:
        """Texts of generated ids, special tokens skipped."""
        if self.plan["kind"] == "tokenizers":
            texts = self.fast.decode_batch(sequences, skip_special_tokens=True)
        else:
            texts = [self._decode_pieces(ids) for ids in sequences]
        return [clean_up_tokenization(t) if self.clean_up else t for t in texts]

    def _decode_pieces(self, ids: list[int]) -> str:
        n = len(self.tokens)
        tokens = [
            self.tokens[i] if 0 <= i < n else self.unk_token
            for i in map(int, ids)
            if i not in self.skip_ids
        ]
        out = ""
        pending: list[str] = []
        if self.style == "marian":
            for tok in tokens:
                if tok in self.special_tokens:
                    out += self.sp_target.decode_pieces(pending) + tok + " "
                    pending = []
                else:
                    pending.append(tok)
            out += self.sp_target.decode_pieces(pending)
            return out.replace("\u2581", " ").strip()
        for tok in tokens:
            if tok in self.special_tokens:
                out += self.sp_target.decode(pending) + tok
                pending = []
            else:
                pending.append(tok)
        out += self.sp_target.decode(pending)
        return out.strip()


# --- the model ----------------------------------------------------------------------------------


class Seq2SeqModel:
    """Encoder, decoder and decoder-with-past ONNX files, each opened by the runtime; greedy and
    beam search with the KV cache. Rows of a batch are independent; padding is masked as
    transformers masks it."""

    def __init__(
        self,
        paths: dict[str, str],
        threads: int = 0,
        runtime: runtimes.RuntimeSettings | None = None,
    ):
        runtime = runtime or runtimes.settings_of({"intra_op_threads": threads})
        self.sessions = {role: runtimes.open_model(paths[role], runtime) for role in ONNX_FILES}
        self.past_inputs = [
            n for n in self.sessions["decoder_with_past"].inputs if n.startswith("past_key_values.")
        ]
        self.first_outputs = list(self.sessions["decoder"].outputs)
        self.past_outputs = list(self.sessions["decoder_with_past"].outputs)
        # Whisper's decoders take no encoder mask (every frame is real): feeds are filtered by
        # what each graph declares.
        self.takes = {role: set(session.inputs) for role, session in self.sessions.items()}

    # one forward step -------------------------------------------------------------------------
    def encode(self, ids: np.ndarray, mask: np.ndarray) -> np.ndarray:
        return self.run("encoder", {"input_ids": ids, "attention_mask": mask})[0]

    def run(self, role: str, feeds: dict[str, Any]) -> list[np.ndarray]:
        """One graph's outputs on the feeds it declares (others dropped)."""
        takes = self.takes[role]
        return self.sessions[role].run(None, {k: v for k, v in feeds.items() if k in takes})

    def _first(self, tokens: np.ndarray, hidden: np.ndarray, mask: np.ndarray | None):
        out = self.run(
            "decoder",
            {"input_ids": tokens, "encoder_hidden_states": hidden, "encoder_attention_mask": mask},
        )
        named = dict(zip(self.first_outputs, out))
        past = {
            n.replace("present.", "past_key_values."): v
            for n, v in named.items()
            if n.startswith("present.")
        }
        return named["logits"][:, -1, :], past

    def _next(self, tokens: np.ndarray, mask: np.ndarray | None, past: dict[str, np.ndarray]):
        feeds = {"input_ids": tokens, "encoder_attention_mask": mask}
        feeds.update({n: past[n] for n in self.past_inputs})
        out = self.run("decoder_with_past", feeds)
        named = dict(zip(self.past_outputs, out))
        for n, v in named.items():
            if n.startswith("present."):
                past[n.replace("present.", "past_key_values.")] = v
        return named["logits"][:, -1, :], past

    def _step(self, tokens, hidden, mask, past):
        if past is None:
            return self._first(tokens, hidden, mask)
        return self._next(tokens, mask, past)

    # generate ---------------------------------------------------------------------------------
    def generate(
        self, inputs: list[list[int]], settings: DecodeSettings, pad_id: int
    ) -> list[list[int]]:
        """Generated token ids (decoder start included) for each input, like `generate`."""
        width = max(len(x) for x in inputs)
        ids = np.full((len(inputs), width), pad_id, dtype=np.int64)
        mask = np.zeros((len(inputs), width), dtype=np.int64)
        for r, x in enumerate(inputs):  # right padding, as transformers' tokenizers pad
            ids[r, : len(x)], mask[r, : len(x)] = x, 1
        hidden = self.encode(ids, mask)
        if settings.num_beams <= 1:
            return decoding.greedy(self._step, hidden, mask, settings)
        return decoding.beam(self._step, hidden, mask, settings)


def load_serving(directory: str, cfg: dict[str, Any], threads: int = 0):
    """The tokenizer, model and default settings described by a served `serving.json` (file
    names relative to `directory`, the tokenizer's to `directory/tokenizer_dir`; the runtime
    from its `runtime`, or ONNX Runtime on CPU with `threads`)."""
    tokenizer = Seq2SeqTokenizer(
        os.path.join(directory, cfg.get("tokenizer_dir", "")),
        cfg["tokenizer"],
        cfg["max_input_length"],
    )
    runtime = runtimes.settings_of({"intra_op_threads": threads, **cfg})
    model = Seq2SeqModel(
        {role: os.path.join(directory, name) for role, name in cfg["files"].items()},
        runtime=runtime,
    )
    return tokenizer, model, DecodeSettings.from_dict(cfg["decode"])
