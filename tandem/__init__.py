"""Tandem front door: the `tandem` CLI and the demo's orchestration."""

__all__: list[str] = []
