"""Steps of the retraining flow: `train` fine-tunes the encoder (hf2triton.training), `log-model`
registers it in MLflow with its alias, and `announce` tells Prefect a new version exists (the
event the release deployment's trigger waits for), with the training figures in the UI."""

from __future__ import annotations

from prefect import task
from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact
from prefect.events import emit_event

from hf2triton.report import artifact_key, mlflow_links
from hf2triton.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, note_reuse, step_logger
from hf2triton.sources import FetchResult
from hf2triton.spec import TrainingSpec
from hf2triton.training import REGISTERED_EVENT, Registered, TrainResult, fine_tune, log_trained


@task(name="train", task_run_name="train {spec.name}", **NO_PREFECT_CACHE)
def train(src: FetchResult, spec: TrainingSpec, work: str) -> TrainResult:
    log = step_logger()
    trained = fine_tune(src["model_dir"], src["content_hash"], spec, work,
                        lambda step, loss: log.info("train: step %d of %d, loss %.4f", step,
                                                    spec.steps, loss))
    note_reuse("train", trained)
    log.info("train: accuracy %.4f on the training data%s", trained["train_accuracy"],
             f", {trained['eval_accuracy']:.4f} held out" if trained["eval_accuracy"] is not None
             else "")
    return trained


@task(name="log-model", task_run_name="log-model {spec.registry.model_name}", **RETRY_TRANSIENT,
      **NO_PREFECT_CACHE)
def log_model(trained: TrainResult, spec: TrainingSpec, tracking_uri: str) -> Registered:
    registered = log_trained(trained, spec, tracking_uri)
    step_logger().info("log-model: %s version %s (alias %s)", registered["model"],
                       registered["version"], registered["alias"])
    return registered


@task(name="announce", task_run_name="announce {registered[model]} v{registered[version]}",
      **NO_PREFECT_CACHE)
def announce(registered: Registered, trained: TrainResult, spec: TrainingSpec) -> None:
    """The training metrics and MLflow links in the UI, and the event a release waits for."""
    key = spec.name
    create_table_artifact(
        [{"step": (i + 1) * 10, "train loss": loss} for i, loss in enumerate(trained["losses"])],
        key=artifact_key(key, "loss"), description=f"Training loss of {spec.name}")
    held = trained["eval_accuracy"]
    create_markdown_artifact(
        f"# Training {spec.name}: {registered['model']} version {registered['version']}\n\n"
        f"| | |\n|---|---|\n| steps | {spec.steps} (batch {spec.batch_size}, seed {spec.seed}) |\n"
        f"| final train loss | {trained['losses'][-1]:.4f} |\n"
        f"| train accuracy | {trained['train_accuracy']:.4f} |\n"
        f"| held-out accuracy | {'n/a' if held is None else f'{held:.4f}'} |\n"
        f"| MLflow | `models:/{registered['model']}/{registered['version']}` "
        f"(alias `{registered['alias']}`) |\n",
        key=artifact_key(key, "report"), description=f"Training report of {spec.name}")
    for what, link in mlflow_links(registered["tracking_uri"], registered["run_id"], None,
                                   registered["model"], registered["version"]).items():
        create_link_artifact(link, link_text=f"MLflow {what}",
                             key=artifact_key(key, f"mlflow-{what}"))
    emit_event(event=REGISTERED_EVENT,
               resource={"prefect.resource.id": f"mlflow.model.{registered['model']}",
                         "prefect.resource.name": registered["model"],
                         "version": registered["version"], "alias": registered["alias"]},
               payload={"run_id": registered["run_id"], "alias": registered["alias"],
                        "train_accuracy": trained["train_accuracy"], "eval_accuracy": held})
