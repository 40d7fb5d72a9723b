"""Triton's statistics extension: what the hub counted, in Triton's JSON.

``GET /v2/models[/{name}[/versions/{v}]]/stats`` answers
``{"model_stats": [model_stats(counts), ...]}``, one entry per served model
version, each shaped as Triton's::

    {"name", "version", "last_inference" (ms since the epoch, 0: none yet),
     "inference_count" (rows), "execution_count" (batches),
     "inference_stats": {"success", "fail", "queue",
                         "compute_input", "compute_infer", "compute_output"},
     "batch_stats": [{"batch_size", "compute_input", "compute_infer", "compute_output"}]}

where every statistic is ``{"count", "ns"}`` (cumulative nanoseconds). What
differs from Triton, because the hub does not measure it: ``fail.ns`` is 0
(no duration is kept for failed requests); the hub times a batch's compute
as one span (stacking the inputs, running, splitting the outputs), all of it
in ``compute_infer``, so ``compute_input`` and ``compute_output`` carry the
same counts with ``ns`` 0. ``success`` counts the requests the transports
answered (HTTP and MQTT), not those submitted in process.
"""

from __future__ import annotations

from typing import Any

from ..metrics import ModelCounts

__all__ = ["model_stats"]


def _stat(count: int, us: float) -> dict[str, int]:
    return {"count": int(count), "ns": round(1000.0 * us)}


def model_stats(counts: ModelCounts) -> dict[str, Any]:
    """One entry of ``model_stats`` in Triton's statistics JSON."""
    untimed = _stat(counts.compute, 0.0)
    return {
        "name": counts.model,
        "version": counts.version,
        "last_inference": counts.last_inference_ms,
        "inference_count": counts.inference_count,
        "execution_count": counts.execution_count,
        "inference_stats": {
            "success": _stat(counts.success, counts.success_us),
            "fail": _stat(counts.failure, 0.0),
            "queue": _stat(counts.queue, counts.queue_us),
            "compute_input": untimed,
            "compute_infer": _stat(counts.compute, counts.compute_us),
            "compute_output": untimed,
        },
        "batch_stats": [
            {
                "batch_size": size,
                "compute_input": _stat(n, 0.0),
                "compute_infer": _stat(n, us),
                "compute_output": _stat(n, 0.0),
            }
            for size, (n, us) in sorted(counts.batches.items())
        ],
    }
