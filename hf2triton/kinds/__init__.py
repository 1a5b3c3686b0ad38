"""Model kinds as plug-ins: one module each, registered in `KINDS` by the spec's `task` value.
A kind's module holds everything about it: its spec section (`Options`), its limits, whether the
configuration search can drive it, its serving class (which declares its Triton inputs and
outputs). A new kind is a new module (and its serving module) and one line here.

Example:
    >>> kind = kind_for(spec)            # chosen once, from spec.task
    >>> kind.name, kind.section
    ('embedding', 'embedding')
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf2triton import plugins
from hf2triton.kinds.base import Candidate, Data, ModelKind

if TYPE_CHECKING:
    from hf2triton.spec import ReleaseSpec

# spec `task:` -> "module:class" of the kind.
KINDS: dict[str, str] = {
    "feature-extraction": "hf2triton.kinds.embedding:EmbeddingKind",
    "text-classification": "hf2triton.kinds.classification:ClassificationKind",
    "translation": "hf2triton.kinds.translation:TranslationKind",
    "text-ranking": "hf2triton.kinds.reranking:RerankingKind",
}
DEFAULT_TASK = "feature-extraction"


def kind_class(task: str) -> type[ModelKind]:
    """The kind registered for `task`."""
    return plugins.load(KINDS, task)


def kind_classes() -> list[type[ModelKind]]:
    """Every registered kind, in registry order."""
    return [kind_class(task) for task in KINDS]


def kind_for(spec: ReleaseSpec) -> ModelKind:
    """The model kind of a release, from its spec's task."""
    return kind_class(spec.task)(spec)


__all__ = ["DEFAULT_TASK", "KINDS", "Candidate", "Data", "ModelKind", "kind_class", "kind_classes", "kind_for"]
