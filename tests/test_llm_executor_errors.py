"""A language executor's refusal keeps its wire code across the IPC hop.

A turn the executor's engine refuses (queue full, engine stopping: ``overloaded``;
a broken record: ``bad_request``) comes back to the ingress as the turn's error
update, and that update carries the code, so the device hears ``overloaded``
(go elsewhere now) rather than ``internal``. Real parts: a real ONNX Runtime
GenAI engine behind the executor's own accept loop, and the ingress's
``LanguageClient`` on a real Unix socket.
"""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from cloud_hub.language import LanguageEngine, TurnUpdate
from cloud_hub.plane._llm_client import LanguageClient
from cloud_hub.plane._llm_executor import _accept
from cloud_hub.plane._llm_wire import update_from, update_to
from shared import ErrorCode

from ._plane import wait_until


@pytest.fixture
def closed_engine_client(tiny_language_models: Any) -> Iterator[LanguageClient]:
    """A client of an executor whose engine is stopping (every submit is refused)."""
    engine = LanguageEngine(tiny_language_models.hub_model)
    hello = {
        "op": "hello", "model": "tiny", "version": "1", "created": 0,
        "max_prompt_tokens": engine.max_prompt_tokens,
        "max_output_tokens": engine.limits.max_output_tokens, "context": engine.context,
        "vocab_size": engine.vocab_size,
    }  # fmt: skip
    engine.close()
    address = f"\0tandem-test-llm-{uuid.uuid4().hex}"
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address)
    listener.listen(4)
    stopping = threading.Event()
    accepting = threading.Thread(target=_accept, args=(listener, engine, hello, stopping))
    accepting.start()
    client = LanguageClient(address, "tiny", ingress_id="test")
    try:
        wait_until(client.connected.is_set, timeout_s=30, what="the client connected")
        yield client
    finally:
        client.close()
        stopping.set()
        listener.shutdown(socket.SHUT_RDWR)
        listener.close()
        accepting.join(10)


def test_a_turn_the_stopping_engine_refuses_comes_back_overloaded(
    closed_engine_client: LanguageClient,
) -> None:
    updates: list[TurnUpdate] = []
    closed_engine_client.submit([1, 2, 3], max_tokens=4, sink=updates.append)
    wait_until(lambda: bool(updates), timeout_s=30, what="the turn's update")
    (update,) = updates
    assert update.finish == "error" and "stopping" in (update.error or "")
    assert update.code is ErrorCode.OVERLOADED  # kills: the executor's update without code


def test_the_update_record_carries_the_code_and_an_unknown_one_reads_internal() -> None:
    refused = TurnUpdate("", (), "error", error="full", code=ErrorCode.OVERLOADED)
    assert update_from(update_to(7, refused, ()), ()).code is ErrorCode.OVERLOADED
    assert update_from(update_to(7, TurnUpdate("a", (5,)), (5,)), (5,)).code is None
    record = {**update_to(7, refused, ()), "code": "no_such_code"}
    assert update_from(record, ()).code is ErrorCode.INTERNAL
