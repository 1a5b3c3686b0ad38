"""Watch what serves (issue #22): Triton's metrics and the gate's smoke items judged against the
spec's `watch:` budgets, the rollback to the previous champion, and the Prometheus, Kubernetes
and Grafana files rendered from the same budgets. See docs/watch.md."""
