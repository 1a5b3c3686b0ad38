"""Prefect glue: the deployments rendered from the specs, what the CLI asks the Prefect API,
and the per-release lock that keeps two runs of one release apart."""
