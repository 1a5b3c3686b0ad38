"""The resolved, task-specific serving config of a release: how token states become an embedding,
logits become labels, or a source text becomes a translation."""

from __future__ import annotations

from pathlib import Path

from hf2triton.classification import ClassificationConfig, resolve_classification_config
from hf2triton.embeddings import EmbeddingConfig, resolve_embedding_config
from hf2triton.spec import ReleaseSpec, Task
from hf2triton.translation import TranslationConfig, resolve_translation_config


def resolve_task_config(
    spec: ReleaseSpec, model_dir: str | Path
) -> EmbeddingConfig | ClassificationConfig | TranslationConfig:
    """Fill the spec's task section from the model's own files (its 'auto' and None values)."""
    section = spec.task_section
    if spec.task is Task.TEXT_CLASSIFICATION:
        return resolve_classification_config(model_dir, section.max_length)
    if spec.task is Task.TRANSLATION:
        return resolve_translation_config(model_dir, section)
    return resolve_embedding_config(model_dir, section.pooling, section.normalize,
                                    section.max_length)
