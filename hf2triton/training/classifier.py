"""Retraining, the worked example of a release that follows a training job: fine-tune an encoder
(all-MiniLM-L6-v2 by default) with a classification head on a labelled TSV, seeded and cached by
the content hash of the data and the settings, log it to an MLflow registry with the
transformers flavour, and point an alias at the new version; the release of an `mlflow` source
then takes it from there (flows/train.py and its trigger)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from importlib.metadata import version as package_version
from pathlib import Path
from typing import Any, Protocol, TypedDict, cast

import numpy as np

from hf2triton.clients.mlflow import Registry
from hf2triton.kinds.classification import read_labelled
from hf2triton.training.determinism import FINE_TUNE_THREADS, deterministic
from hf2triton.util import quiet
from hf2triton.util.workspace import cached_step, digest, sha256_file

REGISTERED_EVENT = "hf2triton.model.registered"  # what the release deployment's trigger expects


class _Registry(Protocol):
    @property
    def model_name(self) -> str: ...

    @property
    def experiment(self) -> str: ...


class _Base(Protocol):
    @property
    def lineage_id(self) -> str: ...


class ClassifierTraining(Protocol):
    """What the fine-tune reads of a training spec (hf2triton.spec.TrainingSpec)."""

    @property
    def name(self) -> str: ...
    @property
    def base(self) -> _Base: ...
    @property
    def data(self) -> str: ...
    @property
    def eval(self) -> str | None: ...
    @property
    def labels(self) -> list[str]: ...
    @property
    def steps(self) -> int: ...
    @property
    def batch_size(self) -> int: ...
    @property
    def learning_rate(self) -> float: ...
    @property
    def max_length(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def registry(self) -> _Registry: ...
    @property
    def alias(self) -> str: ...


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


def _accuracy(
    model: Any, tokenizer: Any, texts: list[str], ids: list[int], max_length: int
) -> float:
    import torch

    correct = 0
    with torch.inference_mode():
        for i in range(0, len(texts), 64):
            enc = tokenizer(
                texts[i : i + 64],
                padding=True,
                truncation=True,
                max_length=max_length,
                return_tensors="pt",
            )
            predicted = model(**enc).logits.argmax(dim=1).tolist()
            correct += sum(int(p == y) for p, y in zip(predicted, ids[i : i + 64]))
    return correct / len(texts)


def fine_tune(
    base_dir: str,
    base_hash: str,
    spec: ClassifierTraining,
    work_root: str,
    progress: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Fine-tune `base_dir` on `spec.data`; the same inputs reuse the finished model."""
    texts, ids = read_labelled(spec.data, spec.labels, "data")
    held = read_labelled(spec.eval, spec.labels, "eval") if spec.eval else None
    key = digest(
        [
            base_hash,
            sha256_file(spec.data),
            spec.labels,
            spec.steps,
            spec.batch_size,
            spec.learning_rate,
            spec.max_length,
            spec.seed,
            sha256_file(spec.eval) if spec.eval else None,
            sha256_file(__file__),
        ]
    )
    started = time.perf_counter()

    def build(out: Path) -> dict:
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        # transformers says the new head is "newly initialized" and should be trained: we are.
        quiet.drop_log_message("transformers.modeling_utils", "Some weights of")

        # Same data, same seed, same weights: seeded initialisation and order too.
        with deterministic(spec.seed, FINE_TUNE_THREADS):
            tokenizer = AutoTokenizer.from_pretrained(base_dir)
            model = AutoModelForSequenceClassification.from_pretrained(
                base_dir,
                num_labels=len(spec.labels),
                id2label=dict(enumerate(spec.labels)),
                label2id={name: i for i, name in enumerate(spec.labels)},
            )
            losses = _train(model, tokenizer, texts, ids, spec, progress)
            model.eval()
            train_acc = _accuracy(model, tokenizer, texts, ids, spec.max_length)
            eval_acc = _accuracy(model, tokenizer, *held, spec.max_length) if held else None
            model.save_pretrained(out)
            tokenizer.save_pretrained(out)
        return {"losses": losses, "train_accuracy": train_acc, "eval_accuracy": eval_acc}

    done = cached_step(work_root, "train", key, build)
    # The step's JSON result holds the keys build returned, the rest are added here.
    return cast(
        TrainResult,
        {
            "model_dir": str(done.path),
            **done.result,
            "seconds": round(time.perf_counter() - started, 1),
            "reused": done.reused,
        },
    )


def _train(
    model: Any,
    tokenizer: Any,
    texts: list[str],
    ids: list[int],
    spec: ClassifierTraining,
    progress: Callable[[int, float], None] | None,
) -> list[float]:
    """AdamW over shuffled batches, seeded; the mean loss per 10 steps (and the last)."""
    import torch

    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
    rng = np.random.default_rng(spec.seed)
    order: list[int] = []
    losses: list[float] = []
    window: list[float] = []
    for step in range(spec.steps):
        if len(order) < spec.batch_size:
            order += rng.permutation(len(texts)).tolist()
        batch, order = order[: spec.batch_size], order[spec.batch_size :]
        enc = tokenizer(
            [texts[i] for i in batch],
            padding=True,
            truncation=True,
            max_length=spec.max_length,
            return_tensors="pt",
        )
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
    return losses


def log_trained(trained: TrainResult, spec: ClassifierTraining, tracking_uri: str) -> Registered:
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
        mlflow.log_params(
            {
                "steps": spec.steps,
                "batch_size": spec.batch_size,
                "learning_rate": spec.learning_rate,
                "seed": spec.seed,
                "max_length": spec.max_length,
                "labels": ",".join(spec.labels),
                "data": Path(spec.data).name,
                "data_sha256": sha256_file(spec.data),
                "base": spec.base.lineage_id,
            }
        )
        for i, loss in enumerate(trained["losses"]):
            mlflow.log_metric("train_loss", loss, step=(i + 1) * 10)
        mlflow.log_metric("train_accuracy", trained["train_accuracy"])
        if trained["eval_accuracy"] is not None:
            mlflow.log_metric("eval_accuracy", trained["eval_accuracy"])
        # Named, not inferred: MLflow's inference asks for torchvision, which is not installed.
        requirements = [
            f"{lib}=={package_version(lib)}" for lib in ("torch", "transformers", "tokenizers")
        ]
        info = registry.call(
            "log the trained model",
            mlflow.transformers.log_model,
            transformers_model={"model": model, "tokenizer": tokenizer},
            name="model",
            task="text-classification",
            registered_model_name=spec.registry.model_name,
            pip_requirements=requirements,
        )
    version = str(info.registered_model_version)
    registry.set_alias(spec.registry.model_name, spec.alias, version)
    return Registered(
        tracking_uri=tracking_uri,
        model=spec.registry.model_name,
        version=version,
        alias=spec.alias,
        run_id=run.info.run_id,
    )


def announce_version(registered: Registered, trained: TrainResult) -> None:
    """Tell Prefect a new version exists (the event a release of an `mlflow` source that
    follows this alias waits for)."""
    from prefect.events import emit_event

    held = trained["eval_accuracy"]
    emit_event(
        event=REGISTERED_EVENT,
        resource={
            "prefect.resource.id": f"mlflow.model.{registered['model']}",
            "prefect.resource.name": registered["model"],
            "version": registered["version"],
            "alias": registered["alias"],
        },
        payload={
            "run_id": registered["run_id"],
            "alias": registered["alias"],
            "train_accuracy": trained["train_accuracy"],
            "eval_accuracy": held,
        },
    )
