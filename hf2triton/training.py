"""Training on CPU, seeded and deterministic (the same data and seed give the same weights, byte
for byte), cached by the content hash of the data and the settings:

- retraining, the worked example of a release that follows a training job: fine-tune an encoder
  (all-MiniLM-L6-v2 by default) with a classification head on a labelled TSV, log it to an
  MLflow registry with the transformers flavour, and point an alias at the new version; the
  release of an `mlflow` source then takes it from there (flows/train.py and its trigger);
- the embedded default language model: a small Llama-architecture causal LM and its byte-level
  BPE tokenizer, trained from scratch on a plain-text file shipped in the repository (a release
  spec's `source.train`), so a release with no network still has a model that writes real text.
"""

from __future__ import annotations

import contextlib
import inspect
import math
import os
import time
from collections.abc import Callable, Iterator
from importlib.metadata import version as package_version
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from hf2triton import quiet
from hf2triton.clients.mlflow import Registry
from hf2triton.errors import SourceError
from hf2triton.kinds.classification import read_labelled
from hf2triton.workspace import cached_step, digest, sha256_file

if TYPE_CHECKING:  # the spec is built from the sources, and the train source from this module
    from hf2triton.sources.train import TrainSourceSpec
    from hf2triton.spec import TrainingSpec

REGISTERED_EVENT = "hf2triton.model.registered"  # what the release deployment's trigger expects
# How many threads a training runs on: a float sum depends on how threads split it, so the
# count is fixed for determinism. Fine-tuning MiniLM's matrices gains from both cores; the
# language model's tiny ones gain little from two, and one keeps a shared 2-core machine
# responsive.
FINE_TUNE_THREADS = 2
LM_THREADS = 1
EOS, PAD = "<|endoftext|>", "<pad>"
# The model learns plain text, never a conversation: a chat renders the messages' text one per
# line, so the model goes on in the style of what it read.
PLAIN_CHAT_TEMPLATE = (
    "{% for message in messages %}{{ message['content'] | trim }}\n{% endfor %}"
)


@contextlib.contextmanager
def deterministic(seed: int, threads: int) -> Iterator[None]:
    """Seeded initialisation, deterministic kernels and a fixed thread count, for the time of a
    training; the process's own settings come back after."""
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)

class TrainResult(TypedDict):
    model_dir: str  # the fine-tuned model and tokenizer (save_pretrained)
    losses: list[float]  # mean training loss per 10 steps
    train_accuracy: float
    eval_accuracy: float | None
    seconds: float
    reused: bool


class Registered(TypedDict):
    tracking_uri: str
    model: str
    version: str
    alias: str
    run_id: str


def _accuracy(model: Any, tokenizer: Any, texts: list[str], ids: list[int],
              max_length: int) -> float:
    import torch

    correct = 0
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            enc = tokenizer(texts[i:i + 64], padding=True, truncation=True,
                            max_length=max_length, return_tensors="pt")
            predicted = model(**enc).logits.argmax(dim=1).tolist()
            correct += sum(int(p == y) for p, y in zip(predicted, ids[i:i + 64]))
    return correct / len(texts)


def fine_tune(base_dir: str, base_hash: str, spec: TrainingSpec, work_root: str,
              progress: Callable[[int, float], None] | None = None) -> TrainResult:
    """Fine-tune `base_dir` on `spec.data`; the same inputs reuse the finished model."""
    texts, ids = read_labelled(spec.data, spec.labels, "data")
    held = read_labelled(spec.eval, spec.labels, "eval") if spec.eval else None
    key = digest([base_hash, sha256_file(spec.data), spec.labels, spec.steps, spec.batch_size,
                  spec.learning_rate, spec.max_length, spec.seed,
                  sha256_file(spec.eval) if spec.eval else None, sha256_file(__file__)])
    started = time.perf_counter()

    def build(out: Path) -> dict:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        # transformers says the new head is "newly initialized" and should be trained: we are.
        quiet.drop_log_message("transformers.modeling_utils", "Some weights of")

        # Same data, same seed, same weights: seeded initialisation and order too.
        with deterministic(spec.seed, FINE_TUNE_THREADS):
            tokenizer = AutoTokenizer.from_pretrained(base_dir)
            model = AutoModelForSequenceClassification.from_pretrained(
                base_dir, num_labels=len(spec.labels),
                id2label=dict(enumerate(spec.labels)),
                label2id={name: i for i, name in enumerate(spec.labels)})
            model.train()
            optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
            rng = np.random.default_rng(spec.seed)
            order: list[int] = []
            losses, window = [], []
            for step in range(spec.steps):
                if len(order) < spec.batch_size:
                    order += rng.permutation(len(texts)).tolist()
                batch, order = order[:spec.batch_size], order[spec.batch_size:]
                enc = tokenizer([texts[i] for i in batch], padding=True, truncation=True,
                                max_length=spec.max_length, return_tensors="pt")
                loss = model(**enc, labels=torch.tensor([ids[i] for i in batch])).loss
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                window.append(loss.item())
                if len(window) == 10 or step == spec.steps - 1:
                    losses.append(round(float(np.mean(window)), 5))
                    window = []
                    if progress:
                        progress(step + 1, losses[-1])
            model.eval()
            train_acc = _accuracy(model, tokenizer, texts, ids, spec.max_length)
            eval_acc = _accuracy(model, tokenizer, *held, spec.max_length) if held else None
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
        return {"losses": losses, "train_accuracy": train_acc, "eval_accuracy": eval_acc}

    done = cached_step(work_root, "train", key, build)
    return TrainResult(model_dir=str(done.path), **done.result,
                       seconds=round(time.perf_counter() - started, 1), reused=done.reused)


