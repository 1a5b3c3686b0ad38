"""Model kinds as plug-ins: one module each, registered in `KINDS` by the spec's `task` value.
A kind's module holds everything about it: its spec section (`Options`), its limits, whether the
configuration search can drive it, its serving class (which declares its Triton inputs and
outputs). A new kind is a new module (and its serving module), registered where it is defined,
and its name in the import line here.

Example:
    >>> kind = kind_for(spec)            # hf2triton.spec: chosen once, from spec.task
    >>> kind.name, kind.section
    ('embedding', 'embedding')
"""

from __future__ import annotations

from hf2triton.kinds.base import Candidate, Data, ModelKind
from hf2triton.util import plugins

# spec `task:` -> the kind's class; each kind's module registers it (`@KINDS.register`).
KINDS = plugins.Registry(lambda cls: cls.task, default="feature-extraction")
from hf2triton.kinds import classification, embedding, reranking, text_generation, translation  # noqa: E402,F401,I001

DEFAULT_TASK = KINDS.default
kind_class, kind_classes = KINDS.load, KINDS.classes


__all__ = ["DEFAULT_TASK", "KINDS", "Candidate", "Data", "ModelKind", "kind_class", "kind_classes"]
