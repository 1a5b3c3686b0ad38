"""The interface every model kind implements, and the registry of kinds.

A kind (embedding, classification, translation, reranking, text generation) is chosen once from
the spec's `task` (`hf2triton.spec.kind_for`) and given the settings it owns: its own spec
section and the validation data's settings, never the whole spec. `ModelKind` is the roles it
plays (hf2triton.kinds.roles): exported, served, judged, answered over the OpenAI-compatible
API. Everything else (the gate loop, the repository, the smoke test, the reports) is written
once, against this interface.
"""

from __future__ import annotations

from hf2triton.kinds.config import KindConfig
from hf2triton.kinds.data import (
    Candidate,
    Data,
    ValidationSettings,
    model_max_length,
    read_json,
    read_lines,
    save_fast_tokenizer,
    take,
    timing_items,
    to_json,
)
from hf2triton.kinds.limits import Limits, describe_misses, misses, worst_of
from hf2triton.kinds.roles import C, ExportRole, GateRole, OpenAIRole, throughput
from hf2triton.util import plugins


class ModelKind(ExportRole[C], GateRole[C], OpenAIRole[C]):
    """One kind of model, whatever its input: exported, served, judged and (where it has a
    route) answered over the OpenAI-compatible API. A kind derives from the base of its input
    modality (hf2triton.kinds.modality: text encoder, text-to-text, vision, audio), which plays
    the modality's part of each role, sets the class attributes (`name`, `task`, `Options`,
    `serving_class`, ...) and implements every abstract method left; `KINDS.register` names it
    by its `task` and refuses, when its module is imported, a kind that lacks one."""


# spec `task:` -> the kind's class; each kind's module registers it where it is defined
# (`@KINDS.register`), and hf2triton.kinds imports the modules.
KINDS = plugins.Registry(lambda cls: cls.task, default="feature-extraction")

__all__ = [
    "KINDS",
    "Candidate",
    "Data",
    "KindConfig",
    "Limits",
    "ModelKind",
    "ValidationSettings",
    "describe_misses",
    "misses",
    "model_max_length",
    "read_json",
    "read_lines",
    "save_fast_tokenizer",
    "take",
    "throughput",
    "timing_items",
    "to_json",
    "worst_of",
]
