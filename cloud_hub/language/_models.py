"""The language models a hub serves: ``platform: onnxruntime_genai`` in a model's config.json.

A repository directory may hold language models beside tensor models::

    models/
      tiny-llm/
        config.json   {"platform": "onnxruntime_genai",
                       "engine": "onnxruntime-genai",
                       "default_version": null,
                       "generation": {"max_prompt_tokens": 96, "max_output_tokens": 256,
                                      "max_wall_s": 60, "max_queue": 64, "max_active": 4,
                                      "max_conversations": 64, "conversation_ttl_s": 600,
                                      "max_conversation_tokens": null}}
        1/            an ONNX Runtime GenAI model folder: genai_config.json, model.onnx,
                      model.onnx.data, tokenizer.json, tokenizer_config.json

The tensor repository (``ModelRepository``) skips such directories
(:func:`is_language_model_dir`); :class:`LanguageModels` loads each into a
:class:`~cloud_hub.language.LanguageEngine` (the embedded plane, ``cloud_hub.Hub``),
and the process plane runs one language executor process per model
(``cloud_hub.plane``), whose ingress processes reach it over IPC.

``engine`` picks what serves the model (:func:`open_engine`):
``"onnxruntime-genai"`` (the default: ONNX Runtime GenAI's ``Engine``, on CPU)
or ``"vllm"`` (``VllmEngine``: CUDA machines with the ``vllm`` extra; it loads
the version folder's Hugging Face checkpoint, ``1/hf/`` beside the ONNX files,
else ``1/`` itself). Where what an engine needs is missing (:func:`engine_missing`),
that model is not served, with one line saying why, and the others are.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from shared import ConfigError, validate_name

from .._errors import ModelConfigError, ModelNotFoundError, RepositoryError
from ._engine import LanguageEngine
from ._options import GenerationLimits
from ._turn import TurnEngine
from ._vllm import VllmEngine

__all__ = [
    "ENGINES",
    "PLATFORM",
    "LanguageConfig",
    "LanguageModels",
    "ServedLanguageModel",
    "engine_missing",
    "is_language_model_dir",
    "open_engine",
    "read_language_config",
]

log = logging.getLogger(__name__)

PLATFORM = "onnxruntime_genai"
ENGINES = ("onnxruntime-genai", "vllm")
_KEYS = frozenset({"platform", "engine", "default_version", "generation"})


def is_language_model_dir(model_dir: Path) -> bool:
    """Whether ``model_dir/config.json`` says ``"platform": "onnxruntime_genai"``."""
    try:
        data = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False  # the tensor repository reports what is wrong with it
    return isinstance(data, dict) and data.get("platform") == PLATFORM


@dataclass(frozen=True)
class ServedLanguageModel:
    name: str
    version: str
    engine: TurnEngine  # a LanguageEngine, or the process plane's client of one
    created: int  # Unix time it was loaded (OpenAI's ``created``)


class LanguageModels:
    """Language models by name, each on its own engine thread. Thread-safe."""

    def __init__(self) -> None:
        self._models: dict[str, ServedLanguageModel] = {}
        self._lock = threading.Lock()

    def get(self, name: str) -> ServedLanguageModel:
        model = self._models.get(name)
        if model is None:
            known = ", ".join(sorted(self._models)) or "none"
            raise ModelNotFoundError(f"no language model {name!r} is served here (models: {known})")
        return model

    def __iter__(self) -> Iterator[ServedLanguageModel]:
        return iter(sorted(self._models.values(), key=lambda m: m.name))

    def __len__(self) -> int:
        return len(self._models)

    def add(
        self,
        name: str,
        directory: str | Path,
        *,
        version: str | int = 1,
        limits: GenerationLimits | None = None,
        engine: str = ENGINES[0],
    ) -> ServedLanguageModel:
        """Serve the model version folder ``directory`` as ``name`` on ``engine``."""
        try:
            validate_name(name, "model name")
        except ConfigError as e:
            raise ModelConfigError(str(e)) from e
        return self.add_engine(name, open_engine(engine, directory, limits), version=version)

    def add_engine(
        self, name: str, engine: TurnEngine, *, version: str | int = 1
    ) -> ServedLanguageModel:
        """Serve a started ``engine`` as ``name`` (replacing, and closing, one of that name)."""
        served = ServedLanguageModel(name, str(version), engine, int(time.time()))
        with self._lock:
            old = self._models.get(name)
            self._models[name] = served
        if old is not None:
            old.engine.close()
        log.info("serving language model %s@%s (%s)", name, version, PLATFORM)
        return served

    def load_directory(self, root: str | Path) -> list[ServedLanguageModel]:
        """Load every language model of the repository at ``root``.

        A model whose engine cannot run here (:func:`engine_missing`) is skipped
        with one logged line; the others load.
        """
        loaded = []
        for model_dir in sorted(p for p in Path(root).iterdir() if p.is_dir()):
            if model_dir.name.startswith((".", "_")) or not is_language_model_dir(model_dir):
                continue
            config = read_language_config(model_dir)
            missing = engine_missing(config.engine)
            if missing is not None:
                log.error("language model %s is not served: %s", model_dir.name, missing)
                continue
            loaded.append(self.add(model_dir.name, config.directory, version=config.version,
                                   limits=config.limits, engine=config.engine))  # fmt: skip
        return loaded

    def close(self) -> None:
        with self._lock:
            models = list(self._models.values())
            self._models.clear()
        for served in models:
            served.engine.close()


@dataclass(frozen=True)
class LanguageConfig:
    """A language model directory's ``config.json``, read: what to serve and how."""

    name: str
    version: int
    directory: Path  # the version's ONNX Runtime GenAI folder
    limits: GenerationLimits
    engine: str  # one of ENGINES


