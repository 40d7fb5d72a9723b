"""The model repository: Triton-like directories, model configuration, models pulled
from the CDN."""

__all__: list[str] = []  # its modules are the hub's own; the package exports nothing
