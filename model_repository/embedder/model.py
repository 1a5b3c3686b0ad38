"""Triton Python-backend sentence embedder: tokenizers + ONNX Runtime, pooled (and optionally L2-normalised) on CPU.
Reads model.onnx, tokenizer.json and serving.json from its own version directory."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer

# Token-level outputs we know how to pool; optimum names it differently per export library
# (transformers: last_hidden_state, sentence-transformers: token_embeddings).
_TOKEN_OUTPUTS = ("last_hidden_state", "token_embeddings")


class TritonPythonModel:
    def initialize(self, args):
        # args["model_repository"] is this model's own directory (not the repository root).
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, "serving.json")) as f:
            cfg = json.load(f)
        self.max_length = int(cfg["max_length"])
        self.pooling = cfg["pooling"]
        if self.pooling not in ("mean", "cls"):
            raise ValueError(f"serving.json: unknown pooling {self.pooling!r}")
        self.normalize = bool(cfg["normalize"])

        self.tokenizer = Tokenizer.from_file(os.path.join(version_dir, "tokenizer.json"))
        # Saved tokenizer.json files often carry their own padding/truncation (all-MiniLM-L6-v2's
        # pads to a fixed 128); serving needs exactly max_length and padding to the longest in the batch.
        pad = self.tokenizer.padding or {}
        pad_token = pad.get("pad_token")
        pad_id = pad.get("pad_id")
        if pad_token is None:
            for tok in ("[PAD]", "<pad>"):
                if self.tokenizer.token_to_id(tok) is not None:
                    pad_token, pad_id = tok, self.tokenizer.token_to_id(tok)
                    break
        if pad_token is None:
            # Padded positions are masked out of the attention and the pooling, so any valid id works.
            pad_token, pad_id = "[PAD]", 0
        # Right padding (the default) keeps the first position a real token, which CLS pooling needs.
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token,
                                      pad_type_id=pad.get("pad_type_id", 0))
        self.tokenizer.enable_truncation(max_length=self.max_length)

        opts = ort.SessionOptions()
        threads = int(cfg.get("intra_op_threads", 0))
        if threads > 0:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(os.path.join(version_dir, "model.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}
        outputs = self.session.get_outputs()
        names = [o.name for o in outputs]
        token_out = next((n for n in _TOKEN_OUTPUTS if n in names), None)
        if token_out is None:
            token_out = next((o.name for o in outputs if len(o.shape) == 3), None)
        if token_out is None:
            raise ValueError(f"model.onnx has no token-level (3-D) output among {names}")
        self.output_name = token_out

    def _texts(self, request):
        """Decoded texts of one request, or an error message for that request alone."""
        arr = pb_utils.get_input_tensor_by_name(request, "TEXT").as_numpy()
        if arr.ndim != 2 or arr.shape[1] != 1:
            return None, f"TEXT must have shape [batch, 1], got {list(arr.shape)}"
        texts = []
        for i, raw in enumerate(arr[:, 0]):
            try:
                texts.append(raw.decode("utf-8") if isinstance(raw, bytes) else str(raw))
            except UnicodeDecodeError as e:
                return None, f"TEXT[{i}] is not valid UTF-8: {e}"
        return texts, None

    def execute(self, requests):
        responses = [None] * len(requests)
        texts, owners = [], []  # owners[k] = index of the request text k came from
        for r, request in enumerate(requests):
            req_texts, err = self._texts(request)
            if err is not None:
                # Client's fault, so INVALID_ARG (HTTP 400) rather than the default INTERNAL (500).
                error = pb_utils.TritonError(err, pb_utils.TritonError.INVALID_ARG)
                responses[r] = pb_utils.InferenceResponse(output_tensors=[], error=error)
                continue
            texts.extend(req_texts)
            owners.extend([r] * len(req_texts))
        if not texts:
            return responses

        # One tokenizer call and one ORT run for everything the dynamic batcher handed us.
        encodings = self.tokenizer.encode_batch(texts)
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        feeds = {"input_ids": ids, "attention_mask": mask}
        if "token_type_ids" in self.input_names:
            feeds["token_type_ids"] = np.zeros_like(ids)
        feeds = {k: v for k, v in feeds.items() if k in self.input_names}
        hidden = self.session.run([self.output_name], feeds)[0]

        if self.pooling == "cls":
            emb = hidden[:, 0]
        else:
            m = mask[:, :, None].astype(hidden.dtype)
            emb = (hidden * m).sum(axis=1) / np.clip(m.sum(axis=1), 1e-9, None)
        if self.normalize:
            emb = emb / np.clip(np.linalg.norm(emb, axis=1, keepdims=True), 1e-12, None)
        emb = emb.astype(np.float32)
        # The tokenizer keeps the cut-off tail in .overflowing, so non-empty means truncated.
        truncated = np.array([[len(e.overflowing) > 0] for e in encodings], dtype=bool)

        owners = np.asarray(owners)
        for r in range(len(requests)):
            if responses[r] is not None:
                continue
            sel = owners == r
            responses[r] = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("EMBEDDING", emb[sel]),
                pb_utils.Tensor("TRUNCATED", truncated[sel]),
            ])
        return responses
