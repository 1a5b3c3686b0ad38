"""Small utilities every layer shares: the work folder and its artifacts, plug-in registries,
the spec sections' building blocks, waiting, ports, logging and CPU facts."""
