"""The hub's and the CDN's HTTP edges: slow clients are dropped, bodies of the wrong type refused.

Real uvicorn servers on loopback (the hub's ``HttpServer``; the CDN's
``CdnServer`` config, as ``tandem cdn serve`` runs it) and raw sockets that
stage the attacks: headers one byte a second (slowloris), a body that
trickles, and bodies a browser could post cross-site without a preflight.
Each slow-client test also shows that an honest client on the same server
is served (the positive control), and that one sending steadily above the
minimum rate is never cut, however long its body takes.
"""

from __future__ import annotations

import json
import select
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from cloud_hub import Hub
from cloud_hub.http import HttpServer, create_app
from model_cdn.server import CdnServer, CdnServeSettings
from shared import UnsupportedMediaTypeError
from shared.server import HttpTimeouts, body_media_type

from ._brokers import free_port
from ._hub_http_kit import (
    assert_still_serving,
    binary_body,
    infer_json,
    rows,
)
from ._hub_http_kit import hub_fixture as hub_fixture

TIMEOUTS = HttpTimeouts(header_s=1.0, body_s=1.0, body_min_rate_bps=1000, keep_alive_s=5)
BOUND_S = 10.0  # the most any drop may take here: far above every deadline, far below "never"
INFER = "/v2/models/linear/infer"
ADMIN = "admin-s3cret"


@pytest.fixture(scope="module")
def hub_url(hub: Hub) -> Iterator[str]:
    with HttpServer(create_app(hub), port=0, timeouts=TIMEOUTS) as server:
        yield server.url


@pytest.fixture(scope="module")
def cdn_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    import uvicorn

    root = tmp_path_factory.mktemp("cdn")
    settings = CdnServeSettings(
        registry=str(root / "registry.db"),
        store=str(root / "blobs"),
        port=free_port(),
        log_level="warning",
        admin_token=ADMIN,
        http_timeouts=TIMEOUTS,
    )
    with CdnServer(settings) as cdn:
        server = uvicorn.Server(cdn.uvicorn_config())
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.monotonic() + BOUND_S
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "the CDN did not start"
            time.sleep(0.01)
        try:
            yield f"http://127.0.0.1:{settings.port}"
        finally:
            server.should_exit = True
            thread.join(BOUND_S)


def _address(url: str) -> tuple[str, int]:
    host, port = url.rsplit("/", 1)[1].rsplit(":", 1)
    return host, int(port)


def _read_all(sock: socket.socket) -> bytes:
    sock.settimeout(BOUND_S)
    answer = b""
    while chunk := sock.recv(65536):
        answer += chunk
    return answer


def _read_response(sock: socket.socket) -> bytes:
    """One whole response (headers, then Content-Length bytes) from a kept-alive connection."""
    sock.settimeout(BOUND_S)
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def send_slowly(
    url: str, data: bytes, *, piece: int, every_s: float, prelude: bytes = b""
) -> tuple[bytes, int]:
    """Send ``prelude`` at once, then ``data`` ``piece`` bytes every ``every_s`` seconds,
    until the server answers and closes; (its answer, the bytes of ``data`` sent by then)."""
    with socket.create_connection(_address(url), timeout=BOUND_S) as sock:
        sock.sendall(prelude)
        sent = 0
        while sent < len(data):  # bounded by the data; callers check it was cut before its end
            try:
                sock.sendall(data[sent : sent + piece])
            except (BrokenPipeError, ConnectionResetError):
                break
            sent += piece
            readable, _, _ = select.select([sock], [], [], every_s)  # the pace, or the answer
            if readable:
                break
        try:
            return _read_all(sock), min(sent, len(data))
        except ConnectionResetError:
            return b"", min(sent, len(data))


def request_head(method: str, path: str, length: int | None = None, **headers: str) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test"]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


# -- slow clients --------------------------------------------------------------------------


@pytest.mark.parametrize("server", ["hub", "cdn"])
def test_slowloris_headers_one_byte_a_second_are_dropped(
    server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"{server}_url")
    path = "/v2/health/live" if server == "hub" else "/healthz"
    head = request_head("GET", path, X_Padding="p" * 40)
    answer, sent = send_slowly(url, head, piece=1, every_s=1.0)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert sent < len(head)  # dropped before its headers could end
    assert httpx.get(url + path, timeout=BOUND_S).status_code == 200  # others are served


def test_slowloris_headers_after_a_first_request_on_a_kept_alive_connection_are_dropped(
    hub_url: str,
) -> None:
    with socket.create_connection(_address(hub_url), timeout=BOUND_S) as sock:
        sock.sendall(request_head("GET", "/v2/health/live"))
        first = _read_response(sock)
        assert first.startswith(b"HTTP/1.1 200"), first[:80]
        head = request_head("GET", "/v2/health/live", X_Padding="p" * 40)
        sent = 0
        while sent < len(head):
            sock.sendall(head[sent : sent + 1])
            sent += 1
            if select.select([sock], [], [], 0.5)[0]:
                break
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert sent < len(head)


