"""Which devices this machine can gate on: a release for `deploy.device: gpu` must measure the
candidates on a GPU, as Triton will run them, unless its spec accepts a CPU check of the GPU
graph's numerics (`deploy.gpu_gate: cpu-numerics`)."""

from __future__ import annotations

import glob
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
