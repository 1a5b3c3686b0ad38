"""What hf2triton asks of the Prefect API, without a server: the settings every command runs with,
the database check that turns an unusable one into one line with the fix, and the automation that
marks dead runs Crashed. (A real server's part is tests/orchestration/test_prefect.py's.)"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from prefect.settings import PREFECT_API_DATABASE_CONNECTION_URL, temporary_settings

from hf2triton.errors import EnvironmentSetupError
from hf2triton.orchestration.deployments import RUN_TAG
from hf2triton.orchestration.prefect_api import (
    DEAD_RUN_AUTOMATION,
    MISSED_HEARTBEATS,
    STARTUP_TIMEOUT_S,
    check_database,
    dead_run_automation,
    set_process_defaults,
)

DEFAULTS = ("PREFECT_SERVER_ANALYTICS_ENABLED", "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")


def test_process_defaults_fill_in_what_the_user_did_not_set(monkeypatch):
    for name in (*DEFAULTS, "DO_NOT_TRACK"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "30")
    set_process_defaults()
    assert os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false"
    assert os.environ["DO_NOT_TRACK"] == "1"
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == "30"  # the user's
    monkeypatch.delenv("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS")
    set_process_defaults()
    assert os.environ["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] == STARTUP_TIMEOUT_S


def test_a_database_that_cannot_be_opened_is_one_line_with_the_fix(tmp_path):
    folder = tmp_path / "prefect.db"
    folder.mkdir()  # a folder where the database file should be
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: f"sqlite+aiosqlite:///{folder}"}):
        with pytest.raises(EnvironmentSetupError) as info:
            check_database()
    msg = str(info.value)
    assert f"cannot use its database {folder}" in msg
    assert "PREFECT_API_URL" in msg and "HF2TRITON_HOME" in msg
    assert info.value.exit_code == 3 and not info.value.retryable


def test_a_writable_database_passes(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path / 'prefect.db'}"
    with temporary_settings({PREFECT_API_DATABASE_CONNECTION_URL: url}):
        check_database()
    assert (tmp_path / "prefect.db").is_file()


def test_the_dead_run_automation_crashes_hf2triton_runs_after_missed_heartbeats():
    automation = dead_run_automation(heartbeat_s=60)
    assert automation.name == DEAD_RUN_AUTOMATION
    trigger = automation.trigger
    assert trigger.within == timedelta(seconds=MISSED_HEARTBEATS * 60)
    assert trigger.posture == "Proactive"
    assert trigger.match_related.root == {
        "prefect.resource.role": "tag",
        "prefect.resource.id": f"prefect.tag.{RUN_TAG}",
    }
    assert "prefect.flow-run.Completed" in trigger.expect
    (action,) = automation.actions
    assert action.state == "CRASHED"
    assert "Run the release again" in action.message
    assert dead_run_automation(300).trigger.within == timedelta(seconds=900)
