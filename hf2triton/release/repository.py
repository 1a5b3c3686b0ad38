"""Render a release's Triton model repository from `model_repository/`: the shared `model.py`,
the serving core (`hf2triton/serving`, the modules the kind uses), the validated model files,
`serving.json`, warmup samples from real validation items, and `config.pbtxt` with the batching
the spec (or the configuration search) chose.

Layout: `<out>/<model_name>/{config.pbtxt, warmup/, 1/{model.py, hf2triton_serving/, serving.json,
...}}`. The version directory is `1` here; the deploy target puts it in as the MLflow version.
"""

from __future__ import annotations

import string
import struct
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict

import numpy as np

from hf2triton import serving
from hf2triton.kinds.base import ModelKind, to_json
from hf2triton.kinds.config import KindConfig
from hf2triton.runtimes.devices import DEVICES
from hf2triton.util.workspace import (
    cached_step,
    digest,
    link_or_copy,
    sha256_file,
    sha256_module,
    templates_dir,
)

if TYPE_CHECKING:
    from hf2triton.release.shipped import Shipped
    from hf2triton.serving.base import ServedModel

# The deploy section's settings of how Triton batches and runs the model (serving knobs).
BATCHING = (
    "max_batch_size",
    "preferred_batch_sizes",
    "max_queue_delay_us",
    "instance_count",
    "intra_op_threads",
    "max_batch_tokens",
    "device",
    "gpus",
)
PBTXT_TYPES = {np.dtype(np.object_): "TYPE_STRING", np.dtype(np.int32): "TYPE_INT32"}


class RepositoryResult(TypedDict):
    repository: str  # directory holding <model_name>/
    model_name: str
    files: dict[str, str]  # relative path -> sha256 (serving core and model.py included)
    content_hash: str
    reused: bool


def tensor_file(arr: np.ndarray) -> bytes:
    """One warmup input as Triton reads it: strings as u32 LE length + bytes, numbers raw."""
    if arr.dtype == np.object_:
        out = b""
        for value in arr.reshape(-1):
            data = value if isinstance(value, bytes) else str(value).encode("utf-8")
            out += struct.pack("<I", len(data)) + data
        return out
    return np.ascontiguousarray(arr).tobytes()


def warmup(requests: list[dict[str, np.ndarray]], folder: Path) -> str:
    """Write the warmup files of `requests` (batch 1 each); return the config.pbtxt blocks."""
    blocks = []
    for i, request in enumerate(requests):
        inputs = []
        for name, arr in request.items():
            file = f"sample_{i}_{name}.bin"
            (folder / file).write_bytes(tensor_file(arr[0]))
            dims = ", ".join(str(d) for d in arr.shape[1:])
            inputs.append(
                f'  inputs {{ key: "{name}" value: {{ data_type: '
                f"{PBTXT_TYPES[arr.dtype]} dims: [ {dims} ] input_data_file: "
                f'"{file}" }} }}'
            )
        blocks.append(
            f'model_warmup {{ name: "sample_{i}" batch_size: 1\n' + "\n".join(inputs) + " }"
        )
    return "\n".join(blocks)


def io_config(served: type[ServedModel], values: dict[str, Any]) -> str:
    """config.pbtxt's input and output blocks, from the served class's own declaration
    (`hf2triton.serving.base.Tensor`); named dims are the model's facts in `values`."""

    def block(t: Any) -> str:
        dims = ", ".join(str(values[d] if isinstance(d, str) else d) for d in t.dims)
        lines = [f'name: "{t.name}"', f"data_type: TYPE_{t.dtype}", f"dims: [ {dims} ]"]
        lines += ["optional: true"] * t.optional + ["allow_ragged_batch: true"] * t.ragged
        return "  {\n" + "".join(f"    {line}\n" for line in lines) + "  }"

    io = "\n".join(
        f"{side} [\n" + ",\n".join(block(t) for t in tensors) + "\n]"
        for side, tensors in (("input", served.inputs), ("output", served.outputs))
    )
    # A decoupled model (text generation) sends any number of responses per request.
    return io + "\nmodel_transaction_policy { decoupled: true }" * bool(
        getattr(served, "decoupled", False)
    )


def instance_group(knobs: dict[str, Any]) -> str:
    """config.pbtxt's instance group, as the deploy device places instances."""
    group: str = DEVICES.load(knobs.get("device") or DEVICES.default).instance_group(
        knobs["instance_count"], knobs.get("gpus")
    )
    return group


