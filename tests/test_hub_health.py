"""The hub's health before its broker answers, and a repository that ``--cdn`` fills.

``tandem hub`` runs as a real process tree against a broker port where nothing
listens: liveness must answer as soon as the process is up (a Kubernetes
liveness probe would otherwise restart-loop a hub whose broker is late), and
readiness must say what is missing. A hub that pulls from a CDN creates its
``--repo`` when it does not exist; a hub with no model at all is not ready.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from model_cdn import create_app

from ._brokers import MosquittoProcess, free_port
from ._cdn import serve_in_thread
from ._plane import linear_repo, wait_until
from .test_hub_pull import _Cdn

ROOT = Path(__file__).resolve().parents[1]


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return 0, ""


class _Hub:
    def __init__(self, tmp: Path, *args: str) -> None:
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}/v2/health"
        self.log = tmp / "hub.log"
        command = [
            sys.executable, "-m", "tandem.cli", "hub", "--http-port", str(self.port),
            "--workers", "2", "--log-level", "info", "--repo-poll-s", "0.5", *args,
        ]  # fmt: skip
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )

    def ready(self) -> tuple[int, str]:
        return _get(self.base + "/ready")

    def live(self) -> bool:
        assert self.process.poll() is None, self.log.read_text()
        return _get(self.base + "/live") == (200, json.dumps({"live": True}, separators=(",", ":")))

    def close(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


@pytest.fixture
def cdn(tmp_path: Path) -> Iterator[tuple[_Cdn, str]]:
    made = _Cdn(tmp_path)
    made.publish(1)
    app = create_app(registry=made.registry, store=made.store, admin_token=None)
    with serve_in_thread(app) as url:
        yield made, url
    made.registry.close()


def test_with_the_broker_down_liveness_answers_and_readiness_names_the_broker(
    cdn: tuple[_Cdn, str], tmp_path: Path
) -> None:
    made, url = cdn
    dead = free_port()  # nothing listens there
    repo = tmp_path / "not" / "yet" / "repo"
    hub = _Hub(
        tmp_path, "--repo", str(repo), "--broker", f"mqtt://127.0.0.1:{dead}",
        "--cdn", url, "--model", "lin", "--trusted-key", str(made.key_file),
    )  # fmt: skip
    try:
        wait_until(hub.live, 60.0, "liveness while the broker is down")
        # Before any MQTT ingress gave up waiting for its subscription (and said so):
        # liveness does not wait for the broker.
        assert "not subscribed to" not in hub.log.read_text()
        assert (repo / "lin" / "1" / "model.onnx").is_file()  # --repo made, then filled
        status, body = hub.ready()
        assert status == 503 and "broker" in body and "models" not in body, body
        # The broker comes up: the hub subscribes and says it is ready.
        broker = MosquittoProcess(tmp_path, port=dead).start()
        try:
            wait_until(lambda: hub.ready()[0] == 200, 60.0, "readiness once the broker is up")
        finally:
            broker.stop()
    finally:
        hub.close()


def test_a_hub_with_no_model_is_live_but_not_ready(mosquitto: MosquittoProcess, tmp_path: Path):
    empty = tmp_path / "empty"
    empty.mkdir()
    hub = _Hub(tmp_path, "--repo", str(empty), "--broker", mosquitto.url)
    try:
        wait_until(hub.live, 60.0, "liveness")
        wait_until(lambda: "broker" not in hub.ready()[1], 30.0, "the broker subscribed")
        status, body = hub.ready()
        assert status == 503 and "no" in body and "models" in body, body
        assert "legacy topics" not in hub.log.read_text()  # off by default
        linear_repo(tmp_path / "later")  # a model arrives in the repository: ready
        (tmp_path / "later" / "linear").rename(empty / "linear")
        wait_until(lambda: hub.ready()[0] == 200, 60.0, "readiness once a model is served")
    finally:
        hub.close()


def test_without_cdn_a_missing_repo_is_one_line_and_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = subprocess.run(
        [sys.executable, "-m", "tandem.cli", "hub", "--repo", str(missing)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2 and "--repo" in result.stderr and "--cdn" in result.stderr
    assert not missing.exists()


def test_sigterm_while_waiting_for_the_broker_ends_the_start_and_restarts_nothing(
    tmp_path: Path,
) -> None:
    repo = linear_repo(tmp_path / "repo")
    dead = f"mqtt://127.0.0.1:{free_port()}"
    hub = _Hub(tmp_path, "--repo", str(repo), "--broker", dead, "--legacy-topics")
    try:
        wait_until(hub.live, 60.0, "liveness")
        wait_until(lambda: "models" not in hub.ready()[1], 60.0, "the models loaded")
        # The MQTT ingress is up (it warns of the legacy opt-in as it starts), still waiting
        # for its broker: SIGTERM then, not while it is being started.
        wait_until(lambda: "legacy topics on" in hub.log.read_text(), 60.0, "the ingress warned")
        hub.process.send_signal(signal.SIGTERM)  # the supervisor still waits for its ingresses
        assert hub.process.wait(60) == 0
        text = hub.log.read_text()
        # It did not sit out the ingresses' wait for their subscription, nor restart one.
        assert "not subscribed to" not in text and "restarting it" not in text, text
        assert "legacy topics on" in text  # the migration opt-in warns in each ingress
    finally:
        hub.close()
