"""Deploy target `triton-replicas`: one rollout across N Triton servers, all forward or all back.

Each replica gets the new version beside the one it serves (the same steps as the local target,
tasks/deploy.py); then every replica must list the version READY in its repository index and pass
the smoke test against the PyTorch reference on its own endpoints. If any replica fails, every
replica is put back to what it served before, so a load balancer in front never mixes versions
for long (the failure mode of rollouts that reach only some replicas).
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TypedDict

from prefect import task
from prefect.transactions import get_transaction

from hf2triton.errors import DeployError, ServiceUnavailableError, SmokeTestError
from hf2triton.model_store import model_dir as store_model_dir
from hf2triton.model_store import prepare_s3_repository, triton_uri
from hf2triton.spec import DeploySpec
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT
from tasks.deploy import (
    DeployResult,
    load_and_wait,
    model_dir_of,
    restore_previous,
    retire_previous,
    serving_versions,
    set_version_policy,
    triton_client,
)
from tasks.smoke import SmokeResult, smoke_test


class ReplicaSetResult(TypedDict):
    model_name: str
    version: str
    replicas: list[DeployResult]  # one per replica, in the spec's order
    reused: bool


def repository_state(client: Any, model_name: str, version: str) -> tuple[str, str]:
    """(state, reason) of one version in the server's repository index ('' when not listed)."""
    for m in client.get_model_repository_index():
        if m.get("name") == model_name and str(m.get("version", "")) == version:
            return str(m.get("state", "")), str(m.get("reason", ""))
    return "", ""


def _serving(replica: Any, model_name: str) -> list[str]:
    """The versions a replica serves now; a silent replica stops the rollout before anything
    changed."""
    client = triton_client(replica.http)
    try:
        if not client.is_server_live():
            raise ConnectionError("not live")
        return serving_versions(client, model_name)
    except Exception as exc:  # tritonclient raises several types for a refused connection
        raise ServiceUnavailableError(
            f"replica {replica.http} did not answer ({str(exc)[:200]}): nothing was changed on "
            "any replica; start it or remove it from deploy.replicas"
        ) from None
    finally:
        client.close()  # an open connection holds a server's shutdown for its exit timeout


def _restore_all(model_name: str, version: str, replicas: list[DeployResult]) -> list[str]:
    """Put every replica back to what it served before; returns the replicas that did not answer."""
    failed = []
    for rep in replicas:
        model_dir = model_dir_of(rep)
        client = triton_client(rep["http_url"])
        try:
            restore_previous(client, model_dir, version, rep["previous_versions"])
        except Exception:  # keep restoring the others; report this one
            failed.append(rep["http_url"])
        finally:
            client.close()
    return failed


