"""The embedded default language model: a small Llama-architecture causal LM and its byte-level
BPE tokenizer, trained from scratch on a plain-text file shipped in the repository (a release
spec's `source.train`), seeded and cached by the content hash of the text and the settings, so a
release with no network still has a model that writes real text."""

from __future__ import annotations

import inspect
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypedDict, cast

import numpy as np

from hf2triton.errors import SourceError
from hf2triton.training.determinism import LM_THREADS, deterministic
from hf2triton.util.workspace import cached_step, digest, sha256_file

if TYPE_CHECKING:
    import torch

EOS, PAD = "<|endoftext|>", "<pad>"
# The model learns plain text, never a conversation: a chat renders the messages' text one per
# line, so the model goes on in the style of what it read.
PLAIN_CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] | trim }}\n{% endfor %}"


class LmTraining(Protocol):
    """What the trainer reads of a spec's `source.train` (hf2triton.sources.train): read-only,
    as the spec's frozen sections are."""

    @property
    def text(self) -> str: ...
    @property
    def vocab_size(self) -> int: ...
    @property
    def layers(self) -> int: ...
    @property
    def hidden(self) -> int: ...
    @property
    def heads(self) -> int: ...
    @property
    def context(self) -> int: ...
    @property
    def max_positions(self) -> int: ...
    @property
    def steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def seed(self) -> int: ...
    @property
    def chat_template(self) -> str: ...


class LmTrainResult(TypedDict):
    model_dir: str  # save_pretrained of the model, tokenizer (with its chat template), config
    losses: list[float]  # mean training loss per 10 steps
    tokens: int  # tokens of training text
    seconds: float
    reused: bool


def read_text(path: str | Path) -> str:
    """The training text: the file without its '#' header lines."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(
            f"source.train.text {path}: cannot read it as UTF-8 text ({exc})"
        ) from None
    text = "\n".join(ln for ln in lines if not ln.startswith("#")).strip()
    if len(text) < 1000:
        raise SourceError(
            f"source.train.text {path} has {len(text)} characters of text: a "
            "language model needs at least a few thousand to learn from"
        )
    return text


def train_tokenizer(text: str, vocab_size: int, chat_template: str) -> Any:
    """A byte-level BPE tokenizer (every string encodes, no unknown token) trained on `text`,
    as a transformers fast tokenizer with its end-of-text, padding and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS, PAD],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(text.split("\n"), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=EOS,
        eos_token=EOS,
        pad_token=PAD,
        clean_up_tokenization_spaces=False,
        model_input_names=["input_ids", "attention_mask"],
    )
    fast.chat_template = chat_template
    return fast


def training_settings(spec: LmTraining) -> dict[str, Any]:
    """The settings that decide the files (with the text, the cache key)."""
    return {
        k: getattr(spec, k)
        for k in (
            "vocab_size",
            "layers",
            "hidden",
            "heads",
            "context",
            "max_positions",
            "steps",
            "batch_size",
            "learning_rate",
            "seed",
            "chat_template",
        )
    }


def train_lm(
    spec: LmTraining, work_root: str | Path, progress: Callable[[int, float], None] | None = None
) -> LmTrainResult:
    """Train the model `spec` (a spec's `source.train`) describes; the same text and settings
    reuse the finished model (the same text and settings also give the same weights)."""
    # Keyed by this trainer's own code (not the module's: other functions may change).
    code = [inspect.getsource(f) for f in (train_lm, _build, _fit, train_tokenizer, read_text)]
    key = digest(
        [
            "train-lm",
            sha256_file(spec.text),
            training_settings(spec),
            LM_THREADS,
            code,
            inspect.getsource(deterministic),
        ]
    )
    started = time.perf_counter()
    done = cached_step(work_root, "train-lm", key, lambda out: _build(spec, out, progress))
    # The step's JSON result holds the keys _build returned, the rest are added here.
    return cast(
        LmTrainResult,
        {
            "model_dir": str(done.path),
            **done.result,
            "seconds": round(time.perf_counter() - started, 1),
            "reused": done.reused,
        },
    )


def _build(spec: LmTraining, out: Path, progress: Callable[[int, float], None] | None) -> dict:
    """Tokenizer, model and training into `out`; the losses and the text's token count."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    text = read_text(spec.text)
    tokenizer = train_tokenizer(text, spec.vocab_size, spec.chat_template)
    # Chapters (blank-line separated) are documents: end-of-text between them.
    ids = []
    for chapter in text.split("\n\n"):
        ids += tokenizer(chapter.strip() + "\n")["input_ids"] + [tokenizer.eos_token_id]
    data = torch.tensor(ids, dtype=torch.long)
    if len(data) <= spec.context + 1:
        raise SourceError(
            f"source.train.text {spec.text} is {len(data)} tokens: shorter "
            f"than source.train.context {spec.context}"
        )
    with deterministic(spec.seed, LM_THREADS):
        config = LlamaConfig(
            vocab_size=len(tokenizer),
            hidden_size=spec.hidden,
            intermediate_size=spec.hidden * 8 // 3 // 8 * 8,
            num_hidden_layers=spec.layers,
            num_attention_heads=spec.heads,
            num_key_value_heads=spec.heads,
            max_position_embeddings=spec.max_positions,
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            tie_word_embeddings=True,
            attn_implementation="eager",
        )
        model = LlamaForCausalLM(config)
        losses = _fit(model, data, spec, progress)
        model.generation_config = GenerationConfig(
            bos_token_id=tokenizer.eos_token_id,
            eos_token_id=tokenizer.eos_token_id,
            pad_token_id=tokenizer.pad_token_id,
            max_new_tokens=48,
        )
        model.save_pretrained(out)
        # The chat template inside tokenizer_config.json, where every reader of a model
        # directory looks (and the source's file hashes cover it), not a separate .jinja.
        tokenizer.save_pretrained(out, save_jinja_files=False)
    return {"losses": losses, "tokens": len(ids)}


def _fit(
    model: Any, data: torch.Tensor, spec: LmTraining, progress: Callable[[int, float], None] | None
) -> list[float]:
    """AdamW with weight decay on the matrices, a linear warm-up then a cosine to a tenth, on
    random windows of `data`; the mean loss per 10 steps (and the last)."""
    import torch

    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=spec.learning_rate,
        betas=(0.9, 0.95),
    )
    warmup = max(1, spec.steps // 20)

    def rate(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        done = (step - warmup) / max(1, spec.steps - warmup)
        return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
    rng = np.random.default_rng(spec.seed)
    losses: list[float] = []
    window: list[float] = []
    for step in range(spec.steps):
        starts = rng.integers(0, len(data) - spec.context, spec.batch_size)
        batch = torch.stack([data[s : s + spec.context] for s in starts.tolist()])
        loss = model(input_ids=batch, labels=batch).loss  # shifted inside the model
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        window.append(loss.item())
        if len(window) == 10 or step == spec.steps - 1:
            losses.append(round(float(np.mean(window)), 4))
            window.clear()
            if progress:
                progress(step + 1, losses[-1])
    model.eval()
    return losses


def generate(model_dir: str | Path, prompt: str, max_new_tokens: int = 40) -> str:
    """PyTorch's greedy continuation of `prompt` by a trained model (what a user reads)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(
            **enc, max_new_tokens=max_new_tokens, do_sample=False, repetition_penalty=1.0
        )
    return tokenizer.decode(out[0, enc["input_ids"].shape[1] :], skip_special_tokens=True)
