"""Target `local-triton`: the local tritonserver (hf2triton.targets.triton_local), a rollout without
downtime. The new version is written into the model's directory (every file's sha256 checked;
a local folder or an S3 bucket, `deploy.model_store`) as the MLflow version number and loaded
*beside* the version that serves, so both answer; the smoke test queries the new one by number;
`retire` unloads the old one (it stays on disk for a manual rollback). A load that fails puts the
old version back before the step fails, and a rollback does the same later.

The version-policy mechanics (`set_version_policy`, `restore_previous`) are shared with the
replica target, which rolls the same steps out to several servers.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

from pydantic import Field

from hf2triton.clients.triton import TritonAdmin
from hf2triton.errors import DeployError, Hf2TritonError, ServiceUnavailableError
from hf2triton.stores import ModelDir, ModelStoreSpec, default_store, parse_store
from hf2triton.targets import triton_local
from hf2triton.targets.base import (
    TARGETS,
    Check,
    Deployment,
    DeployTarget,
    PublishedSection,
    WatchPoint,
)
from hf2triton.targets.smoke import Endpoint
from hf2triton.util.runs import step_logger

POLICY = re.compile(r"^version_policy:.*$", re.MULTILINE)


def set_version_policy(folder: ModelDir, versions: list[str]) -> None:
    """Pin exactly which versions Triton may load; the next load applies it."""
    policy = f"version_policy: {{ specific: {{ versions: [ {', '.join(versions)} ] }} }}"
    text = folder.read_config()
    text = POLICY.sub(policy, text) if POLICY.search(text) else f"{text.rstrip()}\n{policy}\n"
    folder.write_config(text)


def restore_previous(
    admin: TritonAdmin, folder: ModelDir, version: str, previous: list[str]
) -> None:
    """Back to what served before: only the previous versions loaded, the new one gone."""
    try:
        if previous:
            set_version_policy(folder, previous)
            admin.load(folder.name)
        else:
            admin.unload(folder.name)
    except Hf2TritonError:
        pass  # the new version is removed below either way
    folder.remove_version(version)


def expected_files(files: dict[str, str], model_name: str) -> dict[str, str]:
    """The repository's record ('<model>/...' keys) as one model directory sees it."""
    return {k.removeprefix(f"{model_name}/"): v for k, v in files.items()}


def folder_of(server: dict[str, Any], model_name: str) -> ModelDir:
    """The model directory one server (local, or a replica) reads."""
    store = parse_store(server.get("model_store") or {})
    return store.model_dir(model_name, server["model_repository"])


def retire_on(server: dict[str, Any], model_name: str, version: str) -> list[str]:
    """Unload what `server` served before `version`; the newest of those stays on disk."""
    folder = folder_of(server, model_name)
    previous = server["previous_versions"]
    if previous:
        set_version_policy(folder, [version])
        with TritonAdmin(server["http"]) as admin:
            admin.load(model_name)
    # The newest other version stays on disk for a rollback (hf2triton rollback, the watch),
    # also when `version` served already and so replaced nothing.
    others = sorted((v for v in folder.versions() if v != version), key=int)
    keep = {version, *(previous[-1:] or others[-1:])}
    for old in folder.versions():
        if old not in keep:
            folder.remove_version(old)
    return previous


def restore_on(server: dict[str, Any], model_name: str, version: str) -> None:
    with TritonAdmin(server["http"]) as admin:
        restore_previous(admin, folder_of(server, model_name), version, server["previous_versions"])


class LocalTritonDeploy(PublishedSection):
    """`target: local-triton`: the local tritonserver process, new versions loaded beside the
    serving one."""

    target: Literal["local-triton"] = "local-triton"
    model_store: ModelStoreSpec = Field(default_factory=default_store)


