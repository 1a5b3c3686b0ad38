"""The serving core: what Triton runs for every hf2triton model, and what the release's gate runs
in-process on each candidate, so that what is validated is what serves.

The package is copied into every Triton version directory (as `hf2triton_serving/`, beside the
one shared `model.py`) and its files are hashed with the version. It imports numpy,
tokenizers, sentencepiece, jinja2 (chat templates of text generation) and the libraries of the
runtime it runs (onnxruntime, openvino: see runtimes/) only, never torch, transformers or the
rest of hf2triton, and works with numpy 1 (Triton's Python backend) and numpy 2 (the pipeline).

A version directory's `serving.json` names the module and class that serve it
(`{"module": "embedding", "class": "Embedder", ...}`); `load` builds it from that directory.
"""

from __future__ import annotations

import importlib
import json
import os
from typing import Any


def openvino_telemetry_off() -> None:
    """No usage telemetry from OpenVINO or NNCF in this process. Importing openvino sends an
    event (openvino.tools.ovc), and NNCF one per call, each from a process forked in a thread
    pool; such a child can deadlock in its ssl set-up and live on holding the parent's stdout
    and stderr (seen: `hf2triton release` under a test harness waited on it for ever), and a
    release or a server must not reach out to the internet anyway. Both libraries fall back to
    their no-op stubs when `openvino_telemetry` cannot be imported, which a None in sys.modules
    makes so. Run before openvino is imported: the serving core and hf2triton call it first."""
    import sys

    sys.modules.setdefault("openvino_telemetry", None)  # type: ignore[arg-type] # None: absent


openvino_telemetry_off()

SERVING_FILE = "serving.json"
PACKAGE_DIR = "hf2triton_serving"  # the package's name inside a version directory


def serving_json(
    module: str,
    cls: str,
    kind: str,
    settings: dict[str, Any],
    files: dict[str, str] | None = None,
    runtime: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """A version's serving.json: the class that serves it (`module`, `class`), the kind's own
    settings followed by the speed settings (`intra_op_threads`, `max_batch_tokens`), the
    runtime (absent: the default), and the keys that locate its files (names in the version
    directory, or paths where the gate reads them)."""
    return {
        "module": module,
        "class": cls,
        "kind": kind,
        **settings,
        **({"runtime": runtime} if runtime else {}),
        **(files or {}),
    }


def write_settings(directory: str, settings: dict[str, Any]) -> None:
    """Write serving.json into a version directory (whole or not at all)."""
    path = os.path.join(directory, SERVING_FILE)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        f.write(json.dumps(settings, indent=1) + "\n")
    os.replace(path + ".tmp", path)


def read_settings(directory: str) -> dict[str, Any]:
    with open(os.path.join(directory, SERVING_FILE), encoding="utf-8") as f:
        return json.load(f)


def instances_in(model_config: dict[str, Any]) -> int:
    """How many instances of a model Triton runs on this host: over its config's instance
    groups, `count` on each GPU listed (Triton lists every GPU of a KIND_GPU group it placed)."""
    groups = model_config.get("instance_group") or [{}]
    return max(1, sum(int(g.get("count", 1)) * max(1, len(g.get("gpus") or [])) for g in groups))


def share_threads(instances: int) -> int:
    """A GPU instance's CPU threads: this host's cores shared among the model's instances (at
    least one each). ONNX Runtime's default is a pool of one thread per core in every session,
    which N instances multiply N-fold, taking the cores their tokenizing needs."""
    from .base import cores

    return max(1, cores() // max(1, instances))


def placed(settings: dict[str, Any], gpu: int | None, instances: int = 1) -> dict[str, Any]:
    """serving.json as one instance runs it: a GPU runtime on the GPU Triton placed the instance
    on, its CPU threads (0 in the version: the host's cores shared among the model's
    `instances` there, hf2triton.serving.share_threads).

    Example:
        >>> cuda = {"name": "onnxruntime-cuda", "device": "cuda", "threads": 2}
        >>> placed({"runtime": cuda}, gpu=1, instances=4)["runtime"]
        {'name': 'onnxruntime-cuda', 'device': 'cuda', 'threads': 2, 'device_id': 1}
    """
    runtime = settings.get("runtime")
    if gpu is None or not isinstance(runtime, dict) or runtime.get("device") != "cuda":
        return settings
    threads = int(runtime.get("threads") or settings.get("intra_op_threads") or 0)
    return {
        **settings,
        "runtime": {**runtime, "device_id": gpu, "threads": threads or share_threads(instances)},
    }


def load(
    directory: str,
    settings: dict[str, Any] | None = None,
    gpu: int | None = None,
    instances: int = 1,
) -> Any:
    """The served model of a version directory (or of any directory laid out like one); `gpu`:
    the GPU Triton placed this instance on (a KIND_GPU instance group), for a GPU runtime, and
    `instances` how many instances of the model run on this host."""
    settings = placed(
        settings if settings is not None else read_settings(directory), gpu, instances
    )
    module = importlib.import_module(f".{settings['module']}", __name__)
    return getattr(module, settings["class"]).from_directory(directory, settings)


def triton_execute(model: Any, requests: list, pb_utils: Any) -> list:
    """One dynamic batch of Triton requests through `model.answer`; a bad request gets its own
    INVALID_ARG error (HTTP 400) while the others are answered. A decoupled model (text
    generation) answers through each request's response sender itself, later: None."""
    if getattr(model, "decoupled", False):
        return model.triton_execute(requests, pb_utils)
    arrays = []
    for request in requests:
        found = {}
        for spec in model.inputs:
            tensor = pb_utils.get_input_tensor_by_name(request, spec.name)
            if tensor is not None:
                found[spec.name] = tensor.as_numpy()
        arrays.append(found)
    responses = []
    for answer in model.answer(arrays):
        if isinstance(answer, str):
            error = pb_utils.TritonError(answer, pb_utils.TritonError.INVALID_ARG)
            responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
        else:
            responses.append(
                pb_utils.InferenceResponse(
                    output_tensors=[pb_utils.Tensor(k, v) for k, v in answer.items()]
                )
            )
    return responses
