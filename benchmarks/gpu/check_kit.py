"""What every part of the GPU check (check.py and its modules) shares: its one error, a file's
sha256 and its log line. Standard library only, as all of the check is."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path


class Refused(Exception):
    """The pack cannot be used as it is (a part damaged or missing): carry it again."""


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def log(msg: str) -> None:
    print(f"check: {msg}", file=sys.stderr, flush=True)
