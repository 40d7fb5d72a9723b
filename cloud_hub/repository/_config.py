"""Model configuration: what ``<repo>/<model>/config.json`` says, validated.

Every key is optional::

    {"platform": "onnxruntime" | "torch",      # default: from the model file present
     "max_batch_size": 64,                     # rows per batch; 0 = the model does not batch
     "max_queue_delay_ms": 2.0,                # wait at most this long to fill a batch
     "max_queue_size": 1024,                   # requests waiting; beyond it: OVERLOADED
     "inputs":  [{"name": "image", "datatype": "FP32", "dims": [1, 28, 28]}],
     "outputs": [{"name": "logits", "datatype": "FP32", "dims": [10]}],
     "default_version": null,                  # default: the highest version directory
     "instance_group": [{"count": 1, "kind": "KIND_AUTO", "gpus": [0]}],
     "optimization": {"fp16": false},          # ONNX on CUDA: run in half precision
     "allow_non_finite": false,                # accept NaN and inf in float inputs
     "collection": {"store": "/var/lib/tandem/examples"}}
                                               # keep hard examples (see _collect_config)

``dims`` exclude the batch dimension when ``max_batch_size > 0`` (as in
Triton); ``-1`` (or ``null``) is a dimension of any size. ``ModelConfig``
validates in its constructor and names the file and field of the first
problem on one line. ``resolve_config`` then reconciles a config with what
the loaded model says about itself (ONNX files describe their tensors,
TorchScript does not), so a served model always has concrete inputs,
outputs and a batch size. This module does no I/O.

``instance_group`` is Triton's: how many executor processes serve the model
and on what. ``KIND_GPU`` puts ``count`` instances on each GPU of ``gpus``
(default: every GPU the machine has), ``KIND_CPU`` on the CPU, and
``KIND_AUTO`` (the default) on the GPUs when there are any, else on the CPU.
Each instance batches its own queue; the hub's ingress processes send each
request to the instance with the fewest requests in flight. Without the key,
one instance serves the model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from shared import TensorError, TensorSpec

from .._errors import ModelConfigError
from ..collect._config import CollectionConfig

__all__ = [
    "DEFAULT_MAX_BATCH_SIZE",
    "KINDS",
    "PLATFORMS",
    "InstanceGroup",
    "ModelConfig",
    "TensorSpec",
    "resolve_config",
    "spec_from_json",
]

Platform = Literal["onnxruntime", "torch", "custom"]
PLATFORMS: tuple[str, ...] = ("onnxruntime", "torch")
DEFAULT_MAX_BATCH_SIZE = 64
_KEYS = frozenset(
    {
        "platform",
        "max_batch_size",
        "max_queue_delay_ms",
        "max_queue_size",
        "inputs",
        "outputs",
        "default_version",
        "instance_group",
        "optimization",
        "allow_non_finite",
        "collection",
    }
)
KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")


@dataclass(frozen=True, kw_only=True)
class InstanceGroup:
    """``count`` executor instances of a model on each of its devices (Triton's instance_group)."""

    count: int = 1
    kind: str = "KIND_AUTO"
    gpus: tuple[int, ...] | None = None  # None: every GPU

    @classmethod
    def from_json(cls, data: object, where: str) -> InstanceGroup:
        if not isinstance(data, Mapping):
            raise ModelConfigError(f"{where}: must be an object with count, kind and gpus")
        unknown = set(data) - {"count", "kind", "gpus", "name"}
        if unknown:
            raise ModelConfigError(f"{where}: unknown keys {sorted(unknown)}")
        count = data.get("count", 1)
        kind = data.get("kind", "KIND_AUTO")
        gpus = data.get("gpus")
        _check_int(count, f"{where}.count", minimum=1)
        if kind not in KINDS:
            raise ModelConfigError(f"{where}.kind: must be one of {', '.join(KINDS)}, got {kind!r}")
        if gpus is not None and (
            not isinstance(gpus, list)
            or not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in gpus)
        ):
            raise ModelConfigError(f"{where}.gpus: must be a list of GPU indices (ints >= 0)")
        if gpus is not None and kind == "KIND_CPU":
            raise ModelConfigError(f"{where}.gpus: only for KIND_GPU or KIND_AUTO")
        return cls(count=count, kind=kind, gpus=None if gpus is None else tuple(gpus))

    def devices(self, gpu_count: int) -> list[str]:
        """The device of each instance (``cuda:N`` or ``cpu``), given the machine's GPUs."""
        if self.kind == "KIND_CPU" or (self.kind == "KIND_AUTO" and gpu_count == 0):
            return ["cpu"] * self.count
        gpus = self.gpus if self.gpus is not None else tuple(range(gpu_count))
        missing = [g for g in gpus if g >= gpu_count]
        if missing or not gpus:
            raise ModelConfigError(
                f"instance_group asks for GPU(s) {list(missing) or 'any'} but this machine "
                f"has {gpu_count}"
            )
        return [f"cuda:{g}" for g in gpus for _ in range(self.count)]


