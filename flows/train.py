"""The `train-classifier` flow, the worked example of a retraining job: fetch the encoder,
fine-tune it on the spec's labelled data, register the model in MLflow with its alias, and
announce the new version (the release deployment of an `mlflow` source is triggered by it).
"""

from __future__ import annotations

from prefect import flow

from hf2triton.clients.mlflow import tracking_uri
from hf2triton.spec import TrainingSpec, parse_spec
from hf2triton.tasks.fetch import fetch
from hf2triton.tasks.train import announce, log_model, train
from hf2triton.util.json_types import JSONObject, RawSpec, json_object
from hf2triton.util.workspace import work_dir


@flow(name="train-classifier", log_prints=False, validate_parameters=False)
def train_classifier(spec: TrainingSpec | RawSpec) -> JSONObject:
    """Fine-tune and register one classifier as `spec` describes; returns the new version."""
    spec = parse_spec(spec, model=TrainingSpec)
    src = fetch(spec.base)
    trained = train(src, spec, work_dir(spec.name))
    registered = log_model(trained, spec, tracking_uri())
    announce(registered, trained, spec)
    return json_object(
        {
            **registered,
            "train_accuracy": trained["train_accuracy"],
            "eval_accuracy": trained["eval_accuracy"],
            "reused": trained["reused"],
        }
    )
