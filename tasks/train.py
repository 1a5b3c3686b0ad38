"""Steps of the retraining flow: `train` fine-tunes the encoder (hf2triton.training.classifier),
`log-model` registers it in MLflow with its alias, and `announce` tells Prefect a new version exists
(the
event the release deployment's trigger waits for), with the training figures in the UI."""

from __future__ import annotations

from prefect import task

from hf2triton.release.report import publish_training
from hf2triton.sources import FetchResult
from hf2triton.spec import TrainingSpec
from hf2triton.training.classifier import (
    Registered,
    TrainResult,
    announce_version,
    fine_tune,
    log_trained,
)
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, note_reuse, step_logger


@task(name="train", task_run_name="train {spec.name}", **NO_PREFECT_CACHE)
def train(src: FetchResult, spec: TrainingSpec, work: str) -> TrainResult:
    log = step_logger()
    trained = fine_tune(
        src["model_dir"],
        src["content_hash"],
        spec,
        work,
        lambda step, loss: log.info("train: step %d of %d, loss %.4f", step, spec.steps, loss),
    )
    note_reuse("train", trained)
    log.info(
        "train: accuracy %.4f on the training data%s",
        trained["train_accuracy"],
        f", {trained['eval_accuracy']:.4f} held out"
        if trained["eval_accuracy"] is not None
        else "",
    )
    return trained


@task(
    name="log-model",
    task_run_name="log-model {spec.registry.model_name}",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def log_model(trained: TrainResult, spec: TrainingSpec, tracking_uri: str) -> Registered:
    registered = log_trained(trained, spec, tracking_uri)
    step_logger().info(
        "log-model: %s version %s (alias %s)",
        registered["model"],
        registered["version"],
        registered["alias"],
    )
    return registered


@task(
    name="announce",
    task_run_name="announce {registered[model]} v{registered[version]}",
    **NO_PREFECT_CACHE,
)
def announce(registered: Registered, trained: TrainResult, spec: TrainingSpec) -> None:
    """The training metrics and MLflow links in the UI, and the event a release waits for."""
    publish_training(spec, registered, trained)
    announce_version(registered, trained)