def spec_from_json(data: object, where: str) -> TensorSpec:
    """A config.json tensor entry (``name``, ``datatype``, ``dims`` with -1 for any size)."""
    if not isinstance(data, Mapping):
        raise ModelConfigError(f"{where}: must be an object with name, datatype and dims")
    unknown = set(data) - {"name", "datatype", "dims"}
    if unknown:
        raise ModelConfigError(f"{where}: unknown keys {sorted(unknown)}")
    dims = data.get("dims")
    if not isinstance(dims, list) or not all(
        d is None or (isinstance(d, int) and not isinstance(d, bool) and (d > 0 or d == -1))
        for d in dims
    ):
        raise ModelConfigError(
            f"{where}.dims: must be a list of positive ints (-1 or null for any size)"
        )
    try:
        return TensorSpec.from_dims(data.get("name"), data.get("datatype"), dims)  # type: ignore[arg-type]
    except TensorError as e:
        raise ModelConfigError(f"{where}: {e}") from None


@dataclass(frozen=True, kw_only=True)
class ModelConfig:
    """How one model is served. ``None`` fields are filled in by ``resolve_config``."""

    platform: Platform | None = None
    max_batch_size: int | None = None  # rows per batch; 0: the model takes no batch dim
    max_queue_delay_ms: float = 2.0
    max_queue_size: int = 1024  # requests, not rows
    inputs: tuple[TensorSpec, ...] | None = None
    outputs: tuple[TensorSpec, ...] | None = None
    default_version: int | None = None
    instance_group: tuple[InstanceGroup, ...] = ()
    fp16: bool = False  # optimization.fp16: ONNX models on CUDA compute in half precision
    allow_non_finite: bool = False  # NaN/inf in float inputs are refused unless this is set
    collection: CollectionConfig | None = None  # keep hard examples of this model (opt-in)
    source: str = field(default="<config>", compare=False)  # where it came from, for messages

    def __post_init__(self) -> None:
        src = self.source
        if self.platform is not None and self.platform not in (*PLATFORMS, "custom"):
            raise ModelConfigError(
                f"{src}: platform: must be one of {', '.join(PLATFORMS)}, got {self.platform!r}"
            )
        _check_int(self.max_batch_size, f"{src}: max_batch_size", minimum=0, optional=True)
        _check_int(self.max_queue_size, f"{src}: max_queue_size", minimum=1)
        _check_int(self.default_version, f"{src}: default_version", minimum=0, optional=True)
        if not isinstance(self.allow_non_finite, bool):
            raise ModelConfigError(f"{src}: allow_non_finite: must be true or false")
        delay = self.max_queue_delay_ms
        if (
            not isinstance(delay, int | float)
            or isinstance(delay, bool)
            or not math.isfinite(delay)
            or delay < 0
        ):
            raise ModelConfigError(
                f"{src}: max_queue_delay_ms: must be a non-negative number, got {delay!r}"
            )
        for key in ("inputs", "outputs"):
            specs = getattr(self, key)
            if specs is None:
                continue
            specs = tuple(specs)
            object.__setattr__(self, key, specs)
            if not specs or not all(isinstance(s, TensorSpec) for s in specs):
                raise ModelConfigError(f"{src}: {key}: must be a non-empty list of tensors")
            names = [s.name for s in specs]
            if len(set(names)) != len(names):
                raise ModelConfigError(f"{src}: {key}: duplicate tensor names in {names}")

    @property
    def batched(self) -> bool:
        return bool(self.max_batch_size)

    @classmethod
    def from_json(cls, data: object, source: str = "<config>") -> ModelConfig:
        """Build a config from parsed JSON, rejecting unknown keys (they are usually typos)."""
        if not isinstance(data, Mapping):
            raise ModelConfigError(f"{source}: must be a JSON object")
        unknown = set(data) - _KEYS
        if unknown:
            raise ModelConfigError(
                f"{source}: unknown keys {sorted(unknown)}; known keys are {sorted(_KEYS)}"
            )
        platform = data.get("platform")
        if platform is not None and platform not in PLATFORMS:
            raise ModelConfigError(
                f"{source}: platform: must be one of {', '.join(PLATFORMS)}, got {platform!r}"
            )
        values: dict[str, Any] = {
            k: v
            for k, v in data.items()
            if k not in ("inputs", "outputs", "instance_group", "optimization", "collection")
        }
        if data.get("collection") is not None:
            values["collection"] = CollectionConfig.from_json(
                data["collection"], source, base=Path(source).parent
            )
        groups = data.get("instance_group")
        if groups is not None:
            if not isinstance(groups, list) or not groups:
                raise ModelConfigError(f"{source}: instance_group: must be a non-empty list")
            values["instance_group"] = tuple(
                InstanceGroup.from_json(g, f"{source}: instance_group[{i}]")
                for i, g in enumerate(groups)
            )
        optimization = data.get("optimization")
        if optimization is not None:
            if not isinstance(optimization, Mapping) or set(optimization) - {"fp16"}:
                raise ModelConfigError(f'{source}: optimization: only {{"fp16": bool}} is known')
            fp16 = optimization.get("fp16", False)
            if not isinstance(fp16, bool):
                raise ModelConfigError(f"{source}: optimization.fp16: must be true or false")
            values["fp16"] = fp16
        for key in ("inputs", "outputs"):
            raw = data.get(key)
            if raw is None:
                continue
            if not isinstance(raw, list):
                raise ModelConfigError(f"{source}: {key}: must be a list of tensor objects")
            values[key] = tuple(
                spec_from_json(item, f"{source}: {key}[{i}]") for i, item in enumerate(raw)
            )
        if values.get("max_queue_delay_ms") is None:
            values.pop("max_queue_delay_ms", None)
        if values.get("max_queue_size") is None:
            values.pop("max_queue_size", None)
        return cls(**values, source=source)


