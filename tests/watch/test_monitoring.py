"""The Prometheus, Grafana and alert files rendered from a release's `watch:` budgets: the scrape
config names the release's metrics endpoints, the alert rules hold its budgets, the promtool tests
expect what the budgets say, the dashboard draws per version. (promtool itself runs them in
tests/watch/test_watch.py.)"""

from __future__ import annotations

import json

import yaml

from hf2triton.spec import load_spec
from hf2triton.targets import WatchPoint
from hf2triton.watch.monitoring import (
    FAILURE_RECORD,
    P99_RECORD,
    dashboard,
    rate_window,
    rule_tests,
    rules,
    scrape_config,
    write,
)
from tests.conftest import write_spec

POINTS = [
    WatchPoint(name="a", http="h1:8000", grpc="h1:8001", metrics="http://h1:8002/metrics"),
    WatchPoint(name="b", http="h2:8000", grpc="h2:8001", metrics="http://h2:9102/metrics"),
]


def _spec(tmp_path, **watch):
    overrides = {f"watch__{k}": v for k, v in watch.items()}
    return load_spec(write_spec(tmp_path / "spec.yaml", name="tiny", **overrides))


def test_scrape_config_reads_every_endpoint_of_the_release(tmp_path):
    spec = _spec(tmp_path, interval_s=5)
    config = scrape_config(spec, POINTS)
    job = config["scrape_configs"][0]
    assert job["job_name"] == "hf2triton-tiny"
    assert job["static_configs"] == [
        {"targets": ["h1:8002", "h2:9102"], "labels": {"release": "tiny"}}
    ]
    assert config["global"]["scrape_interval"] == "5s"
    assert config["rule_files"] == ["tiny-rules.yml"]
    assert (
        scrape_config(_spec(tmp_path, interval_s=600), POINTS)["global"]["scrape_interval"] == "15s"
    )


def _alerts(spec) -> dict[str, dict]:
    return {r["alert"]: r for r in rules(spec)["groups"][0]["rules"] if "alert" in r}


def test_alert_rules_hold_the_budgets(tmp_path):
    spec = _spec(tmp_path, max_failure_rate=0.02, min_requests=30, interval_s=30, max_p99_ms=250)
    assert rate_window(spec) == "120s"
    alerts = _alerts(spec)
    assert set(alerts) == {"Hf2TritonFailureRate", "Hf2TritonDown", "Hf2TritonP99Latency"}
    failure = alerts["Hf2TritonFailureRate"]["expr"]
    assert f'{FAILURE_RECORD}{{model="{spec.triton_model_name}"}} > 0.02' in failure
    assert "* 120 >= 30" in failure  # too few requests in the window: no page
    assert f"{P99_RECORD}" in alerts["Hf2TritonP99Latency"]["expr"]
    assert "> 250" in alerts["Hf2TritonP99Latency"]["expr"]
    assert alerts["Hf2TritonDown"]["expr"] == 'up{job="hf2triton-tiny"} == 0'
    assert all(a["labels"] == {"severity": "page", "release": "tiny"} for a in alerts.values())
    # No p99 budget: no p99 alert.
    assert "Hf2TritonP99Latency" not in _alerts(_spec(tmp_path, max_p99_ms=None))


def test_rule_tests_expect_a_page_for_twice_the_budget_only(tmp_path):
    spec = _spec(tmp_path, max_failure_rate=0.05)
    test = rule_tests(spec)["tests"][0]
    series = {s["series"]: s["values"] for s in test["input_series"]}
    model = spec.triton_model_name
    bad = f'nv_inference_request_failure{{model="{model}",version="2",reason="BACKEND"}}'
    fine = f'nv_inference_request_failure{{model="{model}",version="1",reason="BACKEND"}}'
    assert series[bad].startswith("0+60x")  # 10% of 600 a minute
    assert series[fine].startswith("0+15x")  # 2.5%
    (expected,) = test["alert_rule_test"][0]["exp_alerts"]
    assert expected["exp_labels"]["version"] == "2"
    assert "fails more than 5.00% of its requests" in expected["exp_annotations"]["summary"]


def test_dashboard_draws_each_figure_per_version(tmp_path):
    board = dashboard(_spec(tmp_path))
    assert board["uid"] == "hf2triton-tiny"
    titles = [p["title"] for p in board["panels"]]
    assert titles == [
        "Requests per second",
        "Failed requests (share)",
        "Request latency p50 / p99 (ms)",
        "Queue time per request (ms)",
    ]
    assert all("version" in t["legendFormat"] for p in board["panels"] for t in p["targets"])


def test_write_puts_the_four_files_in_the_folder(tmp_path):
    spec = _spec(tmp_path)
    out = write(spec, POINTS, tmp_path / "monitoring")
    assert sorted(out) == ["dashboard", "prometheus", "rule_tests", "rules"]
    assert json.loads(open(out["dashboard"]).read()) == dashboard(spec)
    for what in ("prometheus", "rules", "rule_tests"):
        assert out[what].endswith(".yml")
        assert yaml.safe_load(open(out[what]).read())  # parses back
    assert yaml.safe_load(open(out["rules"]).read()) == rules(spec)
