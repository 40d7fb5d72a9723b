"""The model repository: Triton-like directories on disk, plus models registered in Python.

Layout::

    <repo>/<model>/config.json            optional (see ``_config``)
    <repo>/<model>/<version>/model.onnx   ONNX Runtime
    <repo>/<model>/<version>/model.pt     TorchScript (torch.jit.load)

Version directories are decimal integers; the highest is served unless
``default_version`` says otherwise (one version per model is loaded: a
GPU's memory is for serving, not for old versions). Entries starting with
``.`` or ``_`` are skipped. Loading is all or nothing: a model that cannot
be loaded stops the load with a ``RepositoryError`` naming the file and
what is wrong, and closes what was loaded so far. Every model runs a
warm-up batch before it is served.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shared import ConfigError, validate_name

from .._errors import ModelConfigError, ModelNotFoundError, RepositoryError
from ..executors import Executor, OnnxExecutor, TorchExecutor
from ..language._models import is_language_model_dir
from ._config import ModelConfig, Platform, resolve_config

__all__ = [
    "MODEL_FILES",
    "ModelRepository",
    "ServedModel",
    "model_configs",
    "read_config",
    "served_version",
]

log = logging.getLogger(__name__)

MODEL_FILES: dict[str, Platform] = {
    "model.onnx": "onnxruntime",
    "model.pt": "torch",
}


@dataclass(frozen=True)
class ServedModel:
    """One loaded model version: its resolved config and the executor that computes it."""

    name: str
    version: str
    config: ModelConfig  # resolved: platform, max_batch_size, inputs and outputs are set
    executor: Executor

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"


class ModelRepository:
    """The models a hub serves, by name. Thread-safe."""

    def __init__(self) -> None:
        self._models: dict[str, ServedModel] = {}
        self._lock = threading.Lock()

    @classmethod
    def from_directory(
        cls, path: str | Path, *, torch_device: str | None = None
    ) -> ModelRepository:
        repository = cls()
        repository.load_directory(path, torch_device=torch_device)
        return repository

    # -- reading --------------------------------------------------------------------------

    def get(self, name: str, version: str | None = None) -> ServedModel:
        """The served model, or ``ModelNotFoundError`` (also for a version not served)."""
        model = self._models.get(name)
        if model is None:
            known = ", ".join(sorted(self._models)) or "none"
            raise ModelNotFoundError(f"no model {name!r} is served here (models: {known})")
        if version is not None and version != model.version:
            raise ModelNotFoundError(
                f"model {name!r} version {version!r} is not served here "
                f"(serving version {model.version})"
            )
        return model

    def __contains__(self, name: object) -> bool:
        return name in self._models

    def __iter__(self) -> Iterator[ServedModel]:
        return iter(list(self._models.values()))

    def __len__(self) -> int:
        return len(self._models)

    # -- adding ---------------------------------------------------------------------------

    def add(
        self,
        name: str,
        executor: Executor,
        *,
        version: str | int = 1,
        config: ModelConfig | None = None,
        warm_up: bool = True,
    ) -> ServedModel:
        """Serve ``executor`` as ``name``, replacing a model of that name.

        The replaced model's executor is not closed here: a batch may still be
        running on it, so its owner (the hub) closes it when that is over.

        ``config`` may omit what the executor describes itself (an
        ``OnnxExecutor`` knows its tensors; a ``CallableExecutor`` does not).
        """
        try:
            validate_name(name, "model name")
        except ConfigError as e:
            raise ModelConfigError(str(e)) from e
        config = config or ModelConfig(source=f"model {name!r}")
        resolved = resolve_config(
            config,
            platform=executor.platform,  # type: ignore[arg-type]  # subclasses name theirs
            model_inputs=executor.inputs,
            model_outputs=executor.outputs,
        )
        served = ServedModel(name, str(version), resolved, executor)
        if warm_up:
            _warm_up(served)
        with self._lock:
            self._models[name] = served
        log.info(
            "serving %s (%s on %s, max_batch_size %s)",
            served.label,
            executor.platform,
            executor.device,
            resolved.max_batch_size,
        )
        return served

    def load_directory(
        self, path: str | Path, *, torch_device: str | None = None
    ) -> list[ServedModel]:
        """Load every model under ``path``; all or nothing.

        ``torch_device`` (``cpu``, ``cuda``, ``cuda:N``) places every model, ONNX ones
        included; ``None`` uses a GPU when there is one.
        """
        root = Path(path)
        if not root.is_dir():
            raise RepositoryError(f"{root}: model repository is not a directory")
        loaded: list[ServedModel] = []
        language = 0
        try:
            for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
                if model_dir.name.startswith((".", "_")):
                    continue
                if is_language_model_dir(model_dir):
                    language += 1  # served by cloud_hub.language (Hub.language)
                    continue
                name, version, config, executor = _load_model_dir(model_dir, torch_device)
                try:
                    loaded.append(self.add(name, executor, version=version, config=config))
                except BaseException:
                    executor.close()
                    raise
        except BaseException:
            for served in loaded:
                with self._lock:
                    if self._models.get(served.name) is served:
                        del self._models[served.name]
                served.executor.close()
            raise
        if not loaded and not language:
            log.warning("%s: no models found (expected <model>/<version>/model.onnx)", root)
        return loaded

    def load_model(
        self,
        path: str | Path,
        name: str,
        *,
        device: str | None = None,
        version: int | None = None,
    ) -> ServedModel:
        """Load one model of the repository at ``path`` onto ``device`` (an executor process).

        ``version``: that version directory; None: the one the config and disk pick.
        """
        model_dir = Path(path) / name
        if not model_dir.is_dir():
            raise ModelNotFoundError(f"{model_dir}: no such model directory")
        name, version, config, executor = _load_model_dir(model_dir, device, version)
        try:
            return self.add(name, executor, version=version, config=config)
        except BaseException:
            executor.close()
            raise

    def close(self) -> None:
        """Close every executor and forget the models."""
        with self._lock:
            models = list(self._models.values())
            self._models.clear()
        for served in models:
            try:
                served.executor.close()
            except Exception:  # closing is best effort; the others must still close
                log.exception("closing %s failed", served.label)


def model_configs(path: str | Path) -> dict[str, ModelConfig]:
    """Each model's ``config.json`` under ``path``, read without loading any model."""
    root = Path(path)
    if not root.is_dir():
        raise RepositoryError(f"{root}: model repository is not a directory")
    configs: dict[str, ModelConfig] = {}
    for model_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        if model_dir.name.startswith((".", "_")) or is_language_model_dir(model_dir):
            continue
        try:
            name = validate_name(model_dir.name, "model directory name")
        except ConfigError as e:
            raise ModelConfigError(f"{model_dir}: {e}") from e
        configs[name] = read_config(model_dir / "config.json")
    return configs


