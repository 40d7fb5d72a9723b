"""Chunked bodies (Transfer-Encoding: chunked, no Content-Length) count against the hub's
in-flight byte budget as they arrive, and give it back once answered or refused.

Raw sockets send the chunks, so that a body can stop halfway and stay held.
"""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator

import httpx
import pytest
from fastapi import FastAPI

from cloud_hub import Hub
from cloud_hub.http import HttpServer, create_app

from ._hub_http_kit import WAIT_S, infer_json, rows
from ._hub_http_kit import hub_fixture as hub_fixture
from ._plane import wait_until

KiB = 1024
PATH = "/v2/models/linear/infer"


def _body(size: int, seed: int) -> bytes:
    """A valid JSON body of ``size`` bytes (trailing whitespace is valid JSON)."""
    text = json.dumps(infer_json(rows(1, seed=seed))).encode()
    return text + b" " * (size - len(text))


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


class ChunkedUpload:
    """A POST whose body goes in chunks, sent when the test says."""

    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=WAIT_S)
        self.sock.sendall(
            f"POST {PATH} HTTP/1.1\r\nHost: hub\r\nContent-Type: application/json\r\n"
            "Transfer-Encoding: chunked\r\n\r\n".encode()
        )

    def send(self, data: bytes, *, last: bool = False) -> None:
        self.sock.sendall(_chunk(data) + (b"0\r\n\r\n" if last else b""))

    def status(self) -> tuple[int, bytes]:
        """The response's status and body (read to the end of what the server sends)."""
        data = b""
        while b"\r\n\r\n" not in data or len(data.partition(b"\r\n\r\n")[2]) < _length(data):
            more = self.sock.recv(65536)
            if not more:
                break
            data += more
        return int(data.split(b" ", 2)[1]), data.partition(b"\r\n\r\n")[2]

    def close(self) -> None:
        self.sock.close()


def _length(response: bytes) -> int:
    for line in response.partition(b"\r\n\r\n")[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":")[1])
    return 0


@pytest.fixture(name="served")
def served_fixture(hub: Hub) -> Iterator[tuple[FastAPI, HttpServer]]:
    app = create_app(
        hub, max_body_bytes=96 * KiB, max_json_bytes=96 * KiB, max_inflight_bytes=110 * KiB
    )
    with HttpServer(app, port=0) as server:
        yield app, server


def test_a_chunked_flood_past_the_budget_is_503_while_it_arrives_and_gives_it_back(
    served: tuple[FastAPI, HttpServer],
) -> None:
    app, server = served
    budget = app.state.byte_budget
    port = server.port
    bodies = [_body(60 * KiB, seed) for seed in range(3)]
    uploads = [ChunkedUpload(port) for _ in bodies]
    try:
        # Two bodies stop halfway: 60 KiB held, counted while their ends have not come.
        for upload, body in zip(uploads[:2], bodies[:2], strict=True):
            upload.send(body[: 30 * KiB])
        wait_until(lambda: budget.held >= 60 * KiB, timeout_s=WAIT_S, what="two halves held")
        # A third's 60 KiB would pass the 110 KiB budget: refused before its end comes.
        uploads[2].send(bodies[2][: 60 * KiB])
        status, text = uploads[2].status()
        assert status == 503 and b"budget" in text, text
        for upload, body in zip(uploads[:2], bodies[:2], strict=True):  # 90 KiB, then 60
            upload.send(body[30 * KiB :], last=True)
            status, text = upload.status()
            assert status == 200, text
    finally:
        for upload in uploads:
            upload.close()
    wait_until(lambda: budget.held == 0, timeout_s=WAIT_S, what="the budget given back")
    # All of it is free again: a chunked body of nearly the whole budget is taken.
    big = _body(96 * KiB, 7)
    with httpx.Client(base_url=server.url, timeout=WAIT_S) as client:
        reply = client.post(
            PATH,
            content=iter([big[: 50 * KiB], big[50 * KiB :]]),  # an iterator: sent chunked
            headers={"Content-Type": "application/json"},
        )
    assert reply.status_code == 200, reply.text
    assert reply.request.headers.get("transfer-encoding") == "chunked"
    assert budget.held == 0
