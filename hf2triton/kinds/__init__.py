"""Model kinds as plug-ins: one module each, registered in `KINDS` by the spec's `task` value.
A new kind is a new module and a new entry here (and its spec section); no flow, step or other
kind changes.

Example:
    >>> kind = kind_for(spec)            # chosen once, from spec.task
    >>> kind.name, kind.template
    ('embedding', 'embedding')
"""

from __future__ import annotations

from hf2triton.kinds.base import Candidate, Data, ModelKind
from hf2triton import plugins
from hf2triton.spec import ReleaseSpec

# spec `task:` -> "module:class" of the kind (imported when first used).
KINDS: dict[str, str] = {
    "feature-extraction": "hf2triton.kinds.embedding:EmbeddingKind",
    "text-classification": "hf2triton.kinds.classification:ClassificationKind",
    "translation": "hf2triton.kinds.translation:TranslationKind",
    "text-ranking": "hf2triton.kinds.reranking:RerankingKind",
}



def kind_for(spec: ReleaseSpec) -> ModelKind:
    """The model kind of a release, from its spec's task."""
    return plugins.load(KINDS, spec.task.value)(spec)


__all__ = ["KINDS", "Candidate", "Data", "ModelKind", "kind_for"]
