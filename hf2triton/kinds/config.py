"""What the release's steps know of a kind's resolved config: the kinds' own config classes
(EmbeddingConfig, TranslationConfig, ...) each read the model's files their way; the steps only
carry one from export to repository and store it as a dict."""

from __future__ import annotations

from typing import Any, Protocol


class KindConfig(Protocol):
    """A kind's config resolved from the model's own files (`ModelKind.resolve`), rebuilt from
    its dict by `ModelKind.config_from_dict`."""

    def to_dict(self) -> dict[str, Any]: ...
