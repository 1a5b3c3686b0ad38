"""Deploy devices as plug-ins (`deploy.device`: cpu, gpu): how Triton places the model's
instances there, whether this machine can gate on it, and, for a GPU release that accepts a CPU
check of its graph's numerics (`deploy.gpu_gate: cpu-numerics`), what the gate runs instead.
Runtimes name the device they serve (hf2triton.runtimes); nothing else asks which device it is.
"""

from __future__ import annotations

import glob
from typing import Any, ClassVar, Protocol

from hf2triton.errors import EnvironmentSetupError
from hf2triton.util import plugins

DEVICES = plugins.Registry(lambda cls: cls.name, default="cpu")


class Tuning(Protocol):
    @property
    def search(self) -> bool: ...


class DeployOn(Protocol):
    """What the devices read of the spec's `deploy:` section (hf2triton.targets.base's
    DeploySection; the targets are a layer above)."""

    @property
    def device(self) -> str: ...
    @property
    def gpu_gate(self) -> str: ...
    @property
    def instance_count(self) -> int | None: ...
    @property
    def tuning(self) -> Tuning: ...


@DEVICES.register
class Cpu:
    name: ClassVar[str] = "cpu"
    gpus: ClassVar[bool] = False  # whether deploy.gpus means anything here
    # deploy.instance_count when the spec gives none, and the (instances, intra-op threads)
    # pairs and client counts deploy.tuning tries when it lists none. On the CPU one instance
    # with ONNX Runtime's own threads uses every core already.
    default_instances: ClassVar[int] = 1
    tuning_execution: ClassVar[tuple[tuple[int, int], ...]] = ((1, 0), (2, 1))
    tuning_clients: ClassVar[tuple[int, ...]] = (16, 64)
    # deploy.max_batch_tokens when the spec gives none. Measured in-process on all-MiniLM-L6-v2
    # (2-core EPYC, AVX-512), dynamic batches of 64 texts of every length: 467 texts/s in
    # sub-batches of at most 512 tokens, 470 at 256, 437 at 1024, 315 at 2048, about 50 padded as
    # one batch; texts of the median length: 917, 901, 775, 775. Small sub-batches keep the
    # matrices in cache. benchmarks/serving.py reports the served figures.
    default_max_batch_tokens: ClassVar[int] = 512

    @staticmethod
    def instance_group(count: int, gpus: list[int] | None) -> str:
        """config.pbtxt's instance group: `count` model instances on the CPU."""
        return f"{{\n    count: {count}\n    kind: KIND_CPU\n  }}"

    @staticmethod
    def gate_problem() -> str | None:
        """Why the gate cannot run on this device here (None: it can)."""
        return None

    @staticmethod
    def gate_on_cpu(deploy: DeployOn) -> bool:
        """Whether the gate checks this device's graphs on the CPU instead."""
        return False

    @staticmethod
    def numerics_runtime(served: dict[str, Any]) -> dict[str, Any]:
        return served


@DEVICES.register
class Gpu(Cpu):
    name = "gpu"
    gpus = True
    # Per GPU. One Python-backend instance tokenizes, pads and waits on the GPU in turn, each a
    # process of its own, so their CPU work runs side by side. On H200s with 16 cores
    # (benchmarks/gpu/, 2026-11-27, MiniLM's fused fp16 graph, 128 HTTP clients on the same
    # host), in two runs: 1, 2, 4, 8 and 16 instances served 917, 2,303, 4,602, 12,130 and 8,733
    # texts/s, and 4 and 8 served 2,954 and 5,868: eight served most (sixteen left too little
    # CPU). Threads 0 on a GPU: the serving host's cores shared among its instances
    # (hf2triton.serving.share_threads).
    default_instances = 8
    tuning_execution = ((1, 0), (2, 0), (4, 0), (8, 0))
    tuning_clients = (64, 128)  # a GPU needs many requests in flight to fill its batches
    # A dynamic batch of 64 texts up to 128 tokens in one run: each run is a round of kernel
    # launches, and the GPU pads at little cost (not measured yet: benchmarks/gpu/ measures it).
    default_max_batch_tokens = 8192

    @staticmethod
    def instance_group(count: int, gpus: list[int] | None) -> str:
        """`count` instances on each GPU named (every GPU when none is)."""
        listed = f"\n    gpus: [ {', '.join(str(g) for g in gpus)} ]" if gpus else ""
        return f"{{\n    count: {count}\n    kind: KIND_GPU{listed}\n  }}"

    @staticmethod
    def gate_problem() -> str | None:
        """The driver's device nodes and ONNX Runtime's CUDA provider must both be there."""
        import onnxruntime as ort

        if not glob.glob("/dev/nvidia[0-9]*"):
            return "this machine has no NVIDIA GPU (no /dev/nvidia* device)"
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            return (
                f"ONNX Runtime {ort.__version__} here has no CUDA provider (install "
                "onnxruntime-gpu in place of onnxruntime)"
            )
        return None

    @staticmethod
    def gate_on_cpu(deploy: DeployOn) -> bool:
        return deploy.gpu_gate == "cpu-numerics"

    @staticmethod
    def numerics_runtime(served: dict[str, Any]) -> dict[str, Any]:
        """ONNX Runtime's CPU provider at the GPU runtime's precision (an fp16 graph runs
        through its casts)."""
        return {"name": "onnxruntime", "device": "cpu", "precision": served["precision"]}


def check_gate_device(deploy: DeployOn) -> None:
    """Stop a release, before any work, where its gate cannot run on its device, or where its
    configuration search would measure on a device this machine does not have."""
    device = DEVICES.load(deploy.device)
    here = device.gate_problem()
    if here and not device.gate_on_cpu(deploy):
        raise EnvironmentSetupError(
            f"deploy.device is {device.name}, but {here}, so the accuracy gate cannot "
            "measure what Triton will run. Run the release on a machine that has one, or set "
            "deploy.gpu_gate: cpu-numerics to check the graph's numerics on this CPU and judge "
            "the served answers on the target"
        )
    if here and deploy.tuning.search:
        raise EnvironmentSetupError(
            f"deploy.tuning.search measures Triton configurations on this machine's "
            f"{device.name}, but {here}. Set deploy.tuning.search: false here (then "
            f"deploy.instance_count, {deploy.instance_count}, ships), or run the release on a "
            "machine that has one"
        )
