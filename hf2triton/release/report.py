"""What a person reads in the Prefect UI, for every kind: a markdown release report (lineage,
metrics against their gates, served figures, the variants, image, endpoint), a table of every
candidate against PyTorch, and links to the MLflow run and model version. A refused release
publishes the gate's report instead. Everything here is written against the kind's limits, so a
new kind gets its report without code of its own.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

from hf2triton.kinds.base import ModelKind
from hf2triton.kinds.config import KindConfig
from hf2triton.runtimes import label
from hf2triton.util.cpu import describe as describe_cpu
from hf2triton.util.workspace import redact_uri

if TYPE_CHECKING:
    from hf2triton.spec import TrainingSpec
    from hf2triton.training.classifier import Registered, TrainResult


def artifact_key(name: str, suffix: str) -> str:
    # Artifact keys: lower-case letters, digits and dashes.
    return "".join(c if c.isalnum() else "-" for c in f"{name}-{suffix}".lower())


def _verdict(cand: dict[str, Any], chosen: str | None) -> str:
    if cand["name"] == chosen:
        return "ships"
    if cand.get("error"):
        return f"refused: {cand['error'][:120]}"
    if cand.get("timed") is False:
        return "not timed: its family's first candidate (its runtime at its precision) was slower"
    if not cand.get("judged", True):
        return "not judged: slower than one that passes"
    return "passes, slower" if not cand["misses"] else "misses the gate"


def _runtime(cand: dict[str, Any]) -> str:
    """'openvino bf16'; with a CPU numerics check, what the gate ran it on too."""
    served, gated = cand.get("runtime"), cand.get("gated_on")
    text = label(served)
    if gated and gated != served:
        text += f" (gated on {label(gated)})"
    return text


def accuracy_rows(kind: ModelKind[KindConfig], report: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for cand in report["candidates"]:
        row: dict[str, Any] = {"variant": cand["name"], "runtime": _runtime(cand)}
        for metric, (op, limit) in report["limits"].items():
            value = cand["metrics"].get(metric)
            row[metric] = round(value, 6) if value is not None else None
            row[f"{metric} gate"] = f"{op} {limit}"
        for batch, rate in cand.get("throughput", {}).items():
            row[f"per s {batch.replace('_', ' ')}"] = rate
        row["verdict"] = _verdict(cand, report.get("chosen"))
        row["worst case"] = kind.example(cand.get("details", {}))[:80]
        rows.append(row)
    return rows


def publish_gate_failure(
    release: str, kind: ModelKind[KindConfig], report: dict[str, Any], message: str
) -> None:
    """The refusal, in the UI: which metric missed by how much, for every candidate."""
    create_table_artifact(
        accuracy_rows(kind, report),
        key=artifact_key(release, "accuracy"),
        description=f"Accuracy gate of {release}: no candidate passed",
    )
    create_markdown_artifact(
        f"# Release {release}: refused\n\n{message}\n",
        key=artifact_key(release, "report"),
        description=f"{release}: accuracy gate failed",
    )


def mlflow_links(
    uri: str, run_id: str, experiment_id: str | None, model: str, version: str
) -> dict[str, str]:
    if not uri.startswith(("http://", "https://")):
        return {}  # a SQLite store has no UI address to link to
    base = redact_uri(uri).rstrip("/")  # a user:password in the URI never reaches an artifact
    run = (
        f"{base}/#/experiments/{experiment_id}/runs/{run_id}"
        if experiment_id
        else f"{base}/#/runs/{run_id}"
    )
    return {"run": run, "version": f"{base}/#/models/{model}/versions/{version}"}


def champion_section(report: dict[str, Any], summary: dict[str, Any]) -> str:
    """The candidate's task metric beside the serving champion's (labelled data only)."""
    champ = report.get("champion")
    if not champ:
        return ""
    metric = champ["metric"]
    mine = summary["metrics"].get(metric)
    if champ.get("value") is None:  # no champion yet, or the champion is this very model
        return (
            f"## Against the serving champion\n{champ['status']}: {metric} of this version "
            f"{mine:.4f}.\n"
        )
    return f"""## Against the serving champion
| metric | this version {summary["mlflow"]["version"]} | champion version {champ["version"]} | max
drop | verdict (MLflow model validation) | |---|---|---|---|---|
| {metric} | {mine:.4f} | {champ["value"]:.4f} | {champ["max_drop"]} | passed: >=
{champ["floor"]:.4f} |
"""


def variants_table(report: dict[str, Any]) -> str:
    """The rows of the report's variants table (and what this machine could not try)."""
    limits = report["limits"]

    def row(c: dict[str, Any]) -> str:
        figures = " | ".join(f"{c['metrics'].get(k, float('nan')):.4f}" for k in limits)
        rate = c.get("throughput", {}).get("speed", "")
        return (
            f"| {c['name']} | {_runtime(c)} | {figures} | {rate} | "
            f"{_verdict(c, report.get('chosen'))} |"
        )

    not_offered = "".join(
        f"\n- not tried here: {what} ({why})"
        for what, why in (report.get("not_offered") or {}).items()
    )
    return "\n".join(row(c) for c in report["candidates"]) + "\n" + not_offered


