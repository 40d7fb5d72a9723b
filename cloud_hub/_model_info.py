"""What a hub serves of one model: name, version, tensors, batch size, device.

An executor describes itself with one (sent to every ingress in its hello on
the plane's IPC, made in process for the embedded ``Hub``); metadata routes,
readiness and the MQTT front's checks read it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from shared import TensorSpec

__all__ = ["ModelInfo"]


@dataclass(frozen=True)
class ModelInfo:
    """What an executor serves, as its hello tells every ingress."""

    model: str
    version: str
    platform: str
    max_batch_size: int
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    device: str
    instance: int = 0
    pid: int = 0
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> bytes:
        return json.dumps(
            {
                "model": self.model,
                "version": self.version,
                "platform": self.platform,
                "max_batch_size": self.max_batch_size,
                "inputs": [s.to_dict() for s in self.inputs],
                "outputs": [s.to_dict() for s in self.outputs],
                "device": self.device,
                "instance": self.instance,
                "pid": self.pid,
                "extra": self.extra,
            }
        ).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> ModelInfo:
        d = json.loads(raw)
        return cls(
            model=str(d["model"]),
            version=str(d["version"]),
            platform=str(d["platform"]),
            max_batch_size=int(d["max_batch_size"]),
            inputs=tuple(TensorSpec.from_dict(s) for s in d["inputs"]),
            outputs=tuple(TensorSpec.from_dict(s) for s in d["outputs"]),
            device=str(d["device"]),
            instance=int(d.get("instance", 0)),
            pid=int(d.get("pid", 0)),
            extra=dict(d.get("extra", {})),
        )