def render_config(
    kind: ModelKind[KindConfig],
    model_name: str,
    cfg: KindConfig,
    info: dict[str, Any],
    serving_knobs: dict[str, Any],
    warmup_blocks: str,
) -> str:
    return string.Template((templates_dir() / "config.pbtxt.template").read_text()).substitute(
        model_name=model_name,
        max_batch_size=serving_knobs["max_batch_size"],
        io=io_config(kind.served, kind.config_values(cfg, info)),
        preferred_batch_sizes=", ".join(str(b) for b in serving_knobs["preferred_batch_sizes"]),
        max_queue_delay_us=serving_knobs["max_queue_delay_us"],
        instance_group=instance_group(serving_knobs),
        model_warmup=warmup_blocks,
        # The kind, declared: the OpenAI-compatible API serves a model by it.
        parameters=config_parameters({"kind": kind.name, **kind.config_parameters(cfg)}),
    )


def pbtxt_string(text: str) -> str:
    """`text` as a protobuf text-format string literal (UTF-8 kept as it is)."""
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def config_parameters(values: dict[str, str]) -> str:
    """config.pbtxt's `parameters` entries (string values)."""
    return "".join(
        f"parameters {{ key: {pbtxt_string(k)} value: {{ string_value: {pbtxt_string(v)} }} }}\n"
        for k, v in values.items()
    )


def template_files(kind: ModelKind[KindConfig]) -> dict[str, Path]:
    """What every version directory carries besides the model: model.py and the whole serving
    core (a few small modules: no list of which kind imports which to keep in step)."""
    root = Path(serving.__file__).parent
    files = {"model.py": templates_dir() / "model.py"}
    # the serving core has subpackages (runtimes/): its whole tree
    for module in sorted(root.rglob("*.py")):
        files[f"{serving.PACKAGE_DIR}/{module.relative_to(root).as_posix()}"] = module
    return files


def write_model_dir(model_dir: Path, files: dict[str, Path], settings: dict[str, Any]) -> None:
    """A model's directory as Triton loads it: version `1` holding `files` and serving.json,
    and an empty warmup/ beside it."""
    version_dir = model_dir / "1"
    (model_dir / "warmup").mkdir(parents=True)
    version_dir.mkdir()
    for name, path in files.items():
        (version_dir / name).parent.mkdir(parents=True, exist_ok=True)
        link_or_copy(path, version_dir / name)
    serving.write_settings(str(version_dir), settings)


def build_repository(
    shipped: Shipped,
    model_name: str,
    serving_knobs: dict[str, Any],
    warmup_items: list[Any],
    work_root: str,
) -> RepositoryResult:
    """Render the Triton repository of one release: the candidate the gate chose, served as
    it was judged.

    `serving_knobs` are the deploy section's batching and execution settings (BATCHING),
    possibly as the configuration search chose them; the runtime is the shipped candidate's
    (serving.json's runtime of what the gate ran)."""
    kind, cfg, info = shipped.kind, shipped.config, shipped.info
    candidate, export_dir, runtime = shipped.path, shipped.export_dir, shipped.runtime
    files = {**template_files(kind), **kind.version_files(candidate, export_dir)}
    settings = kind.serving_json(
        cfg,
        export_dir,
        {n: n for n in kind.version_files(candidate, export_dir)},
        runtime,
        serving_knobs.get("max_batch_tokens", 0),
        serving_knobs.get("intra_op_threads", 0),
    )
    templates = [templates_dir() / "config.pbtxt.template"]
    key = digest(
        [
            model_name,
            kind.name,
            {n: sha256_file(p) for n, p in files.items()},
            settings,
            to_json(info),
            {k: serving_knobs.get(k) for k in BATCHING},
            to_json(warmup_items),
            [sha256_file(p) for p in templates],
            sha256_module(sys.modules[__name__]),
        ]
    )

    def build(out: Path) -> dict[str, Any]:
        write_model_dir(out / model_name, files, settings)
        # Triton warms a model up with requests that get one response each: not a decoupled one.
        blocks = (
            ""
            if getattr(kind.served, "decoupled", False)
            else warmup(kind.requests(warmup_items), out / model_name / "warmup")
        )
        (out / model_name / "config.pbtxt").write_text(
            render_config(kind, model_name, cfg, info, serving_knobs, blocks)
        )
        return {}

    done = cached_step(work_root, "repository", key, build)
    return RepositoryResult(
        repository=str(done.path),
        model_name=model_name,
        files=dict(done.files),
        content_hash=digest(done.files),
        reused=done.reused,
    )
