"""The release record, assembled once from the steps' results: the key that identifies a release
(same model content and same served repository: same release), the lineage tags, metrics and
params MLflow keeps, and the summary the CLI prints and the report shows.
"""

from __future__ import annotations

from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any, TypedDict

from hf2triton.kinds.base import to_json
from hf2triton.release.results import Built, Served
from hf2triton.spec import ReleaseSpec
from hf2triton.util.cpu import cpu_features
from hf2triton.util.workspace import digest, redact_uri

LIBRARIES = (
    "torch",
    "transformers",
    "optimum",
    "optimum-onnx",
    "onnx",
    "onnxruntime",
    "mlflow",
    "prefect",
)


def tagged(name: str) -> bool:
    """Files of the Triton repository whose sha256 is a version tag: the model's config.pbtxt and
    every file directly in its version directory (the graph and its weights, whatever the runtime
    reads: model.onnx and its external data, OpenVINO's model.xml and model.bin, a translator's
    encoder and decoder; the tokenizer; serving.json; model.py). The serving core's modules and
    the warmup samples are in the repository's content hash."""
    parts = name.split("/")
    return parts[-1] == "config.pbtxt" and len(parts) == 2 or len(parts) == 3 and parts[1] == "1"


class Record(TypedDict):
    release_key: str
    lineage: dict[str, str]  # MLflow version tags
    metrics: dict[str, float]
    params: dict[str, Any]
    artifacts: dict[str, str]  # artifact path in the run -> local file or directory


def library_versions() -> dict[str, str]:
    found = {}
    for lib in LIBRARIES:
        try:
            found[lib] = version(lib)
        except PackageNotFoundError:
            found[lib] = "not installed"
    return found


def release_key(src: Mapping[str, Any], repo: Mapping[str, Any]) -> str:
    return digest([src["content_hash"], repo["content_hash"]])


def champion_tags(champion: dict[str, Any], model_name: str) -> dict[str, str]:
    """The comparison with the serving champion, in the version's own record (none without
    labelled data)."""
    if not champion:
        return {}
    metric = champion["metric"]
    value = champion.get("value")
    tags = {
        "validation.champion_version": str(champion.get("version") or "none"),
        f"validation.champion.{metric}": f"{value:.6g}" if value is not None else "n/a",
        f"validation.candidate.{metric}": f"{champion['candidate']:.6g}",
        "validation.status": champion.get("status") or "passed",
    }
    if champion.get("floor") is not None:
        tags["validation.baseline"] = f"models:/{model_name}/{champion['version']}"
        tags["validation.threshold"] = f"{metric} >= {champion['floor']:.6g}"
    return tags


def release_record(spec: ReleaseSpec, built: Built) -> Record:
    """What `register` writes to MLflow for this release."""
    src, exp, val, repo = built.src, built.exp, built.val, built.repo
    return Record(
        release_key=release_key(src, repo),
        lineage=lineage_tags(spec, built),
        metrics=record_metrics(built),
        params=record_params(spec, built),
        artifacts={
            "triton_repository": repo["repository"],
            **export_artifacts(exp["export_dir"], spec.registry.log_export),
            "validation_report.json": val["report_path"],
            # the smoke items and limits, for the watch's probe and a later rollback
            "reference.json": val["reference_path"],
        },
    )


# The export's graph files: ONNX graphs and their external data.
GRAPH_SUFFIXES = (".onnx", ".onnx_data", ".onnx.data", ".data")


def export_artifacts(export_dir: str, whole: bool) -> dict[str, str]:
    """The export as the record's `model/` artifacts: the whole folder when `whole`
    (registry.log_export), else its files but the graphs (configuration, tokenizer): the served
    graph is in triton_repository/ once, not again beside it."""
    if whole:
        return {"model": export_dir}
    return {
        f"model/{p.name}": str(p)
        for p in sorted(Path(export_dir).iterdir())
        if p.is_file() and not p.name.endswith(GRAPH_SUFFIXES)
    }


