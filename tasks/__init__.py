"""One module per pipeline step; each step is a typed function wrapped as a Prefect task."""
