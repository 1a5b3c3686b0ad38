"""The `release-model` flow: fetch -> export -> quantize -> validate -> build repository ->
register -> deploy -> smoke -> promote. Orchestration only; each step lives in `tasks/`.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger
from prefect.transactions import transaction

from hf2triton.embeddings import read_sentences, resolve_embedding_config
from hf2triton.spec import ReleaseSpec, Task, parse_spec
from hf2triton.task_config import resolve_task_config
from hf2triton.workspace import digest, home
from tasks.deploy import deploy, retire
from tasks.export import export
from tasks.fetch import fetch
from tasks.image import deploy_image, release_image
from tasks.kubernetes import deploy_k8s
from tasks.quantize import quantize
from tasks.register import library_versions, promote, register
from tasks.replicas import deploy_set, retire_set, smoke_set
from tasks.report import report
from tasks.repository import repository, task_repository
from tasks.smoke import smoke
from tasks.tune import describe, tune
from tasks.validate import Candidate, validate
from tasks.validate_classification import validate_classifier
from tasks.validate_translation import validate_translator


def _reuse_note(logger, step: str, result: dict[str, Any]) -> str | None:
    if result.get("reused"):
        logger.info("%s: reused the finished output of an earlier run (same inputs)", step)
        return step
    return None


@flow(name="release-model", log_prints=False, validate_parameters=False)
def release_model(spec: ReleaseSpec | dict[str, Any]) -> dict[str, Any]:
    """Release one model as described by `spec`; returns the release summary."""
    spec = parse_spec(spec)
    logger = get_run_logger()
    work = str(home() / "work" / spec.name)
    sentences = read_sentences(spec.validation.sentences)  # bad input fails before any work
    logger.info("release %s: %d validation sentences", spec.name, len(sentences))

    src = fetch(spec.source)
    logger.info("fetch: %s at %s, content %s", src["source_id"], src["revision"] or "local",
                src["content_hash"][:12])
    emb = resolve_embedding_config(src["model_dir"], spec.embedding.pooling,
                                   spec.embedding.normalize, spec.embedding.max_length)
    # text-classification and translation: labels or decoding settings instead of pooling.
    embedding_task = spec.task is Task.FEATURE_EXTRACTION
    cfg = emb if embedding_task else resolve_task_config(spec, src["model_dir"])
    tuned = None

    exp = export(src["model_dir"], src["content_hash"], spec.task.value, spec.export.opset,
                 spec.export.atol, cfg, sentences, work)
    variants = quantize(exp["onnx_path"], spec.quantization, work)
    quant = variants[0]
    candidates = [Candidate(name=v["method"], onnx_path=v["onnx_path"]) for v in variants]
    if spec.quantization.method != "none" and (
            spec.quantization.fallback_to_fp32 or spec.quantization.search):
        candidates.append(Candidate(name="fp32", onnx_path=exp["onnx_path"]))
    if embedding_task:
        val = validate(src["model_dir"], exp["export_dir"], candidates, emb,
                       spec.validation.sentences, spec.validation.thresholds,
                       spec.validation.smoke_sentences, work,
                       "fastest" if spec.quantization.search else "first")
        for name, m in val["candidates"].items():
            passes = all(m[k] >= v for k, v in spec.validation.thresholds.model_dump().items())
            logger.info("validate: %s min cosine %.4f, mean %.4f, spearman %.4f%s -> %s", name,
                        m["min_cosine"], m["mean_cosine"], m["spearman"],
                        f", {m['sentences_per_s_batch_32']:.0f} sentences/s at batch 32"
                        if "sentences_per_s_batch_32" in m else "",
                        "ships" if name == val["chosen"] else
                        "passes, slower" if passes else "misses the gate")
        serving = spec.deploy
        if spec.deploy.tuning.search:  # measured on a private server, written into config.pbtxt
            tuned = tune(spec.triton_model_name, val["onnx_path"], exp["export_dir"], emb,
                         val["embedding_dim"], spec.deploy, val["smoke_texts"][-2:],
                         [t for t in sentences if t.strip()][:256], work)
            serving = spec.deploy.model_copy(update=tuned["chosen"])
            logger.info("tune: ships %s", describe(tuned["chosen"]))
        repo = repository(spec.triton_model_name, val["onnx_path"], exp["export_dir"], emb,
                          val["embedding_dim"], serving, val["smoke_texts"][-2:], work)
    else:
        gate = validate_classifier if spec.task is Task.TEXT_CLASSIFICATION else \
            validate_translator
        val = gate(src["model_dir"], exp["export_dir"], candidates, cfg,
                   spec.validation.sentences, spec.task_section, spec.validation.smoke_sentences,
                   work)
        for name, m in val["candidates"].items():
            logger.info("validate: %s %s -> %s", name,
                        ", ".join(f"{k} {v:.4f}" for k, v in m.items()),
                        "ships" if name == val["chosen"] else "misses the gate")
        repo = task_repository(spec.triton_model_name, val["onnx_path"], exp["export_dir"], cfg,
                               spec.deploy, val["smoke_texts"][-2:], work)
    lineage = {
        "source_id": src["source_id"], "revision": src["revision"] or "local",
        "content_hash": src["content_hash"], "variant": val["chosen"],
        **{f"sha256.{name}": sha for name, sha in src["files"].items()},
        **{f"sha256.triton.{name}": sha for name, sha in repo["files"].items()
           if name.endswith(("model.onnx", "tokenizer.json", "config.pbtxt"))},
    }
    metrics = {
        **{k: v for k, v in val["metrics"].items()},
        **{f"{n}.{k}": v for n, m in val["candidates"].items() for k, v in m.items()},
        "export_max_abs_diff": exp["max_abs_diff"], "onnx_fp32_bytes": quant["fp32_bytes"],
        "onnx_int8_bytes": quant["size_bytes"], "export_seconds": exp["seconds"],
        "quantize_seconds": quant["seconds"], "validate_seconds": val["seconds"],
    }
    if tuned is not None:
        best = next(c for c in tuned["cells"] if c["settings"] == tuned["chosen"])
        metrics.update({f"tuning.{k}_at_{p['clients']}": p[k] for p in best["points"]
                        for k in ("rps", "p99_ms")})
    params = {**spec.model_dump(mode="json"), "versions": library_versions(),
              **({"tuning_chosen": tuned["chosen"]} if tuned is not None else {}),
              "opset": exp["opset"], "embedding_resolved": emb.to_dict(),
              **({} if embedding_task else {"task_resolved": {
                  k: v for k, v in cfg.to_dict().items() if k not in ("labels", "target_langs")}})}
    reg = register(
        spec.registry.model_name, spec.registry.experiment,
        digest([src["content_hash"], repo["content_hash"]]), params, metrics, lineage,
        {"triton_repository": repo["repository"], "model": exp["export_dir"],
         "validation_report.json": val["report_path"]},
    )
    logger.info("register: %s version %s%s", reg["model_name"], reg["version"],
                " (already registered: same release key)" if reg["reused"] else "")

    # The serving image: built offline, pushed, its digest recorded on the MLflow version.
    image = release_image(spec, repo["repository"], repo["files"], reg["model_name"],
                          reg["version"], digest([src["content_hash"], repo["content_hash"]]),
                          lineage)

    smoke_gate = spec.deploy.smoke_min_cosine or spec.validation.thresholds.min_cosine
    if spec.deploy.target == "docker":
        # Blue/green: the image runs by digest and passes the smoke test before it replaces the
        # container that serves; a failure leaves that container serving.
        rolled = deploy_image(image["reference"], spec.name, spec.triton_model_name,
                              reg["version"], spec.deploy, val["reference_path"], smoke_gate,
                              spec.image)
        dep, sm = rolled["deployment"], rolled["smoke"]
        promote(reg["model_name"], reg["version"],
                {k: v for k, v in sm.items() if k != "sentences"})
    elif spec.deploy.target == "kserve":
        # The image by digest on the cluster (KServe InferenceService or a Deployment); champion
        # moves once the served model passes the smoke test where the pipeline reaches it.
        dep = deploy_k8s(spec.name, spec.triton_model_name, reg["model_name"], reg["version"],
                         image, spec.deploy.kubernetes, spec.deploy.ready_timeout_s, work)
        sm = smoke(dep["grpc_url"], dep["http_url"], spec.triton_model_name, "",
                   val["reference_path"], smoke_gate, spec.deploy.max_batch_size)
        promote(reg["model_name"], reg["version"],
                {k: v for k, v in sm.items() if k != "sentences"})
    elif spec.deploy.target == "triton-replicas":
        # The same rollout on every replica: all load the new version beside the old one and all
        # pass the smoke test, or the rollback puts all of them back.
        with transaction():
            dep = deploy_set(repo["repository"], spec.triton_model_name, reg["version"],
                             repo["files"], spec.deploy)
            sm = smoke_set(dep, val["reference_path"], smoke_gate, spec.deploy.max_batch_size)
            promote(reg["model_name"], reg["version"],
                    {k: v for k, v in sm.items() if k != "sentences"})
        retired = retire_set(dep)
        logger.info("deploy: version %s serves on %d replicas%s", reg["version"],
                    len(dep["replicas"]), f"; retired version(s) {', '.join(retired)}"
                    if retired else "")
    else:
        # The rollout: the new version loads beside the serving one. If the smoke test or the
        # alias move fails, the transaction's rollback unloads the new version; the old never
        # stopped.
        with transaction():
            dep = deploy(repo["repository"], spec.triton_model_name, reg["version"],
                         repo["files"], spec.deploy)
            sm = smoke(dep["grpc_url"], dep["http_url"], spec.triton_model_name, reg["version"],
                       val["reference_path"], smoke_gate, spec.deploy.max_batch_size)
            promote(reg["model_name"], reg["version"],
                    {k: v for k, v in sm.items() if k != "sentences"})
        retired = retire(dep)
        if retired:
            logger.info("deploy: version %s serves; retired version(s) %s", reg["version"],
                        ", ".join(retired))
    if embedding_task:
        logger.info("smoke: served = PyTorch within min cosine %.4f (gRPC p50 %.1f ms); champion "
                    "is now version %s", min(sm["grpc_min_cosine"], sm["http_min_cosine"]),
                    sm["grpc_p50_ms"], reg["version"])
    else:
        logger.info("smoke: served = validated model, %s (gRPC p50 %.1f ms); champion is now "
                    "version %s", ", ".join(f"{k} {v:.4g}" for k, v in sm.items()
                                            if not k.endswith("_ms")),
                    sm["grpc_p50_ms"], reg["version"])

    reused = [s for s, r in (("export", exp), ("quantize", quant), ("validate", val),
                             ("build-repository", repo), ("register", reg), ("deploy", dep))
              if _reuse_note(logger, s, r)]
    base = f"{spec.deploy.host}"
    replicas = [{"http": r["http_url"], "grpc": r["grpc_url"]}
                for r in dep["replicas"]] if spec.deploy.target == "triton-replicas" else []
    http_at = replicas[0]["http"] if replicas else f"{base}:{spec.deploy.http_port}"
    grpc_at = replicas[0]["grpc"] if replicas else f"{base}:{spec.deploy.grpc_port}"
    if spec.deploy.target == "kserve":
        http_at, grpc_at = dep["http_url"], dep["grpc_url"]
    summary = {
        "release": spec.name,
        "mlflow": {"model_name": reg["model_name"], "version": reg["version"],
                   "run_id": reg["run_id"], "tracking_uri": reg["tracking_uri"]},
        "source": {"id": src["source_id"], "revision": src["revision"],
                   "content_hash": src["content_hash"]},
        "variant": val["chosen"],
        "metrics": {**val["metrics"], **({"smoke_min_cosine": min(
            sm["grpc_min_cosine"], sm["http_min_cosine"], sm["batch_min_cosine"])}
            if embedding_task else {f"smoke_{k}": v for k, v in sm.items()})},
        "endpoint": {
            "model": spec.triton_model_name, "version": reg["version"],
            "http": f"http://{http_at}/v2/models/"
                    f"{spec.triton_model_name}/versions/{reg['version']}/infer",
            "grpc": grpc_at,
            **({"replicas": replicas} if replicas else {}),
        },
        "image": image,
        **({"kubernetes": {k: dep[k] for k in ("workload", "namespace", "name", "image",
                                                "storage_uri", "manifests")}}
           if spec.deploy.target == "kserve" else {}),
        **({"container": {k: dep[k] for k in ("container_name", "container_id", "image",
                                               "switch_seconds", "previous")}}
           if spec.deploy.target == "docker" else {}),
        "reused_steps": reused,
    }
    if embedding_task:  # the release report's tables are the embedding gate's
        report(summary, val["report_path"], spec.validation.thresholds.model_dump(),
               reg["experiment_id"])
    return summary