def lineage_tags(spec: ReleaseSpec, built: Built) -> dict[str, str]:
    """The MLflow version's lineage tags: where the model came from, what was chosen, and the
    sha256 of every file it was made of and every file Triton loads."""
    src, val, repo = built.src, built.val, built.repo
    lineage = {
        "source_id": src["source_id"],
        "revision": src["revision"] or "local",
        "content_hash": src["content_hash"],
        "variant": val["chosen"],
        "kind": spec.task,
        **{
            f"source.registry.{k}": redact_uri(v) if k == "uri" else v
            for k, v in (src.get("registry") or {}).items()
            if v
        },
        **{f"sha256.{name}": sha for name, sha in src["files"].items()},
        **{f"sha256.triton.{name}": sha for name, sha in repo["files"].items() if tagged(name)},
    }
    lineage.update(champion_tags(val.get("champion") or {}, spec.registry.model_name))
    return lineage


def record_metrics(built: Built) -> dict[str, float]:
    """The run's metrics: the gate's figures for every candidate, sizes and step times, and
    the configuration search's figures of what ships."""
    exp, variants, val, tuned = built.exp, built.variants, built.val, built.tuned
    # The export is the last variant, where there is an ONNX graph (hf2triton.release.export);
    # the first is the spec's own (when it is not the export).
    export = variants[-1] if exp["onnx_path"] else None
    first = variants[0]
    metrics = {
        **val["metrics"],
        **{f"{n}.{k}": v for n, m in val["candidates"].items() for k, v in m.items()},
        **({"export_max_abs_diff": exp["max_abs_diff"]} if export else {}),
        **({"onnx_fp32_bytes": export["size_bytes"]} if export else {}),
        **(
            {"onnx_int8_bytes": first["size_bytes"]}
            if export and first is not export and first["size_bytes"]
            else {}
        ),
        **{f"variant.{v['method']}.bytes": v["size_bytes"] for v in variants if v["size_bytes"]},
        "export_seconds": exp["seconds"],
        "quantize_seconds": round(sum(v["seconds"] for v in variants), 3),
        "validate_seconds": val["seconds"],
    }
    if tuned is not None:
        best = next(c for c in tuned["cells"] if c["settings"] == tuned["chosen"])
        metrics.update(
            {
                f"tuning.{k}_at_{p['clients']}": p[k]
                for p in best["points"]
                for k in ("rps", "p99_ms")
            }
        )
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}


def record_params(spec: ReleaseSpec, built: Built) -> dict[str, Any]:
    """The run's params: the whole spec, library versions, the CPU, and the kind's resolved
    config (long lists left to the artifacts)."""
    exp, tuned = built.exp, built.tuned
    params: dict[str, Any] = {
        **spec.model_dump(mode="json"),
        "versions": library_versions(),
        "cpu": cpu_features(),
        "opset": exp["opset"] or "no ONNX graph",
        "resolved": to_json(exp["config"]),
    }
    if tuned is not None:
        params["tuning_chosen"] = tuned["chosen"]
    # Long lists (labels, language tables) do not fit an MLflow param; the artifacts have them.
    params["resolved"] = {
        k: v
        for k, v in params["resolved"].items()
        if not isinstance(v, (list, dict)) or len(str(v)) < 500
    }
    return params


def reused_steps(**steps: Mapping[str, Any]) -> list[str]:
    """The steps (by their task names) that found their finished output of an earlier run."""
    names = {"exp": "export", "repository": "build-repository"}
    return [names.get(step, step) for step, result in steps.items() if result.get("reused")]


def summary(spec: ReleaseSpec, built: Built, served: Served) -> dict[str, Any]:
    """The release summary: one JSON line on the CLI's stdout, the flow's return value."""
    src, val, reg, smoke = built.src, built.val, served.reg, served.smoke
    reused = reused_steps(
        exp=built.exp,
        quantize=built.variants[0],
        validate=val,
        repository=built.repo,
        register=reg,
        deploy=served.deployment,
    )
    return {
        "release": spec.name,
        "mlflow": {
            "model_name": reg["model_name"],
            "version": reg["version"],
            "run_id": reg["run_id"],
            "tracking_uri": reg["tracking_uri"],
        },
        "source": {
            "id": src["source_id"],
            "revision": src["revision"],
            "content_hash": src["content_hash"],
        },
        "variant": val["chosen"],
        "metrics": {
            **val["metrics"],
            **{f"smoke_{k}": v for k, v in smoke.items() if k in val["metrics"]},
        },
        **served.endpoint,
        "image": served.image,
        "reused_steps": reused,
        # The long steps' wall seconds (a reused step's is its reading back).
        "seconds": {
            "export": built.exp["seconds"],
            "quantize": round(sum(v["seconds"] for v in built.variants), 1),
            "validate": val["seconds"],
        },
    }
