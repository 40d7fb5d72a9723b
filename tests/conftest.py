from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from model_cdn.registry import Registry, open_registry

from ._brokers import MosquittoProcess
from ._cdn import postgres_available, postgres_database
from ._models import write_linear_classifier
from ._needs import need

# The text-over-MQTT tests share their served hub and peers across two files.
pytest_plugins = ["tests._text_mqtt"]


@pytest.fixture(scope="session")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MosquittoProcess]:
    """A Mosquitto of the session's own, with TCP_NODELAY, on a free port."""
    broker = MosquittoProcess(tmp_path_factory.mktemp("mosquitto")).start()
    yield broker
    broker.stop()


@pytest.fixture
def own_mosquitto(tmp_path: Path) -> Iterator[MosquittoProcess]:
    """A Mosquitto for one test, which the test may stop and start again."""
    broker = MosquittoProcess(tmp_path).start()
    yield broker
    broker.stop()


@pytest.fixture(scope="session")
def linear_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small real ONNX classifier: x FP32[?, 16] -> logits FP32[?, 4]."""
    return write_linear_classifier(tmp_path_factory.mktemp("models") / "linear.onnx")


# Registries over both backends: a test asking for ``registry`` runs on a SQLite file and on
# a PostgreSQL schema of its own (skipped where PostgreSQL is not reachable, failed under CI).


@pytest.fixture(scope="module")
def postgres_url() -> Iterator[str]:
    need(postgres_available())
    with postgres_database() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def registry_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A registry URL with empty tables of the test's own."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'registry.db'}"
        return
    base: str = request.getfixturevalue("postgres_url")
    import psycopg

    schema = f"t_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    try:
        yield f"{base}?options=-csearch_path%3D{schema}"
    finally:
        with psycopg.connect(base, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA "{schema}" CASCADE')


@pytest.fixture
def registry(registry_url: str) -> Iterator[Registry]:
    reg = open_registry(registry_url)
    yield reg
    reg.close()


@pytest.fixture(scope="session")
def tiny_language_models(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The tiny device/hub language pair (``tests/_language.py``), built once per session:
    ``.device_model`` and ``.hub_model`` are ONNX Runtime GenAI folders."""
    from tandem.demo.language import build_language_models

    from ._language import tiny_recipe

    return build_language_models(tmp_path_factory.mktemp("lm-cache"), recipe=tiny_recipe())