def release_markdown(
    kind: ModelKind[KindConfig], summary: dict[str, Any], report: dict[str, Any]
) -> str:
    limits = report["limits"]
    metrics = summary["metrics"]
    metric_lines = "\n".join(
        f"| {k} | {metrics[k]:.6f} | {metrics.get('smoke_' + k, float('nan')):.6f} | {op} {v} |"
        for k, (op, v) in limits.items()
        if k in metrics
    )
    image = summary.get("image") or {}
    image_line = (
        f"`{image['reference']}`" if image.get("reference") else image.get("skipped", "not built")
    )
    src, ml, endpoint = summary["source"], summary["mlflow"], summary["endpoint"]
    cpu = report.get("cpu")
    timing = f"measured on {describe_cpu(cpu)}" if cpu else "not measured"
    if summary.get("container") or summary.get("kubernetes"):
        timing += " (the release machine: the serving target runs elsewhere, re-time it there)"
    return f"""# Release {summary["release"]}: MLflow {ml["model_name"]} version {ml["version"]}

## Lineage
| | |
|---|---|
| kind | {kind.name} (`task: {kind.task}`) |
| source | `{src["id"]}` |
| revision | `{src["revision"] or "local directory"}` |
| content hash | `{src["content_hash"]}` |
| shipped variant | {summary["variant"]} |
| variant timing | {timing} |
| image | {image_line} |

## Accuracy against PyTorch ({report["items"]} validation {kind.item_word})
| metric | validated | served (smoke) | gate |
|---|---|---|---|
{metric_lines}

{champion_section(report, summary)}
## Variants
| variant | runtime | {" | ".join(limits)} | per s at 32 | verdict |
|---|---|{"---|" * len(limits)}---|---|
{variants_table(report)}

## Endpoint
- HTTP: `{endpoint["http"]}`
- gRPC: `{endpoint["grpc"]}` (model `{endpoint["model"]}`, version {endpoint["version"]})
- reused steps: {", ".join(summary["reused_steps"]) or "none"}
"""


def publish_release_report(
    kind: ModelKind[KindConfig],
    summary: dict[str, Any],
    report_path: str,
    experiment_id: str | None,
) -> str:
    """Create the run's artifacts; returns the markdown it published."""
    with open(report_path, encoding="utf-8") as f:
        report = json.load(f)
    name, ml = summary["release"], summary["mlflow"]
    create_table_artifact(
        accuracy_rows(kind, report),
        key=artifact_key(name, "accuracy"),
        description=f"Accuracy of {name}'s candidates against PyTorch",
    )
    markdown = release_markdown(kind, summary, report)
    create_markdown_artifact(
        markdown, key=artifact_key(name, "report"), description=f"Release report of {name}"
    )
    for what, link in mlflow_links(
        ml["tracking_uri"], ml["run_id"], experiment_id, ml["model_name"], ml["version"]
    ).items():
        create_link_artifact(
            link,
            link_text=f"MLflow {what}",
            key=artifact_key(name, f"mlflow-{what}"),
            description=f"MLflow {what} of this release",
        )
    return markdown


def publish_training(spec: TrainingSpec, registered: Registered, trained: TrainResult) -> None:
    """A training run in the UI: its loss curve, a report, and links to MLflow."""
    key = spec.name
    create_table_artifact(
        [{"step": (i + 1) * 10, "train loss": loss} for i, loss in enumerate(trained["losses"])],
        key=artifact_key(key, "loss"),
        description=f"Training loss of {spec.name}",
    )
    held = trained["eval_accuracy"]
    create_markdown_artifact(
        f"# Training {spec.name}: {registered['model']} version {registered['version']}\n\n"
        f"| | |\n|---|---|\n| steps | {spec.steps} (batch {spec.batch_size}, seed {spec.seed}) |\n"
        f"| final train loss | {trained['losses'][-1]:.4f} |\n"
        f"| train accuracy | {trained['train_accuracy']:.4f} |\n"
        f"| held-out accuracy | {'n/a' if held is None else f'{held:.4f}'} |\n"
        f"| MLflow | `models:/{registered['model']}/{registered['version']}` "
        f"(alias `{registered['alias']}`) |\n",
        key=artifact_key(key, "report"),
        description=f"Training report of {spec.name}",
    )
    for what, link in mlflow_links(
        registered["tracking_uri"],
        registered["run_id"],
        None,
        registered["model"],
        registered["version"],
    ).items():
        create_link_artifact(
            link, link_text=f"MLflow {what}", key=artifact_key(key, f"mlflow-{what}")
        )
