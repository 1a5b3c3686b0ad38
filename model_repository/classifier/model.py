"""Triton Python-backend text classifier: tokenizers + ONNX Runtime on CPU, labels from the model's
id2label with softmax (or sigmoid for multi-label models) scores.
Reads model.onnx, tokenizer.json and serving.json from its own version directory."""
import json
import os

import numpy as np
import onnxruntime as ort
import triton_python_backend_utils as pb_utils
from tokenizers import Tokenizer


class TritonPythonModel:
    def initialize(self, args):
        # args["model_repository"] is this model's own directory (not the repository root).
        version_dir = os.path.join(args["model_repository"], args["model_version"])
        with open(os.path.join(version_dir, "serving.json")) as f:
            cfg = json.load(f)
        self.labels = list(cfg["labels"])
        self.activation = cfg["activation"]
        if self.activation not in ("softmax", "sigmoid"):
            raise ValueError(f"serving.json: unknown activation {self.activation!r}")
        self.tokenizer = Tokenizer.from_file(os.path.join(version_dir, "tokenizer.json"))
        # A saved tokenizer.json may carry its own padding/truncation; serving needs exactly
        # max_length and padding to the longest text of the batch (masked, so any pad id works).
        pad = self.tokenizer.padding or {}
        pad_token, pad_id = pad.get("pad_token"), pad.get("pad_id")
        if pad_token is None:
            for tok in ("<pad>", "[PAD]"):
                if self.tokenizer.token_to_id(tok) is not None:
                    pad_token, pad_id = tok, self.tokenizer.token_to_id(tok)
                    break
        if pad_token is None:
            pad_token, pad_id = "[PAD]", 0
        self.tokenizer.enable_padding(pad_id=pad_id, pad_token=pad_token,
                                      pad_type_id=pad.get("pad_type_id", 0))
        self.tokenizer.enable_truncation(max_length=int(cfg["max_length"]))
        opts = ort.SessionOptions()
        threads = int(cfg.get("intra_op_threads", 0))
        if threads > 0:
            opts.intra_op_num_threads = threads
        self.session = ort.InferenceSession(os.path.join(version_dir, "model.onnx"), opts,
                                            providers=["CPUExecutionProvider"])
        self.input_names = {i.name for i in self.session.get_inputs()}

    def _texts(self, request):
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
        texts, owners = [], []
        for r, request in enumerate(requests):
            req_texts, err = self._texts(request)
            if err is not None:
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
        logits = self.session.run(["logits"], feeds)[0].astype(np.float64)
        if self.activation == "sigmoid":
            scores = 1 / (1 + np.exp(-logits))
            labels = [",".join(self.labels[j] for j in np.flatnonzero(row > 0.5)) for row in scores]
        else:
            e = np.exp(logits - logits.max(axis=1, keepdims=True))
            scores = e / e.sum(axis=1, keepdims=True)
            labels = [self.labels[j] for j in scores.argmax(axis=1)]
        scores = scores.astype(np.float32)
        label_arr = np.array([[lab.encode("utf-8")] for lab in labels], dtype=np.object_)
        truncated = np.array([[len(e.overflowing) > 0] for e in encodings], dtype=bool)

        owners = np.asarray(owners)
        for r in range(len(requests)):
            if responses[r] is not None:
                continue
            sel = owners == r
            responses[r] = pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("LABEL", label_arr[sel]),
                pb_utils.Tensor("SCORES", scores[sel]),
                pb_utils.Tensor("TRUNCATED", truncated[sel]),
            ])
        return responses
