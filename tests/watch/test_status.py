"""`hf2triton status`: the releases a home has run, one release's champion, candidate, what each
endpoint serves (or that it does not answer) and the watch's last verdict, as the table and the
full description a user reads."""

from __future__ import annotations

import json
import time

import pytest

from hf2triton.spec import load_spec
from hf2triton.watch import registry as reg
from hf2triton.watch.observe import state_path
from hf2triton.watch.status import (
    COLUMNS,
    describe,
    local_time,
    remember,
    remembered,
    row,
    status,
    table,
)
from tests.conftest import new_ports, write_spec
from tests.watch.test_registry import _model


def _spec(tmp_path, name: str):
    ports = {f"deploy__{k}": v for k, v in new_ports().items()}  # nothing listens there
    return load_spec(
        write_spec(tmp_path / f"{name}.yaml", name=name, registry__model_name=name, **ports)
    )


def test_remembered_lists_every_release_run_in_this_home(registry_home, tmp_path):
    assert remembered() == []
    for name in ("b-release", "a-release"):
        remember(_spec(tmp_path, name))
    (registry_home / "releases" / "broken.json").write_text("{not json")
    found = remembered()
    assert [f["name"] for f in found] == ["a-release", "b-release"]  # the broken one skipped
    assert found[0]["registry"]["model_name"] == "a-release"


def test_status_of_a_release_whose_server_does_not_answer(registry_home, tmp_path):
    spec = _spec(tmp_path, "quiet-release")
    client = _model("quiet-release", 2)
    reg.promote(client, "quiet-release", "1", {})
    reg.promote(client, "quiet-release", "2", {})
    found = status(spec)
    assert (found["champion"], found["previous"], found["candidate"]) == ("2", "1", None)
    assert found["restored_from"] is None and found["watch"] is None
    ((where, serving),) = found["serving"].items()
    assert f"127.0.0.1:{spec.deploy.http_port}" in where
    assert serving.startswith("not answering (")
    assert row(found)[:3] == ["quiet-release", "2", "-"]
    assert row(found)[4:] == ["not watched yet", "-"]
    text = describe(found)
    assert "champion:   2, replaced 1" in text and "watch:      not watched yet" in text


def test_status_shows_the_watchs_last_look_and_a_restored_champion(registry_home, tmp_path):
    spec = _spec(tmp_path, "watched-release")
    client = _model("watched-release", 2)
    reg.promote(client, "watched-release", "1", {})
    reg.promote(client, "watched-release", "2", {})
    reg.mark_rolled_back(client, "watched-release", "2", "1", "watch: p99")
    at = time.time()
    figures = {"endpoint": "local", "version": "1", "requests": 40, "p99_ms": 8.5}
    last = {"at": at, "champion": "1", "in_window": False, "rows": [figures], "breaches": []}
    state_path(spec.name).parent.mkdir(parents=True, exist_ok=True)
    state_path(spec.name).write_text(json.dumps({"last": last}))
    found = status(spec)
    assert found["champion"] == "1" and found["restored_from"] == "2"
    assert found["watch"]["rows"] == [figures]
    assert row(found)[4:] == ["ok (v1)", local_time(at)]
    text = describe(found)
    assert "champion:   1 (restored from 2)" in text
    assert "            v1 on local: requests 40, p99_ms 8.5" in text


def test_the_table_lines_up_its_columns_and_says_what_serves():
    found = {
        "release": "minilm-embedder",
        "champion": "3",
        "candidate": None,
        "serving": {"local Triton 127.0.0.1:8000": ["2", "3"], "replica-2": "not answering (X)"},
        "watch": {
            "at": None,
            "champion": "3",
            "breaches": ["local version 3: p99 90.0 ms over the budget 50.0 ms", "another"],
        },
    }
    cells = row(found)
    assert cells[3] == "v2,v3 on local Triton 127.0.0.1:8000; not answering (X) on replica-2"
    assert cells[4] == "breach: local version 3: p99 90.0 ms over the budget 50.0 ms (+1)"
    lines = table([cells, ["tiny", "1", "-", "nothing on x", "ok (v1)", "-"]]).splitlines()
    assert lines[0].split() == [
        "RELEASE",
        "CHAMPION",
        "CANDIDATE",
        "SERVING",
        "WATCH",
        "LAST",
        "LOOK",
    ]
    # Every column starts where its header does.
    for header in COLUMNS[1:]:
        col = lines[0].index(header)
        assert lines[1][col - 2 : col] == "  " and lines[1][col] != " "
    assert lines[2].startswith("tiny ")


@pytest.mark.parametrize("epoch, shown", [(None, "-"), (0, "-")])
def test_local_time_of_nothing(epoch, shown):
    assert local_time(epoch) == shown


def test_local_time_is_this_machines():
    assert local_time(86400.0 * 365) == time.strftime(
        "%Y-%m-%d %H:%M:%S", time.localtime(86400.0 * 365)
    )


def test_status_of_a_name_no_release_has_lists_the_ones_it_knows(registry_home, tmp_path):
    """`hf2triton status NAME` where NAME is no file, no releases/NAME.yaml and no release of
    this home: one line naming the releases it does know."""
    import os
    import subprocess

    from tests.conftest import ROOT

    remember(_spec(tmp_path, "known-release"))
    proc = subprocess.run(
        [str(ROOT / ".venv" / "bin" / "hf2triton"), "status", "no-such-release"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HF2TRITON_HOME": str(registry_home)},
    )
    assert proc.returncode == 2
    line = proc.stderr.strip()
    assert line.startswith("hf2triton: error: 'no-such-release' is no spec file"), line
    assert "(known-release)" in line and "`hf2triton status` lists them" in line
