"""Collecting hard examples at the hub: rules (pure), configuration, the collector, metrics."""

__all__: list[str] = []  # its modules are the hub's own; the package exports nothing
