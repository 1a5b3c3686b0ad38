"""Back to an earlier champion after promotion, for `hf2triton rollback` and the watch: the old
version is loaded beside what serves and passes its own smoke test before it alone serves
(the deploy target's `restore`), and only then does the `champion` alias move back and the
replaced version get tagged with why."""

from __future__ import annotations

from typing import Any

from hf2triton.clients.mlflow import Registry
from hf2triton.errors import DeployError
from hf2triton.spec import ReleaseSpec, kind_for, target_for
from hf2triton.targets.smoke import smoke_endpoint
from hf2triton.util.workspace import work_dir
from hf2triton.watch import registry as reg


def checker(spec: ReleaseSpec, client: Registry, version: str):
    """The smoke test `version` was released with, as the target's check of one endpoint; a
    version released before smoke references were recorded must at least answer them."""
    kind, model = kind_for(spec), spec.triton_model_name
    reference = reg.smoke_reference(client, spec.registry.model_name, version)
    if reference is None:
        raise DeployError(
            f"{spec.registry.model_name} version {version} has no recorded smoke "
            "reference (released before hf2triton recorded one): release it again "
            "instead"
        )
    key = spec.deploy.openai.client_key()
    return lambda endpoint: smoke_endpoint(kind, endpoint, model, reference, key)


def roll_back(
    spec: ReleaseSpec, reason: str, to: str | None = None, only_if_champion: str | None = None
) -> dict[str, Any]:
    """Serve `to` (default: the version the champion replaced) again and make it champion.
    With `only_if_champion`, nothing happens unless that version is still champion (the watch
    and the automation answering its event may both ask)."""
    client = Registry()
    model = spec.registry.model_name
    now = reg.versions(client, model)
    champion = now["champion"]
    if champion is None:
        raise DeployError(f"{model} has no champion to roll back from: nothing was released")
    if only_if_champion is not None and champion != str(only_if_champion):
        return {
            "rolled_back": False,
            "champion": champion,
            "why": f"version {only_if_champion} is no longer champion",
        }
    to = str(to) if to is not None else now["previous"]
    if to is None:
        raise DeployError(
            f"{model} version {champion} replaced no earlier champion: give the "
            "version to go back to with --to VERSION"
        )
    if to == champion:
        return {"rolled_back": False, "champion": champion, "why": f"{to} is champion already"}
    target = target_for(spec, work_dir(spec.name))
    stopped = target.restore(spec.triton_model_name, to, checker(spec, client, to))
    reg.mark_rolled_back(client, model, champion, to, reason)
    return {
        "rolled_back": True,
        "champion": to,
        "from": champion,
        "stopped": stopped,
        "reason": reason,
    }
