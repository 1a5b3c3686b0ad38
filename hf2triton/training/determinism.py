"""Seeded, deterministic training on CPU: the same data and seed give the same weights, byte for
byte. The fine-tune and the embedded language model share this set-up."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

# How many threads a training runs on: a float sum depends on how threads split it, so the
# count is fixed for determinism. Fine-tuning MiniLM's matrices gains from both cores; the
# language model's tiny ones gain little from two, and one keeps a shared 2-core machine
# responsive.
FINE_TUNE_THREADS = 2
LM_THREADS = 1


@contextlib.contextmanager
def deterministic(seed: int, threads: int) -> Iterator[None]:
    """Seeded initialisation, deterministic kernels and a fixed thread count, for the time of a
    training; the process's own settings come back after."""
    import torch

    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(before)