@TARGETS.register
class LocalTriton(DeployTarget):
    Spec = LocalTritonDeploy
    spec: LocalTritonDeploy

    def _server(self) -> tuple[triton_local.ServerState, str | None]:
        """The local Triton (started if none runs) and the API beside it (its base URL)."""
        spec, store = self.spec, self.spec.model_store
        server = triton_local.ensure_server(
            triton_local.ServerPorts(spec.host, spec.http_port, spec.grpc_port, spec.metrics_port),
            timeout_s=spec.ready_timeout_s,
            repository=store.triton_uri(),
            extra_env=store.server_env(),
        )
        if not spec.openai.enabled:
            triton_local.stop_api()
            return server, None
        return server, triton_local.ensure_api(
            server, spec.host, spec.openai.port, spec.openai.key_hashes(), spec.openai.arguments()
        ).url

    def _revive(self, model_name: str) -> tuple[str, list[str] | None]:
        """After a failure: a local Triton that died during it (killed, crashed) is started
        again on its repository, whose version policy names what served before, so that serves
        again; returns a sentence saying so ('' when the server lives) and the versions the
        revived server serves (None when it lived, or could not be started)."""
        if triton_local.read_state() is not None:
            return "", None
        started = time.monotonic()
        try:
            server, _ = self._server()
            with TritonAdmin(server.http_url) as admin:
                serving = admin.serving_versions(model_name)
        except Hf2TritonError as exc:
            return (
                f" The local Triton died during the deploy and could not be started again "
                f"({str(exc)[:300]}): run `hf2triton server start`.",
                None,
            )
        step_logger().warning(
            "deploy: the local Triton had died; started again (pid %d) in "
            "%.1f s, serving %s version(s) %s",
            server.pid,
            time.monotonic() - started,
            model_name,
            ", ".join(serving) or "none",
        )
        return (
            f" The local Triton died during the deploy; it was started again in "
            f"{time.monotonic() - started:.0f} s and serves version "
            f"{', '.join(serving) or 'none'} (pid {server.pid}).",
            serving,
        )

    def deploy(
        self,
        repository: str,
        model_name: str,
        version: str,
        files: dict[str, str],
        image: dict[str, Any],
        check: Check,
    ) -> Deployment:
        spec, store = self.spec, self.spec.model_store
        store.prepare()
        server, api = self._server()
        folder = store.model_dir(model_name, server.model_repository)
        expected = expected_files(files, model_name)
        want = {k: v for k, v in expected.items() if k.startswith("1/")}
        with TritonAdmin(server.http_url) as admin:
            previous = [v for v in admin.serving_versions(model_name) if v != version]
            deployment = self._deployment(server, api, model_name, version, previous)
            if folder.version_files(version) == want and admin.wait_ready(model_name, version, 1):
                deployment["reused"] = True
                return deployment
            folder.put_version(Path(repository) / model_name, version, expected)
            set_version_policy(folder, [*previous, version])
            try:
                admin.load(model_name)
                if not admin.wait_ready(model_name, version, spec.ready_timeout_s):
                    raise DeployError(
                        f"version {version} was not ready within {spec.ready_timeout_s:.0f}s"
                    )
            except (Hf2TritonError, OSError) as exc:
                restore_previous(admin, folder, version, previous)
                raise self._not_loaded(exc, deployment, server.log_file) from None
        return deployment

    def _deployment(
        self,
        server: triton_local.ServerState,
        api: str | None,
        model_name: str,
        version: str,
        previous: list[str],
    ) -> Deployment:
        """The deployment of `version` on the local server (and the API beside it, `api`),
        beside the `previous` versions it serves."""
        endpoint = Endpoint(
            name=f"local Triton {server.http_url}",
            http=server.http_url,
            grpc=server.grpc_url,
            version=version,
        )
        if api:
            endpoint["openai"] = api
        state = {
            "http": server.http_url,
            "model_repository": server.model_repository,
            "previous_versions": previous,
            "model_store": self.spec.model_store.describe(),
        }
        return Deployment(
            target=self.name,
            model_name=model_name,
            version=version,
            endpoints=[endpoint],
            state=state,
            reused=False,
        )

    def _not_loaded(self, exc: Exception, deployment: Deployment, log_file: str) -> Hf2TritonError:
        """The error of a version that did not load (what served before serves again), after
        reviving a server that died meanwhile."""
        model_name, version = deployment["model_name"], deployment["version"]
        previous = deployment["state"]["previous_versions"]
        revived, serving = self._revive(model_name)
        error = exc if isinstance(exc, Hf2TritonError) else DeployError(str(exc))
        # What served before keeps serving when the server lived, or when the server that
        # died was started again serving it: the error says so the same way in both cases.
        kept = previous and (not revived or (serving is not None and previous[-1] in serving))
        # A server that died while loading the new version may have been killed by it
        # (memory, a crashing backend): not retried, so it is not killed again.
        return (DeployError if revived else type(error))(
            f"{model_name} version {version} did not load: {str(error)[:500]}. "
            + (f"Version {previous[-1]} keeps serving. " if kept else "")
            + f"Server log: {log_file}.{revived}"
        )

    def retire(self, deployment: Deployment) -> list[str]:
        return retire_on(deployment["state"], deployment["model_name"], deployment["version"])

    def rollback(self, deployment: Deployment) -> None:
        restore_on(deployment["state"], deployment["model_name"], deployment["version"])
        self._revive(deployment["model_name"])

    def watch_points(self) -> list[WatchPoint]:
        return [self.spec.watch_point("local Triton")]

    def restore(self, model_name: str, version: str, check: Check) -> list[str]:
        state = triton_local.read_state()
        if state is None or not triton_local.is_live(state):
            raise DeployError(
                "no local Triton server runs: start it with a release, or "
                "`hf2triton server status` to see why"
            )
        server = {
            "http": state.http_url,
            "model_repository": state.model_repository,
            "model_store": self.spec.model_store.describe(),
        }
        endpoint = Endpoint(
            name=f"local Triton {state.http_url}",
            http=state.http_url,
            grpc=state.grpc_url,
            version=version,
        )
        api = triton_local.read_api()
        if api is not None and self.spec.openai.enabled:
            endpoint["openai"] = api.url
        return restore_on_servers(
            [server], model_name, version, check, self.spec.ready_timeout_s, [endpoint]
        )


