"""The `release-model` flow: the chain in the README's picture, one step a line. The model kind
(embedding, classification, translation, ...) and the deploy target (local Triton, replicas,
docker, kserve) are chosen once from the spec; the steps live in `tasks/`, the work in
`hf2triton/`.
"""

from __future__ import annotations

from dataclasses import replace

from prefect import flow
from prefect.transactions import transaction

from hf2triton.flows.watch import after_release
from hf2triton.orchestration.locks import release_lock
from hf2triton.release.record import release_record, summary
from hf2triton.release.results import Built, ReleaseContext, Served
from hf2triton.runtimes import runtime_choices
from hf2triton.runtimes.devices import check_gate_device
from hf2triton.spec import ReleaseSpec, kind_for, parse_spec, target_for
from hf2triton.tasks.deploy import deploy, retire, smoke
from hf2triton.tasks.export import export
from hf2triton.tasks.fetch import fetch
from hf2triton.tasks.image import release_image
from hf2triton.tasks.monitoring import monitoring
from hf2triton.tasks.quantize import quantize
from hf2triton.tasks.register import promote, register
from hf2triton.tasks.report import report
from hf2triton.tasks.repository import repository
from hf2triton.tasks.tidy import tidy
from hf2triton.tasks.tune import tune
from hf2triton.tasks.validate import validate
from hf2triton.util.json_types import JSONObject, RawSpec
from hf2triton.util.workspace import work_dir
from hf2triton.watch.status import remember


def build_repository(spec: ReleaseSpec, ctx: ReleaseContext) -> Built:
    """fetch, export, quantize, validate (the gate), tune, build-repository: the steps
    `release-model` and `render-release` (hf2triton render) share."""
    src = fetch(spec.source)
    # A runtime `auto` left to another that cannot serve this model is tried after all.
    ctx = replace(ctx, runtimes=ctx.runtimes.for_model(ctx.kind, src["model_dir"]))
    exp = export(ctx, src, spec.export)
    variants = quantize(ctx, src, exp, spec.quantization)
    val = validate(ctx, src, exp, variants, spec)
    tuned = tune(ctx, exp, val, spec.deploy, spec.triton_model_name)
    repo = repository(ctx, exp, val, spec.deploy, tuned, spec.triton_model_name)
    return Built(src, exp, variants, val, tuned, repo)


def release_context(spec: ReleaseSpec) -> ReleaseContext:
    """What the flow settles once, before any step: the kind, its validation data (bad data
    fails before any work), the runtimes this machine can try (a GPU release where the gate
    cannot use a GPU stops here too) and the work directory."""
    kind = kind_for(spec)
    data = kind.read_data()
    check_gate_device(spec.deploy)
    return ReleaseContext(
        kind, data, runtime_choices(spec.deploy, spec.runtime, kind), work_dir(spec.name)
    )


@flow(name="release-model", log_prints=False, validate_parameters=False)
def release_model(spec: ReleaseSpec | RawSpec) -> JSONObject:
    """Release one model as `spec` describes; returns the release summary. A second run of the
    same release waits for this one (hf2triton.orchestration.locks), then reuses its finished
    steps."""
    spec = parse_spec(spec)
    with release_lock(spec.name):  # held for the whole release, the watch after it included
        return _release(spec)


def _release(spec: ReleaseSpec) -> JSONObject:
    """The chain itself, run while the release's lock is held."""
    ctx = release_context(spec)
    target = target_for(spec, ctx.work)
    remember(spec)  # `hf2triton status` lists every release of this home

    built = build_repository(spec, ctx)
    record = release_record(spec, built)
    reg = register(spec.registry, record)
    image = release_image(spec, built.repo, reg, record)
    # The watch's Prometheus rules and dashboard, before anything serves the version: a failure
    # here fails the release while the old version still serves, never after its promotion.
    monitoring(spec, target, reg)
    with transaction():  # a failure in here rolls the target back; the old version serves on
        dep = deploy(target, ctx.kind, built.repo, reg["version"], image, built.val)
        figures = smoke(target, ctx.kind, dep, built.val)
        dep = promote(target, dep, reg, figures)
    retire(target, dep)
    tidied = tidy(ctx, built)

    result = summary(spec, built, Served(reg, image, dep, target.summary(dep), figures))
    result["work"] = {
        "removed_bytes": tidied["removed_bytes"],
        "bytes": tidied["work_bytes"],
        "rebuilt_on_rerun": tidied["rebuilt_on_rerun"],
    }
    report(ctx.kind, result, built.val, reg["experiment_id"])
    result["watch"] = after_release(spec)  # its first minutes watched (docs/watch.md)
    return result
