"""The `render-release` flow: the release chain up to and including the Triton repository (the
same steps as `release-model`: build_repository in flows/release.py), then the repository and
the serving image's build context written to a folder; no MLflow registration, no image build,
no deploy (`hf2triton render`, hf2triton.release.render)."""

from __future__ import annotations

from prefect import flow

from hf2triton.flows.release import build_repository, release_context
from hf2triton.orchestration.locks import release_lock
from hf2triton.spec import ReleaseSpec, parse_spec
from hf2triton.tasks.render import write_output
from hf2triton.util.json_types import JSONObject, RawSpec, json_object


@flow(name="render-release", log_prints=False, validate_parameters=False)
def render_release(spec: ReleaseSpec | RawSpec, output: str) -> JSONObject:
    """Render what releasing `spec` would serve into `output`; returns what render.json holds.
    Its steps are the release's own (a release of the same spec after it reuses them), so it
    holds the release's lock while it runs."""
    spec = parse_spec(spec)
    with release_lock(spec.name):
        return _render(spec, output)


def _render(spec: ReleaseSpec, output: str) -> JSONObject:
    built = build_repository(spec, release_context(spec))
    return json_object(write_output(spec, built, output))
