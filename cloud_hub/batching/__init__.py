"""The dynamic batcher: its pure queue logic, the in-process batcher thread, its counters."""

__all__: list[str] = []  # its modules are the hub's own; the package exports nothing
