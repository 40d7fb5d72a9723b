from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from ._brokers import MosquittoProcess
from ._models import write_linear_classifier


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
