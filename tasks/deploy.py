"""Deploy step: put the release's Triton repository into the local Triton server as the MLflow
version number, load it, and wait until that version is ready. If the load fails, the new
version is removed and the previous one is loaded back, so what served before keeps serving.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import TypedDict

from prefect import task

from hf2triton import triton_local
from hf2triton.errors import ArtifactError, DeployError, ServiceUnavailableError
from hf2triton.spec import DeploySpec
from hf2triton.workspace import hash_files
from tasks.common import NO_PREFECT_CACHE, RETRY_TRANSIENT

MODEL_LEVEL = ("config.pbtxt", "warmup")


class DeployResult(TypedDict):
    http_url: str
    grpc_url: str
    model_name: str
    version: str
    previous_versions: list[str]
    reused: bool


def _versions(model_dir: Path) -> list[str]:
    if not model_dir.is_dir():
        return []
    return sorted((p.name for p in model_dir.iterdir() if p.name.isdigit()), key=int)


def _place(src_model: Path, model_dir: Path, version: str, expected: dict[str, str]) -> None:
    """Copy the version directory and model-level files in, checking every sha256 on the way."""
    model_dir.mkdir(parents=True, exist_ok=True)
    tmp = model_dir / f".{version}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src_model / "1", tmp)
    got = {f"1/{k}": v for k, v in hash_files(tmp).items()}
    want = {k: v for k, v in expected.items() if k.startswith("1/")}
    if got != want:
        shutil.rmtree(tmp, ignore_errors=True)
        bad = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
        raise ArtifactError(
            f"model files {bad} do not match the sha256 recorded for this release: refusing to "
            "deploy them; re-run the release to rebuild the repository"
        )
    os.rename(tmp, model_dir / version)
    for name in MODEL_LEVEL:
        src, dst = src_model / name, model_dir / name
        staged = model_dir / f".{name}.new"
        if src.is_dir():
            shutil.rmtree(staged, ignore_errors=True)
            shutil.copytree(src, staged)
            shutil.rmtree(dst, ignore_errors=True)
            os.rename(staged, dst)
        else:
            shutil.copyfile(src, staged)
            os.replace(staged, dst)


def _backup(model_dir: Path) -> Path | None:
    if not (model_dir / "config.pbtxt").is_file():
        return None
    backup = model_dir.parent / f".{model_dir.name}.previous"
    shutil.rmtree(backup, ignore_errors=True)
    backup.mkdir()
    for name in MODEL_LEVEL:
        src = model_dir / name
        if src.is_dir():
            shutil.copytree(src, backup / name)
        elif src.is_file():
            shutil.copyfile(src, backup / name)
    return backup


def _restore(backup: Path | None, model_dir: Path) -> None:
    if backup is None:
        return
    for name in MODEL_LEVEL:
        src, dst = backup / name, model_dir / name
        if src.is_dir():
            shutil.rmtree(dst, ignore_errors=True)
            shutil.copytree(src, dst)
        elif src.is_file():
            shutil.copyfile(src, dst)


def _client(url: str):
    import tritonclient.http as httpclient

    return httpclient.InferenceServerClient(url=url, network_timeout=600.0)


def _wait_ready(client, name: str, version: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if client.is_model_ready(name, version):
                return True
        except Exception:  # the server may be busy loading; keep polling until the deadline
            pass
        time.sleep(0.5)
    return False


def deploy_local(
    repository: str, model_name: str, version: str, files: dict[str, str], deploy: DeploySpec,
) -> DeployResult:
    """Serve `version` of `model_name` from the local Triton server."""
    from tritonclient.utils import InferenceServerException

    state = triton_local.ensure_server(
        deploy.host, deploy.http_port, deploy.grpc_port, deploy.metrics_port,
        timeout_s=deploy.ready_timeout_s,
    )
    client = _client(state.http_url)
    model_dir = Path(state.model_repository) / model_name
    expected = {k.removeprefix(f"{model_name}/"): v for k, v in files.items()}
    previous = [v for v in _versions(model_dir) if v != version]
    result = DeployResult(http_url=state.http_url, grpc_url=state.grpc_url,
                          model_name=model_name, version=version,
                          previous_versions=previous, reused=False)
    if (model_dir / version).is_dir():
        placed = {f"1/{k}": v for k, v in hash_files(model_dir / version).items()}
        if placed == {k: v for k, v in expected.items() if k.startswith("1/")} and \
                _wait_ready(client, model_name, version, 1):
            result["reused"] = True
            return result
        shutil.rmtree(model_dir / version)

    backup = _backup(model_dir)
    _place(Path(repository) / model_name, model_dir, version, expected)
    try:
        client.load_model(model_name)
        if not _wait_ready(client, model_name, version, deploy.ready_timeout_s):
            raise DeployError(
                f"Triton loaded {model_name} but version {version} was not ready within "
                f"{deploy.ready_timeout_s:.0f}s; log: {state.log_file}"
            )
    except (InferenceServerException, DeployError, OSError) as exc:
        shutil.rmtree(model_dir / version, ignore_errors=True)
        _restore(backup, model_dir)
        if previous:
            try:
                client.load_model(model_name)  # bring back the version that served before
            except InferenceServerException:
                pass
        if isinstance(exc, OSError) and not isinstance(exc, InferenceServerException):
            raise ServiceUnavailableError(f"Triton at {state.http_url} did not answer: {exc}")
        raise DeployError(
            f"Triton refused to load {model_name} version {version}: {str(exc)[:500]}. "
            f"{'Version ' + previous[-1] + ' keeps serving. ' if previous else ''}"
            f"Server log: {state.log_file}"
        ) from None
    # Only the new version is loaded (version policy: latest 1). The one before stays on disk as
    # the rollback target; older copies go.
    for old in previous[:-1]:
        shutil.rmtree(model_dir / old, ignore_errors=True)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
    return result


deploy = task(deploy_local, name="deploy", **RETRY_TRANSIENT, **NO_PREFECT_CACHE)
