"""The `release-model` flow: the chain in the README's picture, one step a line. The model kind
(embedding, classification, translation, ...) and the deploy target (local Triton, replicas,
docker, kserve) are chosen once from the spec; the steps live in `tasks/`, the work in
`hf2triton/`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from prefect import flow
from prefect.transactions import transaction

from hf2triton.flows.watch import after_release
from hf2triton.orchestration.locks import release_lock
from hf2triton.release.record import release_record, reused_steps, summary
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
from hf2triton.tasks.tune import tune
from hf2triton.tasks.validate import validate
from hf2triton.util.workspace import work_dir
from hf2triton.watch.status import remember


class Built(NamedTuple):
    """What the steps up to the Triton repository return."""

    src: Any
    exp: Any
    variants: Any
    val: Any
    tuned: Any
    repo: Any


def build_repository(spec: ReleaseSpec, kind: Any, data: Any, runtimes: Any, work: str) -> Built:
    """fetch, export, quantize, validate (the gate), tune, build-repository: the steps
    `release-model` and `render-release` (hf2triton render) share."""
    src = fetch(spec.source)
    exp = export(kind, src, spec.export, data, work)
    variants = quantize(
        kind, src["model_dir"], exp, spec.quantization, runtimes, kind.calibration(data), work
    )
    val = validate(
        kind,
        src["model_dir"],
        exp,
        variants,
        data,
        spec.quantization,
        spec.deploy,
        runtimes,
        work,
        spec.validation,
        spec.registry.model_name,
    )
    tuned = tune(kind, spec.triton_model_name, val, exp, data, spec.deploy, work)
    repo = repository(kind, spec.triton_model_name, val, exp, data, spec.deploy, tuned, work)
    return Built(src, exp, variants, val, tuned, repo)


@flow(name="release-model", log_prints=False, validate_parameters=False)
def release_model(spec: ReleaseSpec | dict[str, Any]) -> dict[str, Any]:
    """Release one model as `spec` describes; returns the release summary. A second run of the
    same release waits for this one (hf2triton.orchestration.locks), then reuses its finished
    steps."""
    spec = parse_spec(spec)
    with release_lock(spec.name):  # held for the whole release, the watch after it included
        return _release(spec)


def _release(spec: ReleaseSpec) -> dict[str, Any]:
    """The chain itself, run while the release's lock is held."""
    work = work_dir(spec.name)
    kind, target = kind_for(spec), target_for(spec, work)
    data = kind.read_data()  # bad validation data fails before any work
    check_gate_device(spec.deploy)  # so does a GPU release where the gate cannot use a GPU
    runtimes = runtime_choices(spec.deploy, spec.runtime, kind)  # what this machine can try
    remember(spec)  # `hf2triton status` lists every release of this home

    src, exp, variants, val, tuned, repo = build_repository(spec, kind, data, runtimes, work)
    record = release_record(spec, src, exp, variants, val, tuned, repo)
    reg = register(spec.registry, record)
    image = release_image(spec, repo, reg, record)
    # The watch's Prometheus rules and dashboard, before anything serves the version: a failure
    # here fails the release while the old version still serves, never after its promotion.
    monitoring(spec, target, reg)
    with transaction():  # a failure in here rolls the target back; the old version serves on
        dep = deploy(target, kind, repo, reg["version"], image, val)
        figures = smoke(target, kind, dep, val)
        dep = promote(target, dep, reg, figures)
    retire(target, dep)

    result = summary(
        spec,
        src,
        val,
        reg,
        image,
        target.summary(dep),
        figures,
        reused_steps(
            exp=exp, quantize=variants[0], validate=val, repository=repo, register=reg, deploy=dep
        ),
    )
    report(kind, result, val, reg["experiment_id"])
    result["watch"] = after_release(spec)  # its first minutes watched (docs/watch.md)
    return result