def repository_key(root: str) -> str:
    """What tells apart the repositories of several servers (a shared one is written once)."""
    return root if root.startswith("s3://") else os.path.realpath(root)


def load_on(server: dict[str, Any], model_name: str, version: str, timeout_s: float) -> str | None:
    """Load what the repository's version policy says on one server and wait for `version`;
    None when it is READY, else what went wrong (naming the server)."""
    with TritonAdmin(server["http"]) as admin:  # tritonclient.http clients stay in one thread
        try:
            admin.load(model_name)
            if not admin.wait_ready(model_name, version, timeout_s):
                raise DeployError(f"not ready within {timeout_s:.0f}s")
            state, _ = admin.state(model_name, version)
            if state != "READY":
                return f"{server['http']}: repository index says {state or 'not listed'}"
        except Exception as exc:  # noqa: BLE001 - every server's outcome is reported
            state, reason = "", ""
            try:
                state, reason = admin.state(model_name, version)
            except Exception:  # noqa: BLE001 - the server may be gone altogether
                pass
            if not admin.live():
                return f"{server['http']}: did not answer (the server is down: {str(exc)[:200]})"
            return (
                f"{server['http']}: {state or 'failed'}: "
                f"{' '.join((reason or str(exc)).split())[:300]}"
            )
    return None


def on_each(servers: list[dict[str, Any]], work: Any) -> list[Any]:
    """`work(server)` on every server at once (a replica set loads in parallel)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=max(1, len(servers))) as pool:
        return list(pool.map(work, servers))


def restore_on_servers(
    servers: list[dict[str, Any]],
    model_name: str,
    version: str,
    check: Check,
    timeout_s: float,
    endpoints: list[Endpoint],
) -> list[str]:
    """`version` (kept on disk by retire) back on every server, all or none: it loads beside
    what each serves and every endpoint passes `check`; only then does it serve alone
    everywhere. If any server fails, every server keeps (or gets back) what it served. A client
    that names no version is answered throughout, by the old and then by `version`. Servers may
    share a repository (each folder's version policy keeps what any of its servers serves).
    Returns the versions that stopped serving."""
    folders = _folders_holding(servers, model_name, version)
    serving = _serving_besides(servers, model_name, version)

    def policy(pick: Callable[[dict[str, Any]], list[str]]) -> None:
        for folder, group in folders.values():
            versions = {v for s in group for v in pick(s)}
            set_version_policy(folder, sorted(versions, key=int))

    policy(lambda s: [*serving[s["http"]], version])
    try:
        failures = [
            f for f in on_each(servers, lambda s: load_on(s, model_name, version, timeout_s)) if f
        ]
        if failures:
            raise DeployError(
                f"{model_name} version {version} did not load on "
                f"{len(failures)} of {len(servers)} server(s): "
                f"{'; '.join(failures)}"
            )
        for endpoint in endpoints:
            check(endpoint)
    except Exception:
        policy(lambda s: serving[s["http"]])  # what served before serves on, everywhere
        on_each(servers, lambda s: _quietly_load(s, model_name))
        raise
    policy(lambda s: [version])
    on_each(servers, lambda s: _quietly_load(s, model_name))
    return sorted({v for vs in serving.values() for v in vs}, key=int)


def _folders_holding(
    servers: list[dict[str, Any]], model_name: str, version: str
) -> dict[str, tuple[ModelDir, list[dict[str, Any]]]]:
    """Each distinct repository's model directory and the servers that read it; raises unless
    every one holds `version`."""
    folders: dict[str, tuple[ModelDir, list[dict[str, Any]]]] = {}
    for server in servers:
        folder = folder_of(server, model_name)
        if version not in folder.versions():
            raise DeployError(
                f"{model_name} version {version} is not in the model repository of "
                f"{server['http']} (it holds {', '.join(folder.versions()) or 'nothing'}): "
                "release it again instead"
            )
        key = repository_key(server["model_repository"])
        folders.setdefault(key, (folder, []))[1].append(server)
    return folders


def _serving_besides(
    servers: list[dict[str, Any]], model_name: str, version: str
) -> dict[str, list[str]]:
    """What each server (by its HTTP address) serves now other than `version`; a server that
    does not answer stops the rollback before anything changed."""
    serving: dict[str, list[str]] = {}
    for server in servers:
        with TritonAdmin(server["http"]) as admin:
            if not admin.live():
                raise ServiceUnavailableError(
                    f"{server['http']} did not answer: nothing was changed on any server; "
                    f"start it, then roll back again"
                )
            serving[server["http"]] = [
                v for v in admin.serving_versions(model_name) if v != version
            ]
    return serving


def _quietly_load(server: dict[str, Any], model_name: str) -> None:
    """Apply the version policy on one server; one that does not answer is left to its next
    start (it loads what the policy says)."""
    try:
        with TritonAdmin(server["http"]) as admin:
            admin.load(model_name)
    except Hf2TritonError:
        pass
