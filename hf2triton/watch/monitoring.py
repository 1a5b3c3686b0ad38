"""Prometheus, Kubernetes and Grafana files for one release, rendered from its `watch:` budgets:
a scrape config for its Triton metrics endpoints, alert rules (the watch's budgets as PromQL)
with promtool unit tests, and a Grafana dashboard (request rate, failures, latency and queue
time per version). The ServiceMonitor is a Kubernetes manifest (infra/k8s/,
hf2triton.targets.k8s)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from hf2triton.spec import ReleaseSpec
from hf2triton.targets import WatchPoint
from hf2triton.util.workspace import atomic_write_text

P99_RECORD = "hf2triton:request_p99_ms"
FAILURE_RECORD = "hf2triton:request_failure_ratio"
RATE_RECORD = "hf2triton:request_rate"


def job_name(release: str) -> str:
    return f"hf2triton-{release}"


def rate_window(spec: ReleaseSpec) -> str:
    """The range PromQL rates are taken over: a few of the watch's looks, at least a minute."""
    return f"{int(max(60, 4 * spec.watch.interval_s))}s"


def scrape_config(spec: ReleaseSpec, points: list[WatchPoint]) -> dict[str, Any]:
    """A prometheus.yml `scrape_configs` entry (and its rule file) for the release's servers."""
    targets = [p["metrics"].split("://", 1)[-1].split("/", 1)[0] for p in points]
    return {
        "global": {
            "scrape_interval": f"{int(max(1, min(15, spec.watch.interval_s)))}s",
            "evaluation_interval": f"{int(max(1, min(15, spec.watch.interval_s)))}s",
        },
        "rule_files": [f"{spec.name}-rules.yml"],
        "scrape_configs": [
            {
                "job_name": job_name(spec.name),
                "metrics_path": "/metrics",
                "static_configs": [{"targets": targets, "labels": {"release": spec.name}}],
            }
        ],
    }


def _sel(spec: ReleaseSpec, **extra: str) -> str:
    labels = {"model": spec.triton_model_name, **extra}
    return "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def failure_summary(spec: ReleaseSpec) -> str:
    return (
        f"{spec.name} version {{{{ $labels.version }}}} fails more than "
        f"{spec.watch.max_failure_rate:.2%} of its requests"
    )


def rules(spec: ReleaseSpec) -> dict[str, Any]:
    """Recording rules for the release's figures and alerts for its budgets."""
    w, budget, sel = rate_window(spec), spec.watch, _sel(spec)
    total = (
        f"(sum by (model, version) (rate(nv_inference_request_success{sel}[{w}])) + "
        f"sum by (model, version) (rate(nv_inference_request_failure{sel}[{w}])))"
    )
    records = [
        {"record": RATE_RECORD, "expr": total},
        {
            "record": FAILURE_RECORD,
            "expr": f"sum by (model, version) (rate(nv_inference_request_failure{sel}[{w}])) / "
            f"{total}",
        },
        {
            "record": P99_RECORD,
            "expr": "max by (model, version) (nv_inference_request_summary_us"
            f"{_sel(spec, quantile='0.99')}) / 1000",
        },
    ]
    labels = {"severity": "page", "release": spec.name}
    enough = f"({RATE_RECORD}{sel} * {int(w[:-1])} >= {budget.min_requests})"
    alerts = [
        {
            "alert": "Hf2TritonFailureRate",
            "expr": f"({FAILURE_RECORD}{sel} > {budget.max_failure_rate}) and on (model, version) "
            f"{enough}",
            "for": "1m",
            "labels": labels,
            "annotations": {"summary": failure_summary(spec)},
        },
        {
            "alert": "Hf2TritonDown",
            "expr": f'up{{job="{job_name(spec.name)}"}} == 0',
            "for": "1m",
            "labels": labels,
            "annotations": {
                "summary": f"{spec.name}: Triton metrics endpoint "
                "{{ $labels.instance }} does not answer"
            },
        },
    ]
    if budget.max_p99_ms:
        alerts.append(
            {
                "alert": "Hf2TritonP99Latency",
                "expr": f"({P99_RECORD}{sel} > {budget.max_p99_ms}) and on (model, version) "
                f"{enough}",
                "for": "1m",
                "labels": labels,
                "annotations": {
                    "summary": f"{spec.name} version {{{{ $labels.version }}}} p99 "
                    f"{{{{ $value }}}} ms (budget {budget.max_p99_ms} ms)"
                },
            }
        )
    return {"groups": [{"name": f"hf2triton-{spec.name}", "rules": records + alerts}]}


