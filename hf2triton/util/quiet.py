"""Library messages a release's user can do nothing about, dropped at their source.

Each call site says why its message is noise for us; everything else a library logs or warns
still reaches the user.
"""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator


class _Drop(logging.Filter):
    def __init__(self, prefix: str):
        super().__init__()
        self.prefix = prefix

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(self.prefix)


_installed: set[tuple[str, str]] = set()


def drop_log_message(logger_name: str, prefix: str) -> None:
    """Drop, for good, records of `logger_name` (exactly that logger) starting with `prefix`."""
    if (logger_name, prefix) not in _installed:
        logging.getLogger(logger_name).addFilter(_Drop(prefix))
        _installed.add((logger_name, prefix))


@contextlib.contextmanager
def dropped(logger_name: str, prefix: str) -> Iterator[None]:
    """Drop such records while the block runs (e.g. a library that logs through the root)."""
    flt = _Drop(prefix)
    logger = logging.getLogger(logger_name or None)
    logger.addFilter(flt)
    try:
        yield
    finally:
        logger.removeFilter(flt)


@contextlib.contextmanager
def ignored_warnings(category: type[Warning], module: str = "") -> Iterator[None]:
    """Ignore Python warnings of `category` (raised from `module`, a regex) inside the block."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=category, module=module)
        yield