def log_trained(trained: TrainResult, spec: TrainingSpec, tracking_uri: str) -> Registered:
    """One MLflow run (params, the loss curve, accuracies) with the model in the transformers
    flavour, a new version of `spec.registry.model_name`, and `spec.alias` on it."""
    import mlflow
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the flavour asks the hub for a model card
    registry = Registry(tracking_uri)
    mlflow.set_tracking_uri(tracking_uri)
    mlflow.set_registry_uri(tracking_uri)
    experiment = registry.experiment_id(spec.registry.experiment)
    model = AutoModelForSequenceClassification.from_pretrained(trained["model_dir"])
    tokenizer = AutoTokenizer.from_pretrained(trained["model_dir"])
    with mlflow.start_run(experiment_id=experiment, run_name=f"{spec.name}-seed{spec.seed}") as run:
        mlflow.log_params({"steps": spec.steps, "batch_size": spec.batch_size,
                           "learning_rate": spec.learning_rate, "seed": spec.seed,
                           "max_length": spec.max_length, "labels": ",".join(spec.labels),
                           "data": Path(spec.data).name, "data_sha256": sha256_file(spec.data),
                           "base": spec.base.lineage_id})
        for i, loss in enumerate(trained["losses"]):
            mlflow.log_metric("train_loss", loss, step=(i + 1) * 10)
        mlflow.log_metric("train_accuracy", trained["train_accuracy"])
        if trained["eval_accuracy"] is not None:
            mlflow.log_metric("eval_accuracy", trained["eval_accuracy"])
        # Named, not inferred: MLflow's inference asks for torchvision, which is not installed.
        requirements = [f"{lib}=={package_version(lib)}" for lib in ("torch", "transformers",
                                                             "tokenizers")]
        info = registry.call(
            "log the trained model", mlflow.transformers.log_model,
            transformers_model={"model": model, "tokenizer": tokenizer}, name="model",
            task="text-classification", registered_model_name=spec.registry.model_name,
            pip_requirements=requirements)
    version = str(info.registered_model_version)
    registry.set_alias(spec.registry.model_name, spec.alias, version)
    return Registered(tracking_uri=tracking_uri, model=spec.registry.model_name,
                      version=version, alias=spec.alias, run_id=run.info.run_id)


def announce_version(registered: Registered, trained: TrainResult) -> None:
    """Tell Prefect a new version exists (the event a release of an `mlflow` source that
    follows this alias waits for)."""
    from prefect.events import emit_event

    held = trained["eval_accuracy"]
    emit_event(event=REGISTERED_EVENT,
               resource={"prefect.resource.id": f"mlflow.model.{registered['model']}",
                         "prefect.resource.name": registered["model"],
                         "version": registered["version"], "alias": registered["alias"]},
               payload={"run_id": registered["run_id"], "alias": registered["alias"],
                        "train_accuracy": trained["train_accuracy"], "eval_accuracy": held})


# ---- the embedded language model ----------------------------------------------------------


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
        raise SourceError(f"source.train.text {path}: cannot read it as UTF-8 text ({exc})") \
            from None
    text = "\n".join(ln for ln in lines if not ln.startswith("#")).strip()
    if len(text) < 1000:
        raise SourceError(f"source.train.text {path} has {len(text)} characters of text: a "
                          "language model needs at least a few thousand to learn from")
    return text


