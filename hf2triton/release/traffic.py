"""Which validation items a served model is sent before the release is measured or served: the
warm-up requests its repository carries, and the requests the configuration search repeats."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

WARMUP_ITEMS = 2
SEARCH_ITEMS = 256


def sendable(items: list[Any]) -> list[Any]:
    """The items that make a request (a blank line does not)."""
    return [x for x in items if str(x).strip()]


def warmup_items(
    items: list[Any], size: Callable[[Any], int] = lambda x: len(str(x)), n: int = WARMUP_ITEMS
) -> list[Any]:
    """The `n` largest items by the kind's `size` (ModelKind.item_size: characters, a file's
    bytes): Triton's warm-up then allocates for long inputs before the first user's request
    needs it."""
    return sorted(sendable(items), key=size)[-n:]


def search_items(items: list[Any], n: int = SEARCH_ITEMS) -> list[Any]:
    """The first `n` items the configuration search sends, one per request, in turn."""
    return sendable(items)[:n]