def deploy_replicas(
    repository: str, model_name: str, version: str, files: dict[str, str], deploy: DeploySpec,
) -> ReplicaSetResult:
    """Load `version` beside the serving one on every replica; all of them or none.

    Example:
        >>> spec.deploy.replicas  # [ReplicaSpec(http='10.0.0.5:8000', grpc='10.0.0.5:8001', ...)]
        >>> deploy_replicas(repo, "my-embedder", "3", files, spec.deploy)["replicas"][0]["version"]
        '3'
    """
    store = deploy.model_store
    opened = [(r, _serving(r, model_name)) for r in deploy.replicas]
    results = [
        DeployResult(http_url=r.http, grpc_url=r.grpc,
                     model_repository=triton_uri(store) if store.kind == "s3" else
                     str(r.model_repository),
                     model_name=model_name, version=version,
                     previous_versions=[v for v in serving if v != version], reused=False,
                     model_store=store.model_dump())
        for r, serving in opened
    ]
    out = ReplicaSetResult(model_name=model_name, version=version, replicas=results, reused=False)
    if all(version in serving for _, serving in opened):
        out["reused"] = True  # a re-run: every replica serves this version already
        for rep in out["replicas"]:
            rep["reused"] = True
        return out
    txn = get_transaction()
    if txn is not None:
        txn.set("replicas", dict(out))

    expected = {k.removeprefix(f"{model_name}/"): v for k, v in files.items()}
    want = {k: v for k, v in expected.items() if k.startswith("1/")}
    # Replicas may share a repository (a shared mount): write each distinct one once, with a
    # version policy that keeps what any of its replicas serves.
    shared: dict[str, list[DeployResult]] = {}
    for rep in results:
        root = rep["model_repository"]
        shared.setdefault(root if root.startswith("s3://") else os.path.realpath(root),
                          []).append(rep)
    try:
        if store.kind == "s3":
            prepare_s3_repository(store)
        for root, reps in shared.items():
            if not root.startswith("s3://") and not Path(root).is_dir():
                raise DeployError(
                    f"the model repository {root} of replica {reps[0]['http_url']} does not exist "
                    "on this machine: mount it, or fix deploy.replicas[].model_repository"
                )
            model_dir = store_model_dir(root, model_name, store)
            if model_dir.version_files(version) != want:
                model_dir.put_version(Path(repository) / model_name, version, expected)
            keep = sorted({v for r in reps for v in r["previous_versions"]} | {version}, key=int)
            set_version_policy(model_dir, keep)

        def load(item: tuple[Any, list[str]]) -> str | None:
            replica = item[0]
            client = triton_client(replica.http)  # tritonclient.http's clients stay in one thread
            try:
                load_and_wait(client, model_name, version, deploy.ready_timeout_s,
                              f"replica {replica.http}")
                state, reason = repository_state(client, model_name, version)
                if state != "READY":
                    return f"{replica.http}: repository index says {state or 'not listed'}"
            except Exception as exc:  # noqa: BLE001 - every replica's outcome is reported
                state, reason = "", ""
                try:
                    state, reason = repository_state(client, model_name, version)
                except Exception:  # noqa: BLE001 - the replica may be gone altogether
                    pass
                return (f"{replica.http}: {state or 'failed'}: "
                        f"{' '.join((reason or str(exc)).split())[:300]}")
            finally:
                client.close()
            return None

        with ThreadPoolExecutor(max_workers=len(opened)) as pool:
            failures = [f for f in pool.map(load, opened) if f]
    except BaseException:
        _restore_all(model_name, version, results)
        raise
    if failures:
        unrestored = _restore_all(model_name, version, results)
        before = sorted({v for r in results for v in r["previous_versions"]}, key=int)
        raise DeployError(
            f"{model_name} version {version} failed to load on {len(failures)} of "
            f"{len(results)} replicas ({'; '.join(failures)}). Rolled back on every replica"
            + (f": version {', '.join(before)} keeps serving" if before else "")
            + (f"; could not reach {unrestored} to roll back" if unrestored else "")
            + ". Fix the failing replica (its log says why) and run the release again."
        )
    return out


def rollback_replicas(txn: Any) -> None:
    """Rollback hook: a replica's smoke test (or anything after deploy) failed; every replica goes
    back to what it served before."""
    info = txn.get("replicas", None)
    if info:
        _restore_all(info["model_name"], info["version"], info["replicas"])


def smoke_replicas(deployed: ReplicaSetResult, reference_path: str, min_cosine: float,
                   max_batch_size: int = 64) -> SmokeResult:
    """The smoke test (gRPC and HTTP, against the PyTorch reference) on every replica; returns the
    worst figures over the replicas."""
    results = []
    for rep in deployed["replicas"]:
        try:
            results.append(smoke_test(rep["grpc_url"], rep["http_url"], deployed["model_name"],
                                      deployed["version"], reference_path, min_cosine,
                                      max_batch_size))
        except SmokeTestError as exc:
            raise SmokeTestError(f"replica {rep['http_url']}: {exc}") from None
    worst: dict[str, Any] = {}
    for key in results[0]:
        values = [r[key] for r in results]
        worst[key] = max(values) if key.endswith("_ms") else (
            min(values) if isinstance(values[0], float) else values[0])
    return SmokeResult(**worst)


def retire_replicas(deployed: ReplicaSetResult) -> list[str]:
    """After every replica passed: unload the versions that served before, on every replica."""
    retired: set[str] = set()
    for rep in deployed["replicas"]:
        retired.update(retire_previous(rep))
    return sorted(retired, key=int)


deploy_set = task(deploy_replicas, name="deploy-replicas",
                  task_run_name="deploy {model_name} v{version} to replicas",
                  **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
deploy_set.on_rollback(rollback_replicas)
smoke_set = task(smoke_replicas, name="smoke-replicas", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
retire_set = task(retire_replicas, name="retire-replicas", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
