"""Plug-in tables ("module:Class" by name), and waiting for something to become true."""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any


def load(table: dict[str, str], name: str) -> Any:
    """The class `table[name]` names as "module:Class", imported when first used."""
    module, _, cls = table[name].partition(":")
    return getattr(importlib.import_module(module), cls)


def wait_until(predicate: Callable[[], bool], timeout_s: float, interval_s: float = 0.5) -> bool:
    """Poll `predicate` until it is true (True) or `timeout_s` passed (False); a predicate that
    raises counts as not yet true (a server still starting answers with all sorts of errors)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if predicate():
                return True
        except Exception:  # noqa: BLE001 - not up yet
            pass
        if time.monotonic() >= deadline:
            return False
        time.sleep(interval_s)
