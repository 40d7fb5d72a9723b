"""The multi-process hub: several ingress processes feed one executor, through shared memory.

Every test runs real processes (``HubSupervisor``: executor and ingress
processes), a real Mosquitto and real ONNX Runtime sessions.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from cloud_hub.metrics._book import merge_books, read_books
from cloud_hub.plane._supervisor import HubSupervisor

from ._brokers import MosquittoProcess, free_port
from ._plane import Requester, linear_repo, running_hub, wait_until

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def two_ingress_hub(
    tmp_path_factory: pytest.TempPathFactory, mosquitto: MosquittoProcess
) -> Iterator[tuple[HubSupervisor, int]]:
    repo = linear_repo(tmp_path_factory.mktemp("plane-repo"))
    port = free_port()
    with running_hub(repo, mosquitto.url, mqtt=2, http_port=port) as hub:
        yield hub, port


def _rows(rng: np.random.Generator) -> np.ndarray:
    return rng.normal(size=(int(rng.integers(1, 4)), 16)).astype(np.float32)


def test_every_reply_reaches_its_own_request_through_two_ingress_processes(
    two_ingress_hub: tuple[HubSupervisor, int], mosquitto: MosquittoProcess
) -> None:
    hub, _ = two_ingress_hub
    subscribed = "tandem_hub_mqtt_ingress_subscribed"
    wait_until(  # on a loaded machine one may subscribe seconds after the hub said ready
        lambda: merge_books(read_books(hub.metrics_dir)).gauges.get((subscribed, ())) == 2,
        what="both ingress processes subscribed",
    )
    rng = np.random.default_rng(1)
    requesters = [Requester(mosquitto.url, hub.spec.prefix) for _ in range(4)]
    try:
        ids = [r.send(_rows(rng)) for _ in range(150) for r in requesters]
        wait_until(lambda: sum(r.answered() for r in requesters) == len(ids), what="all replies")
        for requester in requesters:
            ok, errors = requester.check_correct()  # rows in their own order, their own values
            assert (ok, errors) == (len(requester.sent), 0)
    finally:
        for requester in requesters:
            requester.close()
    books = {book.role: book for book, _ in read_books(hub.metrics_dir)}

    def served(role: str) -> float:
        book = books.get(role)
        return (
            0.0
            if book is None
            else sum(
                v for (n, _), v in book.counters.items() if n == "tandem_inference_request_success"
            )
        )

    wait_until(
        lambda: (
            books.update({b.role: b for b, _ in read_books(hub.metrics_dir)})
            or served("ingress-mqtt-0") + served("ingress-mqtt-1") >= len(ids)
        ),
        what="both ingress processes' metrics",
    )
    assert served("ingress-mqtt-0") > 0 and served("ingress-mqtt-1") > 0  # the group split them

    def counted(name: str) -> float:  # by the executor, whose book is written on its own
        counters = merge_books(read_books(hub.metrics_dir)).counters
        return sum(v for (n, _), v in counters.items() if n == name)

    wait_until(lambda: counted("tandem_inference_count") >= len(ids), what="the executor's book")
    rows, execs = counted("tandem_inference_count"), counted("tandem_inference_exec_count")
    assert rows > execs  # requests from both processes shared batches in the one executor


def test_metrics_cover_every_process_of_the_hub(
    two_ingress_hub: tuple[HubSupervisor, int], mosquitto: MosquittoProcess
) -> None:
    hub, port = two_ingress_hub
    requester = Requester(mosquitto.url, hub.spec.prefix)
    rng = np.random.default_rng(2)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as http:

        def counted(transport: str) -> float:
            text = http.get("/metrics").text
            return sum(
                float(line.rsplit(" ", 1)[1])
                for line in text.splitlines()
                if line.startswith("tandem_inference_request_success_total{")
                and f'transport="{transport}"' in line
            )

        before = counted("mqtt"), counted("http")
        try:
            ids = [requester.send(_rows(rng)) for _ in range(40)]
            x = _rows(rng)
            body = {"inputs": [{"name": "x", "datatype": "FP32", "shape": list(x.shape),
                                "data": x.ravel().tolist()}]}  # fmt: skip
            for _ in range(10):
                assert http.post("/v2/models/linear/infer", json=body).status_code == 200
            wait_until(lambda: requester.answered(ids) == len(ids), what="MQTT replies")
        finally:
            requester.close()
        wait_until(
            lambda: counted("mqtt") - before[0] >= 40 and counted("http") - before[1] >= 10,
            what="/metrics counting both transports",
        )
        text = http.get("/metrics").text
    assert 'tandem_executor_info{device="CPUExecutionProvider"' in text
    assert "tandem_inference_exec_count_total" in text and "tandem_batch_size_bucket" in text


def _child(hub: HubSupervisor, role: str, index: int = 0) -> int:
    child = next(c for c in hub.children if c.role == role and c.index == index)
    assert child.pid is not None
    return child.pid


def _restarted(hub: HubSupervisor, role: str, old_pid: int) -> bool:
    child = next(c for c in hub.children if c.role == role and c.index == 0)
    return child.alive and child.pid != old_pid


@pytest.mark.parametrize("role", ["mqtt", "executor"])
def test_a_killed_process_is_restarted_and_nothing_is_answered_wrongly(
    role: str, tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    repo = linear_repo(tmp_path / "repo")
    rng = np.random.default_rng(3)
    with running_hub(repo, mosquitto.url, mqtt=1) as hub:
        requester = Requester(mosquitto.url, hub.spec.prefix)
        try:
            first = [requester.send(_rows(rng), timeout_ms=1500) for _ in range(100)]
            victim = _child(hub, role)
            os.kill(victim, signal.SIGKILL)
            during = [requester.send(_rows(rng), timeout_ms=1500) for _ in range(100)]
            wait_until(lambda: _restarted(hub, role, victim), what=f"the {role} restart")
            after: list[str] = []

            def served_again() -> bool:
                after.append(requester.send(_rows(rng), timeout_ms=1500))
                ok = [i for i in after if i in requester.replies and requester.replies[i].ok]
                return len(ok) >= 5

            wait_until(served_again, what="the hub serving again")
            ok, _errors = requester.check_correct()  # every answer is its own request's
            assert ok >= 5
            for request_id in first + during:  # an answer in the crash's shadow: right or refused
                reply = requester.replies.get(request_id)
                assert reply is None or reply.ok or reply.error.value == "overloaded"
        finally:
            requester.close()
        assert next(c for c in hub.children if c.role == role).restarts >= 1


def test_no_descriptor_or_memory_file_leaks_after_crashes(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    repo = linear_repo(tmp_path / "repo")
    rng = np.random.default_rng(4)
    with running_hub(repo, mosquitto.url, mqtt=1) as hub:
        requester = Requester(mosquitto.url, hub.spec.prefix)
        try:
            ingress = _child(hub, "mqtt")

            def serve(n: int) -> None:
                ids = [requester.send(_rows(rng)) for _ in range(n)]
                wait_until(lambda: requester.answered(ids) == n, what=f"{n} replies")

            serve(50)
            before = _fds(ingress), _memfd_maps(ingress)
            for _ in range(3):  # the executor crashes, comes back, the ingress reconnects
                victim = _child(hub, "executor")
                os.kill(victim, signal.SIGKILL)
                wait_until(lambda v=victim: _restarted(hub, "executor", v), what="restart")
                wait_until(lambda: _served_once(requester, rng), what="serving again")
            serve(50)
            assert (_fds(ingress), _memfd_maps(ingress)) == before
        finally:
            requester.close()


def _served_once(requester: Requester, rng: np.random.Generator) -> bool:
    request_id = requester.send(_rows(rng), timeout_ms=500)
    wait_until(lambda: request_id in requester.replies, timeout_s=5, what="a reply")
    return requester.replies[request_id].ok


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _memfd_maps(pid: int) -> int:
    maps = Path(f"/proc/{pid}/maps").read_text().splitlines()
    return len({line.split()[4] for line in maps if "/memfd:tandem-ring" in line})  # inodes


def _versioned_logits(x: np.ndarray, seed: int) -> np.ndarray:
    from ._models import linear_classifier_weights

    weight, bias = linear_classifier_weights(seed=seed)
    return (x @ weight + bias).astype(np.float32)


def _publish_version(repo: Path, version: int, *, seed: int, broken: bool = False) -> None:
    """Copy a version in as an operator should: built beside, then renamed into place."""
    from ._models import write_linear_classifier

    staging = repo / f".staging-{version}"
    if broken:
        staging.mkdir()
        (staging / "model.onnx").write_bytes(b"not an onnx model")
    else:
        write_linear_classifier(staging / "model.onnx", seed=seed)
    staging.rename(repo / "linear" / str(version))


def test_a_new_version_is_swapped_in_while_devices_stream_and_none_fails(
    tmp_path: Path, mosquitto: MosquittoProcess
) -> None:
    repo = linear_repo(tmp_path / "repo")
    rng = np.random.default_rng(5)
    with running_hub(repo, mosquitto.url, mqtt=2) as hub:
        requester = Requester(mosquitto.url, hub.spec.prefix)
        try:
            ids: list[str] = []

            def seen(version: str) -> bool:
                ids.extend(requester.send(_rows(rng)) for _ in range(5))
                return any(r.model_version == version for r in list(requester.replies.values()))

            wait_until(lambda: seen("1"), what="version 1 serving")
            _publish_version(repo, 2, seed=7)
            wait_until(lambda: seen("2"), what="version 2 swapped in")
            _publish_version(repo, 3, seed=8, broken=True)  # fails to load: 2 keeps serving
            failures = ("tandem_hub_version_load_failures", ("linear",))
            wait_until(
                lambda: hub.book.counters.get(failures, 0) >= 1 and not seen("3"),
                what="version 3 failing to load while 2 serves",
            )
            for _ in range(20):
                seen("2")
            wait_until(lambda: requester.answered(ids) == len(ids), what="every reply")
        finally:
            requester.close()
        replies = [requester.replies[i] for i in ids]
        assert all(r.ok for r in replies), [r.error_message for r in replies if not r.ok][:3]
        assert {r.model_version for r in replies} == {"1", "2"}
        for request_id, reply in zip(ids, replies, strict=True):
            seed = {"1": 0, "2": 7}[reply.model_version or ""]
            want = _versioned_logits(requester.sent[request_id], seed)
            np.testing.assert_allclose(reply.tensors["logits"], want, rtol=1e-5, atol=1e-5)
        executors = [c for c in hub.children if c.role == "executor"]
        wait_until(lambda: len([c for c in hub.children if c.role == "executor"]) == 1,
                   what="version 1's executor retiring")  # fmt: skip
        assert hub.served["linear"].version == "2" and executors
