"""Step `validate`: the accuracy gate (hf2triton.release.gate) on the candidates
hf2triton.release.candidates names; the kind scores each against PyTorch as Triton will run it."""

from __future__ import annotations

from prefect import task

from hf2triton.clients.mlflow import tracking_uri
from hf2triton.release.candidates import (
    champion_to_face,
    gate_candidates,
    gate_settings,
    variant_context,
)
from hf2triton.release.gate import GateResult, run_gate
from hf2triton.release.plan import Gate
from hf2triton.release.results import Exported, ReleaseContext
from hf2triton.runtimes import Variant, recipes
from hf2triton.sources import FetchResult
from hf2triton.spec import ReleaseSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, RETRY_TRANSIENT, note_reuse, step_logger


@task(
    name="validate",
    task_run_name="validate {ctx.kind.name}: the accuracy gate",
    **RETRY_TRANSIENT,
    **NO_PREFECT_CACHE,
)
def validate(
    ctx: ReleaseContext, src: FetchResult, exp: Exported, variants: list[Variant], spec: ReleaseSpec
) -> GateResult:
    """Gate the candidates as the spec's quantization, deploy and validation sections ask;
    raises AccuracyGateError (with a report) when none passes."""
    kind = ctx.kind
    cfg = kind.config_from_dict(exp["config"])
    gate = Gate.of(kind, cfg, ctx.data, exp["export_dir"], gate_settings(spec, ctx.runtimes))
    found = run_gate(
        gate,
        gate_candidates(
            variants,
            spec.quantization,
            ctx.runtimes,
            recipes(variant_context(ctx, src, exp, spec.quantization), ctx.runtimes),
        ),
        model_dir=src["model_dir"],
        work_root=ctx.work,
        champion=champion_to_face(kind, ctx.data, cfg, tracking_uri(), spec.registry.model_name),
    )
    note_reuse("validate", found)
    step_logger().info(
        "validate: ships %s (%s)",
        found["chosen"],
        ", ".join(f"{k} {v:.4f}" for k, v in found["metrics"].items() if k in kind.limits()),
    )
    return found
