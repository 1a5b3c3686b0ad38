"""Prefect flows: orchestration only; the steps live in `tasks/`."""