def open_engine(
    engine: str, directory: str | Path, limits: GenerationLimits | None = None
) -> LanguageEngine | VllmEngine:
    """The engine ``config.json``'s ``engine`` names, serving the version folder ``directory``.

    ``"onnxruntime-genai"``: :class:`LanguageEngine` on its ONNX Runtime GenAI
    folder; ``"vllm"``: :class:`~cloud_hub.language.VllmEngine` on its Hugging
    Face checkpoint (``directory/hf``, else ``directory``). Check
    :func:`engine_missing` first: this raises where the engine cannot run.
    """
    if engine == "vllm":
        return VllmEngine(directory, limits=limits)
    if engine != "onnxruntime-genai":
        raise ModelConfigError(f"engine must be one of {list(ENGINES)}, got {engine!r}")
    return LanguageEngine(directory, limits=limits)


def engine_missing(engine: str) -> str | None:
    """Why ``engine`` cannot serve on this machine (one line), or None when it can.

    vLLM needs its package and a CUDA GPU (``nvidia-smi`` on the PATH); a
    config that asks for it where either is missing fails clearly rather than
    falling back to another engine.
    """
    if engine == "onnxruntime-genai":
        return None
    missing = []
    if importlib.util.find_spec("vllm") is None:
        missing.append("the vllm package (pip install 'tandem[vllm]')")
    if shutil.which("nvidia-smi") is None:
        missing.append("a CUDA GPU (no nvidia-smi)")
    if missing:
        return f"engine 'vllm' needs {' and '.join(missing)}"
    return None


def read_language_config(model_dir: Path) -> LanguageConfig:
    """``model_dir/config.json`` of a language model; typed errors for what is wrong."""
    version, limits, engine = _read_config(model_dir)
    return LanguageConfig(model_dir.name, version, model_dir / str(version), limits, engine)


def _read_config(model_dir: Path) -> tuple[int, GenerationLimits, str]:
    path = model_dir / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    unknown = sorted(set(data) - _KEYS)
    if unknown:
        raise ModelConfigError(f"{path}: unknown key {unknown[0]!r} (a language model takes "
                               f"{sorted(_KEYS)})")  # fmt: skip
    versions = sorted(int(p.name) for p in model_dir.iterdir() if p.is_dir() and p.name.isdecimal())
    version = data.get("default_version") or (versions[-1] if versions else None)
    if version not in versions:
        raise RepositoryError(f"{model_dir}: no version directory {version or ''} (expected "
                              f"{model_dir}/1/genai_config.json)")  # fmt: skip
    engine = data.get("engine", ENGINES[0])
    if engine not in ENGINES:
        raise ModelConfigError(f"{path}: engine must be one of {list(ENGINES)}, got {engine!r}")
    try:
        limits = GenerationLimits.from_json(data.get("generation"), str(path))
    except (TypeError, ValueError) as e:
        raise ModelConfigError(str(e)) from e
    return version, limits, engine
