"""The release specification: the one pydantic model a release is described by, assembled from the
plug-in registries (each kind, target, store and source defines its own section), read from YAML
with errors that name the key and the value, and published as JSON Schema.

Example:
    >>> spec = load_spec("releases/minilm-embedder.yaml")
    >>> kind, target = kind_for(spec), target_for(spec, work_dir(spec.name))
"""

from hf2triton.runtimes.quantizers import QuantizationSpec
from hf2triton.spec.choose import kind_for, target_for
from hf2triton.spec.release import (
    ExportSpec,
    RegistrySpec,
    ReleaseSpec,
    RuntimeSpec,
    ScheduleSpec,
    TrainingSpec,
    ValidationSpec,
    load_spec,
    parse_spec,
)
from hf2triton.targets.base import TuningSpec

__all__ = [
    "ExportSpec",
    "QuantizationSpec",
    "RegistrySpec",
    "ReleaseSpec",
    "RuntimeSpec",
    "ScheduleSpec",
    "TrainingSpec",
    "TuningSpec",
    "ValidationSpec",
    "kind_for",
    "load_spec",
    "parse_spec",
    "target_for",
]
