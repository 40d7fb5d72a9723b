"""(c) The GPU entry: part c's executor sweep and hub MQTT rows on CUDA, or why not.

``cuda_environment`` says whether this machine can run it: ONNX Runtime must
offer ``CUDAExecutionProvider`` and ``nvidia-smi`` must list a GPU. Then it
records the GPU's model, driver and memory and the onnxruntime(-gpu)
version; otherwise ``{"skipped": "no CUDA: why"}``, which the report prints
as such (never a figure).

``gpu_entry`` then times each model's ``OnnxExecutor`` on ``cuda:0`` alone
(batch sizes up to ``_GPU_SWEEP[-1]``: a GPU's best batch is larger than a
CPU's) and runs a hub with ``--device cuda`` (its default ingress: one MQTT
process per core) over MQTT at ``_GPU_CONCURRENCY`` requesters, measured as
part c measures the CPU rows.
"""

from __future__ import annotations

import shutil
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np

from ._hub_throughput_measure import SWEEP, Variant, executor_sweep, hub_counts, measure
from ._load_mqtt import CrtMqttLoad
from ._procs import BrokerProcess, HubProcess, hub_processes, write_model

__all__ = ["cuda_environment", "gpu_entry"]

_GPU_SWEEP = (*SWEEP, 512, 1024)
_GPU_CONCURRENCY = (64, 256)
_GPU_LOAD_CLIENTS = 8


def cuda_environment() -> dict[str, Any]:
    """The GPU, driver and ONNX Runtime build, or ``{"skipped": ...}`` saying what is missing."""
    import onnxruntime as ort

    providers = ort.get_available_providers()
    if "CUDAExecutionProvider" not in providers:
        return {"skipped": f"no CUDA: onnxruntime offers {', '.join(providers)}"}
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return {"skipped": "no CUDA: nvidia-smi is not installed"}
    query = "--query-gpu=name,driver_version,memory.total"
    try:
        done = subprocess.run(
            [exe, query, "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
    except (OSError, subprocess.SubprocessError) as e:
        return {"skipped": f"no CUDA: nvidia-smi failed ({e})"}
    gpus = [line.split(", ") for line in done.stdout.strip().splitlines() if line.strip()]
    if not gpus:
        return {"skipped": "no CUDA: nvidia-smi lists no GPU"}
    name, driver, memory = (gpus[0] + ["", "", ""])[:3]
    return {
        "gpu": name,
        "driver": driver,
        "gpu_memory": memory,
        "gpus": len(gpus),
        "onnxruntime": ort.__version__,
        "onnxruntime_gpu": _version("onnxruntime-gpu"),
        "providers": providers,
    }


def gpu_entry(
    models: dict[str, Path],
    input_name: str,
    image: np.ndarray,
    work: Path,
    *,
    rounds: int,
    repeats: int,
    window_s: float,
    warm_s: float,
    hub_config: dict[str, Any],
    device: str = "cuda",
    environment: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The entry's result: the environment, then sweeps and hub points, or ``skipped``.

    ``device`` and ``environment`` exist to rehearse the entry on a machine without a
    GPU (``device="cpu"``); the part itself always runs it on CUDA.
    """
    from cloud_hub import OnnxExecutor

    environment = cuda_environment() if environment is None else environment
    if "skipped" in environment:
        return environment
    sweeps: dict[str, dict[int, list[float]]] = {}
    devices: dict[str, str] = {}
    for name, path in models.items():
        executor = OnnxExecutor(path, device=f"{device}:0" if device == "cuda" else device)
        try:
            devices[name] = executor.device
            if device == "cuda" and not executor.device.startswith(("CUDA", "Tensorrt")):
                return {**environment, "skipped": f"no CUDA: ONNX Runtime ran {name} on "
                        f"{executor.device} (the CUDA provider did not load)"}  # fmt: skip
            sweeps[name] = executor_sweep(executor, input_name, rounds, _GPU_SWEEP)[0]
        finally:
            executor.close()
    repo = work / "gpu" / "repo"
    for name, path in models.items():
        write_model(repo, name, path, hub_config)
    feed = {input_name: image}
    with (
        BrokerProcess(work / "gpu").start() as broker,
        HubProcess(repo, broker.url, work / "gpu", args=["--device", device]).start() as hub,
    ):
        load = CrtMqttLoad(broker.url, clients=_GPU_LOAD_CLIENTS, name="bench-gpu-load")
        try:
            variants = {
                f"gpu_hub_{name}": Variant(
                    run=lambda n, m=name: load.run(m, feed, n, warm_s, window_s),
                    concurrency=_GPU_CONCURRENCY,
                    processes=lambda: hub_processes(hub.pid),
                    broker=broker.pid,
                    counter=lambda m=name: hub_counts(hub.http_port, m),
                )
                for name in models
            }
            points = measure(variants, repeats)
        finally:
            load.close()
    return {
        **environment,
        "executor_devices": devices,
        "sweeps": {m: {str(b): v for b, v in s.items()} for m, s in sweeps.items()},
        "points": points,
        "load_clients": _GPU_LOAD_CLIENTS,
    }


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