def resolve_config(
    config: ModelConfig,
    *,
    platform: Platform,
    model_inputs: Sequence[TensorSpec] | None,
    model_outputs: Sequence[TensorSpec] | None,
) -> ModelConfig:
    """Fill in what ``config`` leaves open from the model's own description.

    ``model_inputs``/``model_outputs`` are full shapes (batch dim included) as
    the model file declares them, or ``None`` when the format does not say
    (TorchScript). Raises ``ModelConfigError`` when the two disagree or when
    neither says.
    """
    src = config.source
    if config.platform is not None and config.platform != platform:
        raise ModelConfigError(
            f"{src}: platform: says {config.platform!r} but the model is {platform!r}"
        )
    batch = config.max_batch_size
    if batch is None:
        fixed_first = model_inputs is not None and any(
            not s.shape or s.shape[0] is not None for s in model_inputs
        )
        batch = 0 if fixed_first else DEFAULT_MAX_BATCH_SIZE
    inputs = _resolve_specs(config.inputs, model_inputs, batch, f"{src}: inputs")
    outputs = _resolve_specs(config.outputs, model_outputs, batch, f"{src}: outputs")
    return replace(config, platform=platform, max_batch_size=batch, inputs=inputs, outputs=outputs)


def _resolve_specs(
    declared: tuple[TensorSpec, ...] | None,
    model: Sequence[TensorSpec] | None,
    batch: int,
    where: str,
) -> tuple[TensorSpec, ...]:
    if model is None:
        if declared is None:
            raise ModelConfigError(
                f"{where}: required, because the model file does not describe its tensors"
            )
        return declared
    per_row: list[TensorSpec] = []
    for spec in model:
        if batch:
            if not spec.shape or spec.shape[0] is not None:
                raise ModelConfigError(
                    f"{where}: the model's {spec.describe()} has no variable batch dimension; "
                    "set max_batch_size to 0"
                )
            spec = TensorSpec(spec.name, spec.datatype, spec.shape[1:])
        per_row.append(spec)
    if declared is None:
        return tuple(per_row)
    by_name = {s.name: s for s in per_row}
    if set(by_name) != {s.name for s in declared}:
        raise ModelConfigError(
            f"{where}: names {sorted(s.name for s in declared)} do not match the model's "
            f"{sorted(by_name)}"
        )
    for spec in declared:
        actual = by_name[spec.name]
        if (
            spec.datatype != actual.datatype
            or len(spec.shape) != len(actual.shape)
            or any(
                a != b and a is not None and b is not None
                for a, b in zip(spec.shape, actual.shape, strict=True)
            )
        ):
            raise ModelConfigError(
                f"{where}: {spec.describe()} does not match the model's {actual.describe()}"
                + (" (dims exclude the batch dimension)" if batch else "")
            )
    # The declared order wins (it is the order a TorchScript module takes positionally).
    return tuple(
        TensorSpec(
            s.name,
            s.datatype,
            tuple(
                b if a is None else a for a, b in zip(s.shape, by_name[s.name].shape, strict=True)
            ),
        )
        for s in declared
    )


def _check_int(value: object, where: str, *, minimum: int, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ModelConfigError(f"{where}: must be an integer >= {minimum}, got {value!r}")