def served_version(model_dir: Path, config: ModelConfig) -> int:
    """The version a model directory serves: ``default_version``, else the highest on disk."""
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdecimal())
    if not versions:
        raise RepositoryError(
            f"{model_dir}: no version directories (expected {model_dir}/1/model.onnx)"
        )
    version = versions[-1] if config.default_version is None else config.default_version
    if version not in versions:
        raise ModelConfigError(
            f"{config.source}: default_version: {version} is not among the versions on disk "
            f"{versions}"
        )
    return version


def _load_model_dir(
    model_dir: Path, device: str | None, version: int | None = None
) -> tuple[str, int, ModelConfig, Executor]:
    try:
        name = validate_name(model_dir.name, "model directory name")
    except ConfigError as e:
        raise ModelConfigError(f"{model_dir}: {e}") from e
    config = read_config(model_dir / "config.json")
    if version is None:
        version = served_version(model_dir, config)
    elif not (model_dir / str(version)).is_dir():
        raise RepositoryError(f"{model_dir}/{version}: no such version directory")
    version_dir = model_dir / str(version)
    files = [f for f in MODEL_FILES if (version_dir / f).is_file()]
    if config.platform is not None:
        files = [f for f in files if MODEL_FILES[f] == config.platform]
    if not files:
        wanted = [f for f, p in MODEL_FILES.items() if config.platform in (None, p)]
        raise RepositoryError(f"{version_dir}: no model file (expected one of {wanted})")
    if len(files) > 1:
        raise ModelConfigError(
            f"{config.source}: platform: {version_dir} holds {files}; say which one to serve"
            if config.platform is None
            else f"{version_dir}: holds {files}; keep one"
        )
    model_file = version_dir / files[0]
    if MODEL_FILES[files[0]] == "onnxruntime":
        executor: Executor = OnnxExecutor(
            model_file,
            device=device,
            fp16=config.fp16,
            max_batch_size=config.max_batch_size or 0,
        )
        return name, version, config, executor
    if config.inputs is None or config.outputs is None:
        raise ModelConfigError(
            f"{config.source}: inputs and outputs: required for torch models "
            "(a TorchScript file does not describe its tensors)"
        )
    executor = TorchExecutor.load(
        model_file,
        input_names=[s.name for s in config.inputs],
        output_names=[s.name for s in config.outputs],
        device=device,
    )
    return name, version, config, executor


def read_config(path: Path) -> ModelConfig:
    """Read and validate a ``config.json``; a missing file is an all-defaults config."""
    if not path.exists():
        return ModelConfig(source=str(path))
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ModelConfigError(f"{path}: cannot read it: {e}") from e
    except json.JSONDecodeError as e:
        raise ModelConfigError(f"{path}: not valid JSON: {e}") from e
    return ModelConfig.from_json(data, str(path))


def _warm_up(served: ServedModel) -> None:
    config = served.config
    try:
        served.executor.warm_up(config.inputs or (), batched=config.batched)
    except Exception as e:
        raise RepositoryError(f"{served.label}: the warm-up batch failed: {e}") from e
