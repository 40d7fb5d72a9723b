"""Tandem's benchmarks: each part measures one claim of the issue against its target.

Run all with ``make bench`` (``python -m bench``) or one with
``python -m bench <part>``. A part writes ``bench/results/<part>.json``
(figures, targets, hardware) and its plots; the report step renders
``BENCHMARKS.md`` from every JSON file present, so parts run on different
days or machines still land in one document, each with its own hardware line.
"""

__all__: list[str] = []
