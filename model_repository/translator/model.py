"""Triton Python-backend translator: an encoder-decoder model run by ONNX Runtime with the KV
cache (encoder, decoder and decoder-with-past files), greedy or beam search, text in, text out.
Texts that arrive together with the same decoding settings are generated as one batch.
The decoding and tokenizer code is seq2seq.py beside this file (the code the release validated);
reads serving.json, the ONNX files and the tokenizer files from its own version directory."""
import json
import os
import sys

import numpy as np
import triton_python_backend_utils as pb_utils

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import seq2seq  # noqa: E402  (copied beside this file by the release)


def _invalid(message):
    error = pb_utils.TritonError(message, pb_utils.TritonError.INVALID_ARG)
    return pb_utils.InferenceResponse(output_tensors=[], error=error)


class TritonPythonModel:
    def initialize(self, args):
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, "serving.json")) as f:
            cfg = json.load(f)
        self.tokenizer, self.model, self.defaults = seq2seq.load_serving(
            version_dir, cfg, threads=int(cfg.get("intra_op_threads", 0)))
        self.target_langs = {k: int(v) for k, v in cfg.get("target_langs", {}).items()}
        self.max_new_tokens_limit = int(cfg["max_new_tokens_limit"])
        self.max_beams = int(cfg.get("max_beams", 16))

    def _column(self, request, name, kind):
        """One value per text of an optional input, or None when the request leaves it out."""
        tensor = pb_utils.get_input_tensor_by_name(request, name)
        if tensor is None:
            return None
        arr = tensor.as_numpy()
        if arr.ndim != 2 or arr.shape[1] != 1:
            raise ValueError(f"{name} must have shape [batch, 1], got {list(arr.shape)}")
        if kind == "str":
            return [v.decode("utf-8") if isinstance(v, bytes) else str(v) for v in arr[:, 0]]
        return [int(v) for v in arr[:, 0]]

    def _parse(self, request):
        """(texts, per-text DecodeSettings) of one request; ValueError for a bad request."""
        arr = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
        if arr.ndim != 2 or arr.shape[1] != 1:
            raise ValueError(f"TEXT must have shape [batch, 1], got {list(arr.shape)}")
        texts = []
        for i, raw in enumerate(arr[:, 0]):
            try:
                texts.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
            except UnicodeDecodeError as e:
                raise ValueError(f"TEXT[{i}] is not valid UTF-8: {e}") from None
        n = len(texts)
        max_new = self._column(request, "MAX_NEW_TOKENS", "int") or [None] * n
        beams = self._column(request, "NUM_BEAMS", "int") or [None] * n
        langs = self._column(request, "TARGET_LANG", "str") or [None] * n
        if not (len(max_new) == len(beams) == len(langs) == n):
            raise ValueError("MAX_NEW_TOKENS, NUM_BEAMS and TARGET_LANG need one value per text")
        settings = []
        for m, b, lang in zip(max_new, beams, langs):
            if m is not None and not 1 <= m <= self.max_new_tokens_limit:
                raise ValueError(
                    f"MAX_NEW_TOKENS {m} is outside 1..{self.max_new_tokens_limit}")
            if b is not None and not 1 <= b <= self.max_beams:
                raise ValueError(f"NUM_BEAMS {b} is outside 1..{self.max_beams}")
            bos = None
            if lang:
                if lang not in self.target_langs:
                    known = ", ".join(sorted(self.target_langs)[:20]) or "none"
                    raise ValueError(f"TARGET_LANG {lang!r} is not one of this model's "
                                     f"target languages ({known})")
                bos = self.target_langs[lang]
            settings.append(self.defaults.with_request(m, b, bos))
        return texts, settings

    def execute(self, requests):
        responses = [None] * len(requests)
        rows = []  # (request index, position in request, text, settings)
        for r, request in enumerate(requests):
            try:
                texts, settings = self._parse(request)
            except ValueError as exc:
                responses[r] = _invalid(str(exc))
                continue
            rows.extend((r, i, t, s) for i, (t, s) in enumerate(zip(texts, settings)))
        if not rows:
            return responses

        ids, truncated = self.tokenizer.encode([row[2] for row in rows])
        out_text = [None] * len(rows)
        groups = {}  # texts with the same decoding settings are generated together
        for k, row in enumerate(rows):
            s = row[3]
            groups.setdefault((s.max_new_tokens, s.num_beams, s.forced_bos_token_id),
                              []).append(k)
        for members in groups.values():
            settings = rows[members[0]][3]
            generated = self.model.generate([ids[k] for k in members], settings,
                                            settings.pad_token_id)
            for k, text in zip(members, self.tokenizer.decode(generated)):
                out_text[k] = text

        for r in range(len(requests)):
            if responses[r] is not None:
                continue
            mine = [k for k, row in enumerate(rows) if row[0] == r]
            text = np.array([[out_text[k].encode("utf-8")] for k in mine], dtype=np.object_)
            trunc = np.array([[truncated[k]] for k in mine], dtype=bool)
            responses[r] = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("TRANSLATION", text), pb_utils.Tensor("TRUNCATED", trunc)])
        return responses
