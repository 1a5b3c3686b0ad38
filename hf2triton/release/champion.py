"""The serving champion, for the gate: the MLflow version with alias `champion` of the release's
registered model, scored on the same labelled data by the same serving code as the candidate
(its own served files: model, tokenizer and serving.json from its `triton_repository`
artifact). A candidate whose task metric (accuracy, nDCG@10) falls more than
`validation.max_drop` below the champion's does not ship; MLflow's model validation
(`mlflow.validate_evaluation_results` with a `MetricThreshold`) makes the call, so the registry
records it in its own terms.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, TypedDict

from hf2triton import serving
from hf2triton.clients.mlflow import Registry
from hf2triton.util.workspace import cached_step, digest, hash_files, home


class Champion(TypedDict):
    model: str  # MLflow registered model
    version: str
    run_id: str | None  # None: a version registered without a run (not by a release)
    version_dir: str  # its served version directory (downloaded once)
    files: dict[str, str]  # sha256 of each of its served files
    settings: dict[str, Any]  # its serving.json


def find_champion(model: str, tracking_uri: str) -> Champion | None:
    """The serving champion's served files, or None before the first release."""
    from mlflow.exceptions import MlflowException

    registry = Registry(tracking_uri)
    if not registry.has_model(model):
        return None
    try:
        mv = registry.call(
            "find the champion", registry.client.get_model_version_by_alias, model, "champion"
        )
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None  # registered, never promoted: no champion yet
        raise
    version = str(mv.version)

    def download(out: Path) -> dict[str, Any]:
        # A release's versions come from its run; the served files are that run's artifacts.
        assert mv.run_id is not None, f"{model} version {version} has no run"
        run = registry.run(mv.run_id)
        local = registry.call(
            "download the champion's served files",
            registry.client.download_artifacts,
            mv.run_id,
            "triton_repository",
            str(out.parent / f".{out.name}.download"),
        )
        found = sorted(Path(local).glob(f"*/1/{serving.SERVING_FILE}"))
        if not found:
            raise FileNotFoundError(
                f"no served version in run {run.info.run_id}'s triton_repository artifact"
            )
        shutil.copytree(found[0].parent, out, dirs_exist_ok=True)
        shutil.rmtree(local, ignore_errors=True)
        return {}

    done = cached_step(
        home() / "champions", model, digest([tracking_uri, model, version, mv.run_id]), download
    )
    return Champion(
        model=model,
        version=version,
        run_id=mv.run_id,
        version_dir=str(done.path),
        files=hash_files(done.path),
        settings=serving.read_settings(str(done.path)),
    )


def champion_limit(metric: str, champion_value: float, max_drop: float) -> dict[str, Any]:
    """The gate's limit a candidate's `metric` must meet: the champion's, less max_drop."""
    return {metric: (">=", round(champion_value - max_drop, 6))}


def mlflow_verdict(metric: str, candidate: float, champion: float, max_drop: float) -> str | None:
    """MLflow's model validation of the candidate against the champion: None when it passes,
    else MLflow's own message."""
    from mlflow.models import MetricThreshold
    from mlflow.models.evaluation import EvaluationResult
    from mlflow.models.evaluation.validation import (
        ModelValidationFailedException,
        validate_evaluation_results,
    )

    # The floor the report shows (rounded as champion_limit rounds it): a candidate exactly at
    # champion - max_drop passes.
    threshold = MetricThreshold(
        threshold=round(float(champion - max_drop), 6), greater_is_better=True
    )
    try:
        validate_evaluation_results(
            validation_thresholds={metric: threshold},
            candidate_result=EvaluationResult(metrics={metric: float(candidate)}, artifacts={}),
            baseline_result=EvaluationResult(metrics={metric: float(champion)}, artifacts={}),
        )
    except ModelValidationFailedException as exc:
        return " ".join(str(exc).split())
    return None
