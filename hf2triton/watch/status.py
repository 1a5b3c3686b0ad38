"""`hf2triton status`: per release, the champion and candidate versions, what each endpoint
serves now, and the watch's last verdict; every release this hf2triton home has run as a table
(as `helm list` shows releases), one release in full, or the object for scripts (`--json`)."""

from __future__ import annotations

import json
import time
from typing import Any

from hf2triton.clients.mlflow import Registry
from hf2triton.clients.triton import TritonAdmin
from hf2triton.spec import ReleaseSpec, target_for
from hf2triton.util.workspace import atomic_write_text, home, work_dir
from hf2triton.watch import registry as reg
from hf2triton.watch.observe import read_state

COLUMNS = ("RELEASE", "CHAMPION", "CANDIDATE", "SERVING", "WATCH", "LAST LOOK")


def remember(spec: ReleaseSpec) -> None:
    """Keep the spec a release ran with, so `status` finds every release of this home."""
    atomic_write_text(
        home() / "releases" / f"{spec.name}.json", spec.model_dump_json(indent=1, exclude_none=True)
    )


def remembered() -> list[dict[str, Any]]:
    """The specs of every release this home has run (as JSON objects), by name."""
    found = []
    for path in sorted((home() / "releases").glob("*.json")):
        try:
            found.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError):
            continue  # one unreadable record hides no other release
    return found


def status(spec: ReleaseSpec) -> dict[str, Any]:
    versions = reg.versions(Registry(), spec.registry.model_name)
    serving: dict[str, list[str] | str] = {}  # its versions, or why it did not say
    for point in target_for(spec, work_dir(spec.name)).watch_points():
        try:
            with TritonAdmin(point["http"], timeout_s=10) as admin:
                serving[point["name"]] = admin.serving_versions(spec.triton_model_name)
        except Exception as exc:  # noqa: BLE001 - a server that does not answer is a status
            serving[point["name"]] = f"not answering ({type(exc).__name__})"
    last = read_state(spec.name).get("last") or {}
    return {
        "release": spec.name,
        "model": spec.registry.model_name,
        "champion": versions["champion"],
        "candidate": versions["candidate"],
        "previous": versions["previous"],
        "restored_from": versions["tags"].get(reg.RESTORED_FROM)
        if versions["restored_at"]
        else None,
        "serving": serving,
        "watch": {k: last.get(k) for k in ("at", "champion", "in_window", "rows", "breaches")}
        if last
        else None,
    }


def local_time(epoch: float | None) -> str:
    """'2026-11-25 16:03:12' in this machine's time zone ('-' for none)."""
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch)) if epoch else "-"


def verdict(found: dict[str, Any]) -> str:
    watch = found.get("watch")
    if not watch:
        return "not watched yet"
    breaches = watch.get("breaches") or []
    return (
        f"breach: {breaches[0]}" + (f" (+{len(breaches) - 1})" if len(breaches) > 1 else "")
        if breaches
        else f"ok (v{watch.get('champion')})"
    )


def serving_text(found: dict[str, Any]) -> str:
    parts = []
    for where, versions in found["serving"].items():
        shown = (
            ",".join(f"v{v}" for v in versions) or "nothing"
            if isinstance(versions, list)
            else versions
        )
        parts.append(f"{shown} on {where}")
    return "; ".join(parts) or "-"


def row(found: dict[str, Any]) -> list[str]:
    return [
        found["release"],
        found["champion"] or "-",
        found["candidate"] or "-",
        serving_text(found),
        verdict(found),
        local_time((found.get("watch") or {}).get("at")),
    ]


def table(rows: list[list[str]]) -> str:
    """Rows under COLUMNS, each column as wide as its widest cell."""
    cells = [list(COLUMNS), *rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells)


def describe(found: dict[str, Any]) -> str:
    """One release in full: versions, what serves where, the watch's last figures."""
    watch = found.get("watch") or {}
    lines = [
        f"release:    {found['release']} (MLflow model {found['model']})",
        f"champion:   {found['champion'] or '-'}"
        + (f" (restored from {found['restored_from']})" if found.get("restored_from") else "")
        + (f", replaced {found['previous']}" if found.get("previous") else ""),
        f"candidate:  {found['candidate'] or '-'}",
    ]
    lines += [
        f"serving:    {', '.join(f'v{v}' for v in versions) or 'nothing'} on {where}"
        if isinstance(versions, list)
        else f"serving:    {where}: {versions}"
        for where, versions in found["serving"].items()
    ]
    lines.append(
        f"watch:      {verdict(found)}, last look {local_time(watch.get('at'))}"
        + (" (in its rollback window)" if watch.get("in_window") else "")
    )
    for figures in watch.get("rows") or []:
        shown = ", ".join(
            f"{k} {v}"
            for k, v in figures.items()
            if k not in ("endpoint", "version")
            and v is not None
            and not isinstance(v, (list, dict))
        )
        lines.append(f"            v{figures.get('version')} on {figures.get('endpoint')}: {shown}")
    return "\n".join(lines)
