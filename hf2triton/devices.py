"""Which devices this machine can gate on: a release for `deploy.device: gpu` must measure the
candidates on a GPU, as Triton will run them, unless its spec accepts a CPU check of the GPU
graph's numerics (`deploy.gpu_gate: cpu-numerics`)."""

from __future__ import annotations

import glob
from dataclasses import dataclass, field
from typing import Any

from hf2triton.errors import EnvironmentSetupError


def gpu_runtime_problem() -> str | None:
    """Why the gate cannot run on an NVIDIA GPU here (None: it can): the driver's device nodes
    and ONNX Runtime's CUDA provider must both be there."""
    import onnxruntime as ort

    if not glob.glob("/dev/nvidia[0-9]*"):
        return "this machine has no NVIDIA GPU (no /dev/nvidia* device)"
    if "CUDAExecutionProvider" not in ort.get_available_providers():
        return (f"ONNX Runtime {ort.__version__} here has no CUDA provider (install "
                "onnxruntime-gpu in place of onnxruntime)")
    return None


def check_gate_device(deploy: Any) -> None:
    """Stop a GPU release, before any work, where its gate cannot run on a GPU."""
    if getattr(deploy, "device", "cpu") != "gpu" or deploy.gpu_gate != "here":
        return
    problem = gpu_runtime_problem()
    if problem:
        raise EnvironmentSetupError(
            f"deploy.device is gpu, but {problem}, so the accuracy gate cannot measure what "
            "Triton will run. Run the release on a GPU machine, or set deploy.gpu_gate: "
            "cpu-numerics to check the GPU graph's numerics on this CPU and judge the served "
            "answers on the target")


# The runtimes and precisions a release tries when its spec says `runtime.candidates: auto`,
# per deploy.device, fastest first as measured on our machines (OpenVINO bf16 about 2x ONNX
# Runtime fp32 on a CPU with AVX512_BF16; see docs/benchmarks.md).
AUTO_RUNTIMES = {
    "cpu": [("onnxruntime", "fp32"), ("openvino", "fp32"), ("openvino", "bf16")],
    "gpu": [("onnxruntime-cuda", "fp32"), ("onnxruntime-cuda", "fp16")],
}
SERVING_DEVICE = {"cpu": "cpu", "gpu": "cuda"}  # deploy.device -> the runtimes' device name


@dataclass(frozen=True)
class RuntimeChoices:
    """What the gate tries: serving.json `runtime` settings, in order, and what was asked for but
    is not offered on this machine, with why."""

    served: list[dict[str, Any]]
    not_offered: dict[str, str] = field(default_factory=dict)
    # with gpu_gate cpu-numerics: the gate runs each on ONNX Runtime's CPU provider instead
    cpu_numerics: bool = False
    device: str = "cpu"  # deploy.device

    def runs(self, name: str) -> bool:
        return any(r["name"] == name for r in self.served)

    def gated(self, served: dict[str, Any]) -> dict[str, Any]:
        """The runtime the gate runs for a served one (the same, but for a CPU numerics check
        of a GPU runtime)."""
        if self.cpu_numerics and served.get("device") == "cuda":
            return {"name": "onnxruntime", "device": "cpu", "precision": served["precision"]}
        return served


def label(runtime: dict[str, Any]) -> str:
    """'openvino bf16' (a GPU runtime's name says its device)."""
    return f"{runtime['name']} {runtime['precision']}"


def runtime_choices(deploy: Any, runtime_spec: Any) -> RuntimeChoices:
    """The runtimes the release's candidates run on: the spec's list, or for `auto` the
    device's usual ones; a precision this machine does not offer (bf16 on a CPU without
    AVX512_BF16 or AMX) is left out and reported."""
    from hf2triton.serving.runtimes import RuntimeSettings, runtime_info

    device = getattr(deploy, "device", "cpu")
    wanted = [(c.name, c.precision, dict(c.options)) for c in runtime_spec.candidates] \
        if runtime_spec.candidates != "auto" else \
        [(name, precision, {}) for name, precision in AUTO_RUNTIMES[device]]
    cpu_numerics = device == "gpu" and deploy.gpu_gate == "cpu-numerics"
    info = runtime_info()
    served, not_offered = [], {}
    for name, precision, options in wanted:
        settings = RuntimeSettings(name, SERVING_DEVICE[device], precision, options)
        runtime = {k: v for k, v in settings.to_dict().items()
                   if k != "threads" or k in options}  # deploy.intra_op_threads is the default
        offered = info.get(name, {}).get(settings.device, {})
        if not cpu_numerics and settings.precision not in offered.get("precisions", []):
            not_offered[label(runtime)] = offered.get("why") or "not available here"
            continue
        served.append(runtime)
    if not served:
        raise EnvironmentSetupError(
            f"none of the runtimes asked for can run here: "
            f"{'; '.join(f'{k}: {v}' for k, v in not_offered.items())}. Install what they need, "
            "or list others in runtime.candidates")
    return RuntimeChoices(served, not_offered, cpu_numerics, device)
