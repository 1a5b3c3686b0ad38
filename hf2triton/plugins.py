"""Plug-in tables: "module:Class" by name, imported when first used."""

from __future__ import annotations

import importlib
from typing import Any


def load(table: dict[str, str], name: str) -> Any:
    """The class `table[name]` names as "module:Class", imported when first used."""
    module, _, cls = table[name].partition(":")
    return getattr(importlib.import_module(module), cls)
