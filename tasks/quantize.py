"""Step `quantize`: the graph variants the release's runtimes build (hf2triton.runtimes: the
spec's quantized variant and, with `quantization.search`, the grid for ONNX Runtime; NNCF int8
for OpenVINO; fp16 for a GPU), then the export itself. With `quantization.prune` (the default)
only each runtime's first variant is built here, what the search times first; the gate builds
the others it needs (the fastest runtime's), and none of the rest.
"""

from prefect import task

from hf2triton.release.candidates import variant_context
from hf2triton.release.results import Exported, ReleaseContext
from hf2triton.runtimes import Variant, build_variants
from hf2triton.sources import FetchResult
from hf2triton.spec import QuantizationSpec
from hf2triton.util.runs import NO_PREFECT_CACHE, note_reuse, step_logger


@task(name="quantize", task_run_name="quantize {spec.method}", **NO_PREFECT_CACHE)
def quantize(
    ctx: ReleaseContext, src: FetchResult, exp: Exported, spec: QuantizationSpec
) -> list[Variant]:
    """The variants to gate; one whose build fails is kept with why (the gate refuses it)."""
    variants = build_variants(
        variant_context(ctx, src, exp, spec), ctx.runtimes, every=not spec.prune
    )
    log = step_logger()
    for v in variants:
        if v.get("error"):
            log.warning("quantize: %s: %s; the gate refuses it", v["method"], v["error"])
    note_reuse("quantize", variants[0])
    return variants