@pytest.mark.parametrize("server", ["hub", "cdn"])
def test_a_dropped_client_still_sending_reads_its_408(
    server: str, request: pytest.FixtureRequest
) -> None:
    """The slow client's next bytes cross the 408 on the wire (the race a slowloris
    client meets on any loaded machine): the server's close lingers, so they cost no
    reset, and the 408 is still there to read."""
    url = request.getfixturevalue(f"{server}_url")
    with socket.create_connection(_address(url), timeout=BOUND_S) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nHost: te")
        assert select.select([sock], [], [], BOUND_S)[0], "never dropped"  # the 408 is in
        for _ in range(20):  # what the client had in flight
            sock.sendall(b"p" * 1000)
        answer = _read_all(sock)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert answer.endswith(b'good time"}')  # whole


@pytest.mark.parametrize("server", ["hub", "cdn"])
def test_a_body_trickling_below_the_minimum_rate_is_dropped(
    server: str, request: pytest.FixtureRequest
) -> None:
    url = request.getfixturevalue(f"{server}_url")
    body = json.dumps(infer_json(rows(1))).encode().ljust(400)
    path = INFER if server == "hub" else "/v1/models/mnist/versions"
    head = request_head(
        "POST", path, len(body), Content_Type="application/json", Authorization=f"Bearer {ADMIN}"
    )
    answer, sent = send_slowly(url, body, piece=2, every_s=0.3, prelude=head)
    assert answer.startswith(b"HTTP/1.1 408"), answer[:80]
    assert sent < len(body)


def test_a_long_body_sent_steadily_above_the_minimum_rate_is_served(hub: Hub, hub_url: str) -> None:
    # 3,000 bytes at ~2,000 B/s: longer than body_s alone, well inside body_s + 3 s.
    body = json.dumps(infer_json(rows(1))).encode().ljust(3000)
    head = request_head("POST", INFER, len(body), Content_Type="application/json")
    answer, sent = send_slowly(hub_url, body, piece=200, every_s=0.1, prelude=head)
    # every piece was sent, so the client paused 0.1 s after each but the last (an answer
    # before the end would have stopped it): it did outlast the fixed part, by construction
    assert sent == len(body)
    assert (len(body) // 200 - 1) * 0.1 > TIMEOUTS.body_s
    assert answer.startswith(b"HTTP/1.1 200"), answer[:200]


# -- content types -------------------------------------------------------------------------

CROSS_SITE_TYPES = [
    "text/plain",
    "text/plain;charset=UTF-8",
    "application/x-www-form-urlencoded",
    "multipart/form-data; boundary=x",
    "application/xml",
]


@pytest.mark.parametrize("content_type", CROSS_SITE_TYPES)
def test_a_cross_site_simple_body_is_refused_with_415_by_the_hub(
    hub_url: str, content_type: str
) -> None:
    with httpx.Client(base_url=hub_url, timeout=BOUND_S) as client:
        r = client.post(
            INFER,
            content=json.dumps(infer_json(rows(1))).encode(),
            headers={"Content-Type": content_type},
        )
        assert r.status_code == 415, r.text
        assert "Content-Type" in r.json()["error"]
        assert_still_serving(client)


@pytest.mark.parametrize(
    "content_type", [None, "application/json", "application/json; charset=utf-8"]
)
def test_json_or_no_content_type_is_served_by_the_hub(
    hub_url: str, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"Content-Type": content_type}
    r = httpx.post(
        hub_url + INFER,
        content=json.dumps(infer_json(rows(1))).encode(),
        headers=headers,
        timeout=BOUND_S,
    )
    assert r.status_code == 200, r.text


def test_the_binary_extension_is_served_by_the_hub(hub_url: str) -> None:
    x = rows(2)
    header: dict[str, Any] = {
        "inputs": [
            {
                "name": "x",
                "shape": list(x.shape),
                "datatype": "FP32",
                "parameters": {"binary_data_size": x.nbytes},
            }
        ]
    }
    body, headers = binary_body(header, x.tobytes())
    headers["Content-Type"] = "application/octet-stream"
    r = httpx.post(hub_url + INFER, content=body, headers=headers, timeout=BOUND_S)
    assert r.status_code == 200, r.text


def test_media_types_are_read_without_parameters_or_case() -> None:
    json_only = frozenset({"application/json"})
    assert body_media_type("Application/JSON ; charset=utf-8", json_only) == "application/json"
    assert body_media_type("application/vnd.api+json", json_only) == "application/json"
    assert body_media_type(None, json_only) is None
    assert body_media_type("  ", json_only) is None
    with pytest.raises(UnsupportedMediaTypeError, match="text/plain"):
        body_media_type("text/plain", json_only)
    with pytest.raises(UnsupportedMediaTypeError):
        body_media_type("application/octet-stream", json_only)


@pytest.mark.parametrize(
    "options",
    [{"header_s": 0}, {"body_s": -1}, {"body_min_rate_bps": 0}, {"keep_alive_s": 0}],
)
def test_timeouts_that_cannot_work_are_refused(options: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        HttpTimeouts(**options)


def test_the_body_allowance_grows_with_what_was_received() -> None:
    t = HttpTimeouts(body_s=2.0, body_min_rate_bps=1000)
    assert t.body_deadline_s(0) == 2.0
    assert t.body_deadline_s(5000) == 7.0
