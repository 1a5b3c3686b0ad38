"""One look of the watch and its loop: each endpoint's figures judged against the `watch:`
budgets, a breach acted on only once it is confirmed, and the state `hf2triton status` reads.
(Looks at a real Triton under traffic are tests/watch/test_watch.py's.)"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from hf2triton.spec import load_spec
from hf2triton.targets import WatchPoint
from hf2triton.util.net import free_port
from hf2triton.watch import registry as reg
from hf2triton.watch.observe import Look, look, read_state, watch
from tests.conftest import new_ports, write_spec
from tests.watch.test_registry import _model


def test_budgets_judge_each_figure():
    from hf2triton.spec.watch import WatchSpec
    from hf2triton.watch.observe import judge, p99_limit

    budget = WatchSpec(
        max_failure_rate=0.01,
        max_p99_ms=100,
        max_p99_vs_previous=2,
        p99_slack_ms=5,
        min_requests=20,
        smoke_floors={"grpc_min_cosine": 0.99},
    )
    row = {
        "endpoint": "e",
        "version": "2",
        "requests": 100,
        "failed": 0,
        "failure_rate": 0.0,
        "p99_ms": 30.0,
        "grpc_min_cosine": 0.995,
    }
    assert judge(row, budget, {"p99_ms": 20.0}) == []
    assert p99_limit(budget, {"p99_ms": 20.0}) == 40.0  # twice the previous champion's
    assert p99_limit(budget, {"p99_ms": 1.0}) == 6.0  # never closer to it than the slack
    assert p99_limit(budget, None) == 100  # unknown: the absolute budget alone
    slow = judge({**row, "p99_ms": 45.0}, budget, {"p99_ms": 20.0})
    assert len(slow) == 1 and "p99 45.0 ms over the budget 40.0 ms" in slow[0]
    failing = judge({**row, "failed": 5, "failure_rate": 0.05}, budget, None)
    assert len(failing) == 1 and "failure rate 5.00% (5 of 100 requests)" in failing[0]
    few = {**row, "requests": 10, "failed": 5, "failure_rate": 0.5, "p99_ms": 900.0}
    assert judge(few, budget, None) == []  # too few requests to judge rate or latency
    assert "below the floor 0.99" in judge({**row, "grpc_min_cosine": 0.95}, budget, None)[0]
    assert "smoke probe failed" in judge({**row, "probe_error": "refused"}, budget, None)[0]


def _spec(tmp_path, name: str, **watch):
    ports = {f"deploy__{k}": v for k, v in new_ports().items()}  # no server runs there
    budgets = {f"watch__{k}": v for k, v in watch.items()}
    return load_spec(
        write_spec(
            tmp_path / f"{name}.yaml", name=name, registry__model_name=name, **ports, **budgets
        )
    )


def _silent_point() -> WatchPoint:
    port = free_port()  # nothing answers there
    return WatchPoint(
        name="gone",
        http=f"127.0.0.1:{port}",
        grpc=f"127.0.0.1:{port}",
        metrics=f"http://127.0.0.1:{port}/metrics",
    )


def test_nothing_released_nothing_read(registry_home, tmp_path):
    spec = _spec(tmp_path, "nothing-yet")
    seen = look(spec, [_silent_point()])
    assert seen["champion"] is None and seen["rows"] == [] and seen["breaches"] == []
    assert not seen["in_window"] and not seen["confirmed"]
    assert read_state("nothing-yet")["last"]["release"] == "nothing-yet"


def test_an_endpoint_that_does_not_answer_is_a_breach_confirmed_after_enough_looks(
    registry_home, tmp_path
):
    spec = _spec(tmp_path, "silent", confirm_looks=2, window_s=3600)
    client = _model("silent", 2)
    reg.promote(client, "silent", "1", {})
    reg.promote(client, "silent", "2", {})
    first = look(spec, [_silent_point()], probe=False)
    assert (first["champion"], first["previous"]) == ("2", "1")
    assert first["in_window"]  # promoted just now, never restored
    ((row),) = first["rows"]
    assert row["endpoint"] == "gone" and row["version"] == "2" and row["probe_error"]
    assert (
        len(first["breaches"]) == 1 and "gone version 2: smoke probe failed" in first["breaches"][0]
    )
    assert (first["streak"], first["confirmed"]) == (1, False)  # one look is not a regression
    second = look(spec, [_silent_point()], probe=False)
    assert (second["streak"], second["confirmed"]) == (2, True)
    assert read_state("silent")["last"]["streak"] == 2  # what `hf2triton status` shows
    # After a rollback the restored champion is out of the window: a person decides.
    reg.mark_rolled_back(client, "silent", "2", "1", "watch")
    after = look(spec, [], probe=False)
    assert after["champion"] == "1" and not after["in_window"]
    assert (after["streak"], after["confirmed"]) == (0, False)


def _looks(*plan: tuple[list[str], bool]):
    """A look_once returning looks with these (breaches, confirmed), then clean ones."""
    queue = list(plan)

    def look_once(spec) -> Look:
        breaches, confirmed = queue.pop(0) if queue else ([], False)
        return Look(
            release="r",
            model="m",
            champion="2",
            candidate=None,
            previous="1",
            at=0.0,
            in_window=True,
            streak=1 if breaches else 0,
            confirmed=confirmed,
            rows=[],
            breaches=breaches,
        )

    return look_once


SPEC = SimpleNamespace(name="r", watch=SimpleNamespace(interval_s=0.01, confirm_looks=2))


def test_watch_looks_again_until_a_breach_is_confirmed_then_acts_once():
    acted: list[Look] = []

    def act(seen: Look) -> dict:
        acted.append(seen)
        return {"rolled_back": True}

    seen = watch(SPEC, 0, _looks((["slow"], False), (["slow"], True)), act)
    # Unsure, confirmed (acted on), then one more look showing what serves after the rollback.
    assert [s["confirmed"] for s in seen] == [False, True, False]
    assert len(acted) == 1 and acted[0]["breaches"] == ["slow"]


def test_watch_without_a_breach_looks_once_for_no_duration():
    acted: list[Look] = []
    seen = watch(SPEC, 0, _looks(), lambda s: acted.append(s) or None)
    assert len(seen) == 1 and acted == []


@pytest.mark.parametrize("result", [None, {"rolled_back": False}])
def test_a_breach_not_rolled_back_ends_the_watch_at_its_duration(result):
    acted: list[Look] = []

    def act(seen: Look):
        acted.append(seen)
        return result

    seen = watch(SPEC, 0, _looks((["slow"], True)), act)
    assert len(seen) == 1 and len(acted) == 1
