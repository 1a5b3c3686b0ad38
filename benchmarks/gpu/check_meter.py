"""The GPU's utilisation and memory, sampled in a thread while a load point runs."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from typing import Any


class GpuMeter:
    """GPU utilisation sampled in a thread: NVML (pynvml), else nvidia-smi, else PyTorch."""

    def __init__(self, interval_s: float = 0.2):
        self.interval_s = interval_s
        self.samples: list[float] = []
        self.memory_mib: list[float] = []
        self.source, self.read = self._reader()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _reader() -> tuple[str | None, Any]:
        try:
            import pynvml  # type: ignore[import-not-found]

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)

            def nvml() -> tuple[float, float]:
                used = pynvml.nvmlDeviceGetMemoryInfo(handle).used / 2**20
                return float(pynvml.nvmlDeviceGetUtilizationRates(handle).gpu), used

            return "nvml", nvml
        except Exception:
            pass
        smi = shutil.which("nvidia-smi")
        if smi:
            query = [
                smi,
                "--query-gpu=utilization.gpu,memory.used",
                "--format=csv,noheader,nounits",
            ]

            def nvidia_smi() -> tuple[float, float]:
                out = subprocess.run(query, capture_output=True, text=True, timeout=5).stdout
                busy, used = out.splitlines()[0].split(",")
                return float(busy), float(used)

            return "nvidia-smi", nvidia_smi
        try:
            import torch

            if torch.cuda.is_available():
                return "torch", lambda: (float(torch.cuda.utilization(0)), float("nan"))
        except Exception:
            pass
        return None, None

    def start(self, at: float, until: float) -> None:
        self.samples, self.memory_mib = [], []
        self._stop.clear()

        def loop() -> None:
            while time.time() < at and not self._stop.is_set():
                time.sleep(0.01)
            while time.time() < until and not self._stop.is_set():
                busy, used = self.read()
                self.samples.append(busy)
                self.memory_mib.append(used)
                time.sleep(self.interval_s)

        if self.read is not None:
            self._thread = threading.Thread(target=loop, daemon=True)
            self._thread.start()

    def stop(self) -> dict[str, Any] | None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if not self.samples:
            return None
        ordered = sorted(self.samples)
        return {
            "mean": round(sum(ordered) / len(ordered) / 100, 3),
            "p50": round(ordered[len(ordered) // 2] / 100, 3),
            "max": round(ordered[-1] / 100, 3),
            "samples": len(ordered),
            "memory_mib_max": round(max(self.memory_mib), 1) if self.memory_mib else None,
            "source": self.source,
        }