def train_tokenizer(text: str, vocab_size: int, chat_template: str) -> Any:
    """A byte-level BPE tokenizer (every string encodes, no unknown token) trained on `text`,
    as a transformers fast tokenizer with its end-of-text, padding and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS, PAD],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(text.split("\n"), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS,
                                   pad_token=PAD, clean_up_tokenization_spaces=False,
                                   model_input_names=["input_ids", "attention_mask"])
    fast.chat_template = chat_template
    return fast


def training_settings(spec: TrainSourceSpec) -> dict[str, Any]:
    """The settings that decide the files (with the text, the cache key)."""
    return {k: getattr(spec, k) for k in ("vocab_size", "layers", "hidden", "heads", "context",
                                          "max_positions", "steps", "batch_size",
                                          "learning_rate", "seed", "chat_template")}


def train_lm(spec: TrainSourceSpec, work_root: str | Path,
             progress: Callable[[int, float], None] | None = None) -> LmTrainResult:
    """Train the model `spec` (a spec's `source.train`) describes; the same text and settings
    reuse the finished model (the same text and settings also give the same weights)."""
    # Keyed by this trainer's own code (not the module's: the fine-tune beside it may change).
    code = [inspect.getsource(f) for f in (train_lm, train_tokenizer, read_text)]
    key = digest(["train-lm", sha256_file(spec.text), training_settings(spec), LM_THREADS, code,
                  inspect.getsource(deterministic)])
    started = time.perf_counter()

    def build(out: Path) -> dict:
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
            raise SourceError(f"source.train.text {spec.text} is {len(data)} tokens: shorter "
                              f"than source.train.context {spec.context}")

        with deterministic(spec.seed, LM_THREADS):
            config = LlamaConfig(
                vocab_size=len(tokenizer), hidden_size=spec.hidden,
                intermediate_size=spec.hidden * 8 // 3 // 8 * 8,
                num_hidden_layers=spec.layers, num_attention_heads=spec.heads,
                num_key_value_heads=spec.heads, max_position_embeddings=spec.max_positions,
                bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, tie_word_embeddings=True,
                attn_implementation="eager")
            model = LlamaForCausalLM(config)
            model.train()
            decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
            rest = [p for n, p in model.named_parameters() if p.dim() < 2]
            optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                                           {"params": rest, "weight_decay": 0.0}],
                                          lr=spec.learning_rate, betas=(0.9, 0.95))
            warmup = max(1, spec.steps // 20)

            def rate(step: int) -> float:  # linear warm-up, then cosine to a tenth
                if step < warmup:
                    return (step + 1) / warmup
                done = (step - warmup) / max(1, spec.steps - warmup)
                return 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * done))

            schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, rate)
            rng = np.random.default_rng(spec.seed)
            losses: list[float] = []
            window: list[float] = []

            def record(step: int, loss: float) -> None:  # a mean per 10 steps, and the last
                window.append(loss)
                if len(window) == 10 or step == spec.steps - 1:
                    losses.append(round(float(np.mean(window)), 4))
                    window.clear()
                    if progress:
                        progress(step + 1, losses[-1])

            for step in range(spec.steps):
                starts = rng.integers(0, len(data) - spec.context, spec.batch_size)
                batch = torch.stack([data[s:s + spec.context] for s in starts.tolist()])
                loss = model(input_ids=batch, labels=batch).loss  # shifted inside the model
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                optimizer.step()
                schedule.step()
                record(step, loss.item())
            model.eval()
            model.generation_config = GenerationConfig(
                bos_token_id=tokenizer.eos_token_id, eos_token_id=tokenizer.eos_token_id,
                pad_token_id=tokenizer.pad_token_id, max_new_tokens=48)
            model.save_pretrained(out)
            # The chat template inside tokenizer_config.json, where every reader of a model
            # directory looks (and the source's file hashes cover it), not a separate .jinja.
            tokenizer.save_pretrained(out, save_jinja_files=False)
        return {"losses": losses, "tokens": len(ids)}

    done = cached_step(work_root, "train-lm", key, build)
    return LmTrainResult(model_dir=str(done.path), **done.result,
                         seconds=round(time.perf_counter() - started, 1), reused=done.reused)


def generate(model_dir: str | Path, prompt: str, max_new_tokens: int = 40) -> str:
    """PyTorch's greedy continuation of `prompt` by a trained model (what a user reads)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    enc = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False,
                             repetition_penalty=1.0)
    return tokenizer.decode(out[0, enc["input_ids"].shape[1]:], skip_special_tokens=True)
