"""A text generator against its original PyTorch model: PyTorch's greedy continuation of each
gate prompt and its log-likelihoods (the reference), and how a candidate's answers are scored
against it (teacher-forced agreement, perplexity, the free-running text)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hf2triton.serving.causal import STREAM_INTERVAL_MS
from hf2triton.serving.decoding import stop_at


@dataclass(frozen=True)
class TextGenerationConfig:
    """Everything the served generator needs besides its ONNX file; goes into serving.json."""

    defaults: dict[str, Any]  # hf2triton.serving.causal.Sampling
    eos_token_ids: list[int]
    pad_token_id: int
    processors: dict[str, Any]  # DecodeSettings of the model's own logits processors
    max_context: int
    tokenizer: dict[str, Any]  # the serving tokenizer's plan (chat template, special tokens)
    batching: str
    max_rows: int
    step_tokens: int
    prefix_caching: bool = False  # OpenVINO GenAI reuses the KV cache of a shared prefix
    gate_tokens: int = 32  # new tokens judged per prompt
    stream_interval_ms: int = STREAM_INTERVAL_MS  # the least time between a busy stream's pieces

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


class TorchGenerator:
    """The original PyTorch model: greedy `generate`, one prompt at a time, and the
    log-probability it gives each prompt."""

    def __init__(self, model_dir: str | Path, cfg: TextGenerationConfig):
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self._torch, self.cfg = torch, cfg
        self.tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir)).eval()

    def continuation(self, prompt: str, max_new_tokens: int | None = None) -> dict[str, Any]:
        """Greedy ids after the prompt (the gate's tokens of them, unless `max_new_tokens`
        says) and their text, cut at a stop string as served."""
        torch, cfg = self._torch, self.cfg
        d = cfg.defaults
        ids = self.tokenizer(prompt, return_tensors="pt")["input_ids"]
        p = cfg.processors
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=max_new_tokens or cfg.gate_tokens,
                repetition_penalty=d["repetition_penalty"],
                eos_token_id=cfg.eos_token_ids,
                pad_token_id=cfg.pad_token_id,
                no_repeat_ngram_size=p["no_repeat_ngram_size"],
                min_length=p["min_length"],
                bad_words_ids=p["bad_words_ids"] or None,
                num_beams=1,
                top_k=None,
                top_p=None,
                temperature=None,
            )
        generated = out[0, ids.shape[1] :].tolist()
        generated, text = self.cut(generated)
        whole = torch.tensor([ids[0].tolist() + generated])
        with torch.inference_mode():
            logits = self.model(input_ids=whole).logits[0].double()
        logp = torch.log_softmax(logits[:-1], dim=-1)
        each = logp[torch.arange(whole.shape[1] - 1), whole[0, 1:]]
        length = int(ids.shape[1])
        return {
            "ids": generated,
            "text": text,
            "logprob": float(each[: length - 1].sum()),
            "tokens": length,
            # teacher-forced log-probability of its own continuation
            "cont_logprob": float(each[length - 1 :].sum()),
        }

    def cut(self, generated: list[int]) -> tuple[list[int], str]:
        """The served rule for stop strings: generation stops at the token that completes one,
        and the text ends before it."""
        stops = self.cfg.defaults["stop"]
        for n in range(1, len(generated) + 1):
            text = self.tokenizer.decode(generated[:n], skip_special_tokens=True)
            cut = stop_at(text, stops) if stops else -1
            if cut >= 0:
                return generated[:n], text[:cut]
        return generated, self.tokenizer.decode(generated, skip_special_tokens=True)


def teacher_forced(reference: list[dict[str, Any]]) -> bool:
    """Whether `reference` is PyTorch's (its continuations scored, the candidate asked to score
    them too), not another run of the candidate."""
    return bool(reference) and all("cont_logprob" in r for r in reference)


def likelihoods(reference: list[dict[str, Any]], outputs: list[dict[str, Any]]) -> np.ndarray:
    """Per item: the candidate's and PyTorch's log-likelihood of what both scored, and how many
    tokens that is: the prompt's (after its first), and with PyTorch as the reference, PyTorch's
    continuation teacher-forced too."""
    both = teacher_forced(reference)
    return np.array(
        [
            [
                o["logprob"] + (o.get("score_logprob", 0.0) if both else 0.0),
                r["logprob"] + (r["cont_logprob"] if both else 0.0),
                max(0, r["tokens"] - 1) + (len(r["ids"]) if both else 0),
            ]
            for o, r in zip(outputs, reference)
        ],
        dtype=np.float64,
    ).reshape(-1, 3)


def perplexity_increase(sums: np.ndarray) -> float:
    """exp(-candidate / tokens) / exp(-PyTorch / tokens) - 1 from summed `likelihoods`."""
    return bounded_exp((sums[1] - sums[0]) / (sums[2] or 1.0)) - 1.0


def bounded_exp(x: float) -> float:
    """exp(x), inf where it would overflow (past 709): a candidate far off scores inf."""
    return math.exp(x) if x < 700 else float("inf")


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n
