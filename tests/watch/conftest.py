"""The watch's tests without a server: a private hf2triton home per test whose MLflow store (SQLite)
is a copy of one made once per session (making one takes seconds: MLflow migrates it)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def _mlflow_template(tmp_path_factory) -> Path:
    from hf2triton.clients.mlflow import Registry

    home = tmp_path_factory.mktemp("mlflow-template")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF2TRITON_HOME", str(home))
        mp.delenv("MLFLOW_TRACKING_URI", raising=False)
        Registry().client.search_registered_models()  # creates and migrates the store
    return home / "mlflow.db"


@pytest.fixture()
def registry_home(tmp_path, monkeypatch, _mlflow_template) -> Path:
    """A private hf2triton home for one test, its MLflow store empty and ready."""
    home = tmp_path / "hf2triton-home"
    home.mkdir()
    shutil.copyfile(_mlflow_template, home / "mlflow.db")
    monkeypatch.setenv("HF2TRITON_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    return home