def rule_tests(spec: ReleaseSpec) -> dict[str, Any]:
    """promtool unit tests of the rules: a version failing twice its budget pages, one within
    it does not, and the p99 record reads Triton's summary."""
    model, w = spec.triton_model_name, int(rate_window(spec)[:-1])
    mins = max(10, 2 * w // 60 + 4)
    alert_labels = {"severity": "page", "release": spec.name, "model": model, "version": "2"}
    summary = failure_summary(spec).replace("{{ $labels.version }}", "2")
    return {
        "rule_files": [f"{spec.name}-rules.yml"],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": _input_series(model, spec.watch.max_failure_rate, mins),
                "alert_rule_test": [
                    {
                        "eval_time": f"{mins - 1}m",
                        "alertname": "Hf2TritonFailureRate",
                        "exp_alerts": [
                            {"exp_labels": alert_labels, "exp_annotations": {"summary": summary}}
                        ],
                    }
                ],
                "promql_expr_test": [
                    {
                        "expr": f'{P99_RECORD}{{model="{model}"}}',
                        "eval_time": f"{mins - 1}m",
                        "exp_samples": [
                            {"labels": f'{P99_RECORD}{{model="{model}",version="2"}}', "value": 12}
                        ],
                    }
                ],
            }
        ],
    }


def _input_series(model: str, max_failure_rate: float, mins: int) -> list[dict[str, str]]:
    """`mins` minutes of Triton's counters: 600 requests a minute, version 2 failing at twice
    the budget and version 1 at half of it; and a p99 of 12 ms for version 2."""
    bad = max(1, round(600 * min(1.0, 2 * max_failure_rate)))
    fine = int(600 * max_failure_rate / 2)

    def series(name: str, version: str, step: int, **labels: str) -> dict[str, str]:
        lab = ",".join(
            f'{k}="{v}"' for k, v in {"model": model, "version": version, **labels}.items()
        )
        return {"series": f"{name}{{{lab}}}", "values": f"0+{step}x{mins}"}

    return [
        series("nv_inference_request_success", "2", 600 - bad),
        series("nv_inference_request_failure", "2", bad, reason="BACKEND"),
        series("nv_inference_request_success", "1", 600 - fine),
        series("nv_inference_request_failure", "1", fine, reason="BACKEND"),
        {
            "series": f'nv_inference_request_summary_us{{model="{model}",version="2",'
            'quantile="0.99"}',
            "values": f"12000x{mins}",
        },
    ]


def dashboard(spec: ReleaseSpec) -> dict[str, Any]:
    """A Grafana dashboard of the release's Triton figures, one line per version."""
    sel, w = _sel(spec), rate_window(spec)

    def panel(i: int, title: str, expr: str, unit: str) -> dict[str, Any]:
        return {
            "id": i + 1,
            "type": "timeseries",
            "title": title,
            "datasource": "${datasource}",
            "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": 8 * (i // 2)},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": "A", "expr": expr, "legendFormat": "version {{version}}"}],
        }

    panels = [
        ("Requests per second", f"{RATE_RECORD}{sel}", "reqps"),
        ("Failed requests (share)", f"{FAILURE_RECORD}{sel}", "percentunit"),
        ("Request latency p50 / p99 (ms)", f"{P99_RECORD}{sel}", "ms"),
        (
            "Queue time per request (ms)",
            (
                f"sum by (version) (rate(nv_inference_queue_duration_us{sel}[{w}])) / "
                f"sum by (version) (rate(nv_inference_request_success{sel}[{w}])) / 1000"
            ),
            "ms",
        ),
    ]
    out = [panel(i, *p) for i, p in enumerate(panels)]
    out[2]["targets"].append(
        {
            "refId": "B",
            "legendFormat": "p50 version {{version}}",
            "expr": "max by (version) (nv_inference_request_summary_us"
            f"{_sel(spec, quantile='0.5')}) / 1000",
        }
    )
    return {
        "title": f"hf2triton {spec.name}",
        "uid": f"hf2triton-{spec.name}"[:40],
        "tags": ["hf2triton", spec.name],
        "schemaVersion": 39,
        "time": {"from": "now-1h", "to": "now"},
        "templating": {
            "list": [{"name": "datasource", "type": "datasource", "query": "prometheus"}]
        },
        "panels": out,
    }


def write(spec: ReleaseSpec, points: list[WatchPoint], out_dir: Path) -> dict[str, str]:
    """Write the release's monitoring files into `out_dir`; returns {what: path}."""
    files = {
        "prometheus": (f"{spec.name}-prometheus.yml", scrape_config(spec, points)),
        "rules": (f"{spec.name}-rules.yml", rules(spec)),
        "rule_tests": (f"{spec.name}-rules-test.yml", rule_tests(spec)),
        "dashboard": (f"{spec.name}-grafana.json", dashboard(spec)),
    }
    out = {}
    for what, (name, data) in files.items():
        text = (
            json.dumps(data, indent=1)
            if name.endswith(".json")
            else yaml.safe_dump(data, sort_keys=False, width=1000)
        )
        atomic_write_text(out_dir / name, text)
        out[what] = str(out_dir / name)
    return out
