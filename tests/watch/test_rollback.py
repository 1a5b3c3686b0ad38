"""Rolling back to an earlier champion (`hf2triton rollback`, the watch): what is refused, what is
a no-op, and that a rollback that cannot be done leaves the champion where it was. (The rollback
that serves the old version again, under traffic, is tests/watch/test_watch.py's.)"""

from __future__ import annotations

import pytest

from hf2triton.errors import DeployError
from hf2triton.spec import load_spec
from hf2triton.watch import registry as reg
from hf2triton.watch.rollback import checker, roll_back
from tests.conftest import new_ports, write_spec
from tests.watch.test_registry import _model


def _spec(tmp_path, name: str):
    ports = {f"deploy__{k}": v for k, v in new_ports().items()}  # no server runs there
    return load_spec(
        write_spec(tmp_path / f"{name}.yaml", name=name, registry__model_name=name, **ports)
    )


def test_nothing_released_nothing_to_roll_back(registry_home, tmp_path):
    with pytest.raises(DeployError, match="has no champion to roll back from"):
        roll_back(_spec(tmp_path, "unreleased"), "by hand")


def test_a_first_champion_needs_the_version_to_go_back_to(registry_home, tmp_path):
    client = _model("first", 1)
    reg.promote(client, "first", "1", {})
    with pytest.raises(DeployError, match="replaced no earlier champion: give the version"):
        roll_back(_spec(tmp_path, "first"), "by hand")


def test_what_is_no_rollback(registry_home, tmp_path):
    client = _model("twice", 2)
    reg.promote(client, "twice", "1", {})
    reg.promote(client, "twice", "2", {})
    spec = _spec(tmp_path, "twice")
    # The watch and the automation answering its event may both ask: the second finds it done.
    moved = roll_back(spec, "watch: breach", only_if_champion="1")
    assert moved == {
        "rolled_back": False,
        "champion": "2",
        "why": "version 1 is no longer champion",
    }
    same = roll_back(spec, "by hand", to="2")
    assert same["rolled_back"] is False and same["why"] == "2 is champion already"


def test_a_version_without_a_smoke_reference_is_not_served_again(registry_home, tmp_path):
    client = _model("unchecked", 2)
    reg.promote(client, "unchecked", "1", {})
    reg.promote(client, "unchecked", "2", {})
    spec = _spec(tmp_path, "unchecked")
    with pytest.raises(DeployError, match="version 1 has no recorded smoke reference"):
        checker(spec, client, "1")
    with pytest.raises(DeployError):
        roll_back(spec, "by hand")
    assert reg.versions(client, "unchecked")["champion"] == "2"  # nothing changed


def test_no_server_no_rollback_and_the_champion_stays(registry_home, tmp_path):
    reference = {"items": [], "limits": {}}
    client = _model("serverless", 2, reference)
    reg.promote(client, "serverless", "1", {})
    reg.promote(client, "serverless", "2", {})
    with pytest.raises(DeployError, match="no local Triton server runs"):
        roll_back(_spec(tmp_path, "serverless"), "by hand")
    now = reg.versions(client, "serverless")
    assert now["champion"] == "2" and reg.ROLLED_BACK not in client.version("serverless", "2").tags
