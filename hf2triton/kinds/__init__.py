"""Model kinds as plug-ins: one module each, registered in `KINDS` (hf2triton.kinds.base) by the
spec's `task` value. A kind's module holds everything about it: its spec section (`Options`), its
limits, whether the configuration search can drive it, its serving class (which declares its
Triton inputs and outputs). A new kind is a new module (and its serving module), registered where
it is defined (`@KINDS.register`), and its name in the import line here.

Example:
    >>> kind = kind_for(spec)            # hf2triton.spec: chosen once, from spec.task
    >>> kind.name, kind.section
    ('embedding', 'embedding')
"""

from __future__ import annotations

# The plug-in modules, imported so that each registers its kind in KINDS.
from hf2triton.kinds import (  # noqa: F401
    classification,
    embedding,
    image_classification,
    image_text_embedding,
    reranking,
    speech_recognition,
    text_generation,
    translation,
)
from hf2triton.kinds.base import KINDS, Candidate, Data, ModelKind

DEFAULT_TASK = KINDS.default
kind_class, kind_classes = KINDS.load, KINDS.classes


__all__ = ["DEFAULT_TASK", "KINDS", "Candidate", "Data", "ModelKind", "kind_class", "kind_classes"]
