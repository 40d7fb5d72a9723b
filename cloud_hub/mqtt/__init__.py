"""The hub's MQTT side: the awscrt session, the front that answers requests, pure wire helpers."""

__all__: list[str] = []  # its modules are the hub's own; the package exports nothing
