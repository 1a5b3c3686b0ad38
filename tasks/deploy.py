"""Deploy step for the local Triton target: a rollout without downtime.

`deploy` copies the release's repository in as the MLflow version number (every file's sha256
checked) and loads it *beside* the version that serves, so both answer. The smoke test then
queries the new version by number; `retire` unloads the old one. If anything fails before that,
the transaction's rollback hook unloads the new version and the old one never stopped serving.
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, NotRequired, TypedDict

from prefect import task
from prefect.transactions import get_transaction

from hf2triton import triton_local
from hf2triton.errors import DeployError, ServiceUnavailableError
from hf2triton.model_store import (
    ModelDir,
    prepare_s3_repository,
    server_env,
    triton_uri,
)
from hf2triton.model_store import model_dir as store_model_dir
from hf2triton.spec import DeploySpec, ModelStoreSpec
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT

POLICY = re.compile(r"^version_policy:.*$", re.MULTILINE)


class DeployResult(TypedDict):
    http_url: str
    grpc_url: str
    model_repository: str
    model_name: str
    version: str
    previous_versions: list[str]  # what served before, still loaded until `retire`
    reused: bool
    model_store: NotRequired[dict]  # the spec's deploy.model_store (no credentials in it)


def triton_client(url: str):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url=url, network_timeout=600.0)


def serving_versions(client: Any, model_name: str) -> list[str]:
    """Versions of `model_name` that Triton reports READY."""
    index = client.get_model_repository_index()
    return sorted(
        (str(m["version"]) for m in index
         if m.get("name") == model_name and m.get("state") == "READY" and m.get("version")),
        key=int,
    )


def set_version_policy(model_dir: ModelDir, versions: list[str]) -> None:
    """Pin exactly which versions Triton may load; the next load applies it."""
    listed = ", ".join(versions)
    policy = f"version_policy: {{ specific: {{ versions: [ {listed} ] }} }}"
    text = model_dir.read_config()
    text = POLICY.sub(policy, text) if POLICY.search(text) else f"{text.rstrip()}\n{policy}\n"
    model_dir.write_config(text)


def wait_ready(client: Any, name: str, version: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if client.is_model_ready(name, version):
                return True
        except Exception:  # the server may be busy loading; keep polling until the deadline
            pass
        time.sleep(0.5)
    return False


def load_and_wait(client: Any, model_name: str, version: str, timeout_s: float,
                  where: str = "") -> None:
    """Ask Triton to load the versions the policy lists; raise unless `version` becomes ready.

    Triton loads the versions new to the policy beside those already loaded, which keep serving.
    """
    client.load_model(model_name)
    if not wait_ready(client, model_name, version, timeout_s):
        raise DeployError(
            f"Triton loaded {model_name} but version {version} was not ready within "
            f"{timeout_s:.0f}s; {where}"
        )


def restore_previous(client: Any, model_dir: ModelDir, version: str,
                     previous: list[str]) -> None:
    """Back to what served before: only the previous versions loaded, the new one gone."""
    from tritonclient.utils import InferenceServerException

    if previous:
        set_version_policy(model_dir, previous)
        try:
            client.load_model(model_dir.name)
        except InferenceServerException:
            pass
    else:
        try:
            client.unload_model(model_dir.name)
        except InferenceServerException:
            pass
    model_dir.remove_version(version)


def deploy_local(
    repository: str, model_name: str, version: str, files: dict[str, str], deploy: DeploySpec,
) -> DeployResult:
    """Load `version` of `model_name` beside whatever version serves now."""
    from tritonclient.utils import InferenceServerException

    store = deploy.model_store
    if store.kind == "s3":
        prepare_s3_repository(store)
    state = triton_local.ensure_server(
        deploy.host, deploy.http_port, deploy.grpc_port, deploy.metrics_port,
        timeout_s=deploy.ready_timeout_s,
        repository=triton_uri(store) if store.kind == "s3" else None,
        extra_env=server_env(store),
    )
    client = triton_client(state.http_url)
    model_dir = store_model_dir(state.model_repository, model_name, store)
    expected = {k.removeprefix(f"{model_name}/"): v for k, v in files.items()}
    previous = [v for v in serving_versions(client, model_name) if v != version]
    result = DeployResult(http_url=state.http_url, grpc_url=state.grpc_url,
                          model_repository=state.model_repository, model_name=model_name,
                          version=version, previous_versions=previous, reused=False,
                          model_store=store.model_dump())
    txn = get_transaction()
    if txn is not None:
        txn.set("deploy", dict(result))
    want = {k: v for k, v in expected.items() if k.startswith("1/")}
    if model_dir.version_files(version) == want and wait_ready(client, model_name, version, 1):
        result["reused"] = True
        return result
    model_dir.put_version(Path(repository) / model_name, version, expected)
    set_version_policy(model_dir, [*previous, version])
    try:
        load_and_wait(client, model_name, version, deploy.ready_timeout_s,
                      f"log: {state.log_file}")
    except (InferenceServerException, DeployError) as exc:
        restore_previous(client, model_dir, version, previous)
        raise DeployError(
            f"Triton refused to load {model_name} version {version}: {str(exc)[:500]}. "
            f"{'Version ' + previous[-1] + ' keeps serving. ' if previous else ''}"
            f"Server log: {state.log_file}"
        ) from None
    except OSError as exc:
        restore_previous(client, model_dir, version, previous)
        raise ServiceUnavailableError(f"Triton at {state.http_url} did not answer: {exc}") from exc
    return result


def model_dir_of(deployed: dict) -> ModelDir:
    """The model directory a deploy result (local or one replica's) wrote to."""
    store = deployed.get("model_store")
    return store_model_dir(deployed["model_repository"], deployed["model_name"],
                           ModelStoreSpec(**store) if store else None)


def rollback_deploy(txn: Any) -> None:
    """Rollback hook: the smoke test (or anything after deploy) failed; unload the new version."""
    info = txn.get("deploy", None)
    if not info:
        return
    model_dir = model_dir_of(info)
    client = triton_client(info["http_url"])
    try:
        restore_previous(client, model_dir, info["version"], info["previous_versions"])
    finally:
        client.close()


def retire_previous(deployed: DeployResult) -> list[str]:
    """After the new version passed its smoke test: unload the versions that served before.

    The newest of them stays on disk as the target of a manual rollback.
    """
    model_dir = model_dir_of(deployed)
    if deployed["previous_versions"]:
        set_version_policy(model_dir, [deployed["version"]])
        client = triton_client(deployed["http_url"])
        try:
            client.load_model(deployed["model_name"])
        finally:
            client.close()  # an open connection holds the server's shutdown for its exit timeout
    keep = {deployed["version"], *deployed["previous_versions"][-1:]}
    for old in model_dir.versions():
        if old not in keep:
            model_dir.remove_version(old)
    return deployed["previous_versions"]


deploy = task(deploy_local, name="deploy", task_run_name="deploy {model_name} v{version}",
              **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
deploy.on_rollback(rollback_deploy)
retire = task(retire_previous, name="retire-previous", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
