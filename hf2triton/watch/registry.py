"""What the watch and the operator's commands read from and write to the MLflow registry: the
champion and candidate versions, the previous champion and promotion time a promotion records,
the smoke items a version was released with, and why a version was rolled back."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, TypedDict

from hf2triton.clients.mlflow import Registry
from hf2triton.util.workspace import home

PREVIOUS = "hf2triton.previous_champion"
PROMOTED_AT = "hf2triton.promoted_at"
ROLLED_BACK = "hf2triton.rolled_back"
ROLLED_BACK_TO = "hf2triton.rolled_back_to"
RESTORED_FROM = "hf2triton.restored_from"
RESTORED_AT = "hf2triton.restored_at"


class Versions(TypedDict):
    champion: str | None
    candidate: str | None
    previous: str | None  # what the champion's promotion replaced
    promoted_at: float | None  # epoch seconds of the champion's promotion by a release
    restored_at: float | None  # ... of its restoration by a rollback, if that came later
    tags: dict[str, str]  # the champion's tags


def alias_version(client: Registry, model: str, alias: str) -> Any | None:
    from mlflow.exceptions import MlflowException

    if not client.has_model(model):
        return None
    try:
        return client.version_by_alias(model, alias)
    except MlflowException as exc:
        if exc.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return None
        raise


def promotion_tags(client: Registry, model: str, version: str) -> dict[str, str]:
    """Tags of a version about to become champion: the champion it replaces and the time."""
    old = alias_version(client, model, "champion")
    tags = {PROMOTED_AT: f"{time.time():.3f}"}
    if old is not None and str(old.version) != str(version):
        tags[PREVIOUS] = str(old.version)
    return tags


def promote(client: Registry, model: str, version: str, smoke: dict[str, float]) -> None:
    """The smoke test passed: its figures on the version, what it replaces and when (what the
    watch rolls back to, and when its window started), and the `champion` alias on it."""
    client.tag_version(model, version, {f"smoke.{k}": f"{v:.6g}" for k, v in smoke.items()})
    client.tag_version(model, version, promotion_tags(client, model, version))
    client.set_alias(model, "champion", version)


def versions(client: Registry, model: str) -> Versions:
    champion = alias_version(client, model, "champion")
    candidate = alias_version(client, model, "candidate")
    tags = dict(champion.tags) if champion is not None else {}
    promoted = float(tags.get(PROMOTED_AT) or 0) or None
    restored = float(tags.get(RESTORED_AT) or 0) or None
    return Versions(
        champion=str(champion.version) if champion else None,
        candidate=str(candidate.version) if candidate else None,
        previous=tags.get(PREVIOUS),
        promoted_at=promoted,
        restored_at=restored if restored and restored > (promoted or 0) else None,
        tags=tags,
    )


def smoke_reference(client: Registry, model: str, version: str) -> dict[str, Any] | None:
    """The smoke items, PyTorch's answers and limits `version` was released with (None for a
    version released before they were recorded)."""
    from mlflow.exceptions import MlflowException

    # Keyed by the version's run too: a registry made anew numbers its versions from 1 again.
    run_id = client.version(model, version).run_id
    cache = home() / "watch" / "references" / model / f"{version}-{run_id}.json"
    if not cache.is_file():
        try:
            got = client.download_artifact(
                run_id, "reference.json", str(cache.parent / f".{version}")
            )
        except (MlflowException, OSError):
            return None
        cache.parent.mkdir(parents=True, exist_ok=True)
        Path(got).replace(cache)
    return json.loads(cache.read_text(encoding="utf-8"))


def mark_rolled_back(client: Registry, model: str, bad: str, good: str, reason: str) -> None:
    """`good` is champion again; `bad` says why it is not, in its tags and its description."""
    client.set_alias(model, "champion", good)
    client.tag_version(model, bad, {ROLLED_BACK: reason[:4000], ROLLED_BACK_TO: good})
    client.tag_version(model, good, {RESTORED_FROM: bad, RESTORED_AT: f"{time.time():.3f}"})
    old = client.version(model, bad).description or ""
    client.describe_version(model, bad, f"{old}\n\nRolled back to version {good}: {reason}".strip())
