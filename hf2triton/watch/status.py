"""`hf2triton status`: per release, the champion and candidate versions, what each endpoint
serves now, and the watch's last figures."""

from __future__ import annotations

from typing import Any

from hf2triton.clients.mlflow import Registry
from hf2triton.clients.triton import TritonAdmin
from hf2triton.targets import target_for
from hf2triton.watch import registry as reg
from hf2triton.watch.observe import read_state
from hf2triton.workspace import work_dir


def status(spec: Any) -> dict[str, Any]:
    versions = reg.versions(Registry(), spec.registry.model_name)
    serving = {}
    for point in target_for(spec, work_dir(spec.name)).watch_points():
        try:
            with TritonAdmin(point["http"], timeout_s=10) as admin:
                serving[point["name"]] = admin.serving_versions(spec.triton_model_name)
        except Exception as exc:  # noqa: BLE001 - a server that does not answer is a status
            serving[point["name"]] = f"not answering ({type(exc).__name__})"
    last = read_state(spec.name).get("last") or {}
    return {"release": spec.name, "model": spec.registry.model_name,
            "champion": versions["champion"], "candidate": versions["candidate"],
            "previous": versions["previous"],
            "restored_from": versions["tags"].get(reg.RESTORED_FROM)
            if versions["restored_at"] else None,
            "serving": serving,
            "watch": {k: last.get(k) for k in ("at", "champion", "in_window", "rows", "breaches")}
            if last else None}
