"""A real ``tandem hub`` process plane serving one language model, for the text bench parts.

``TandemHub`` starts ``python -m tandem.cli hub`` in a process group of its own
(so that the whole hub, supervisor and children, can be SIGKILLed at once by
that group's id), waits until ``/v2/health/ready`` answers 200, finds its
language executor by its command line (``cloud_hub.plane._child llm 0``) and
reads its restart counter from ``/metrics``. Its temporary files (metrics
books, rings) go under the part's work directory (``TMPDIR``), so the ones a
killed hub leaves behind go with it. ``Spy`` is a plain MQTT client that
records every frame on a device's text and generate topics.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ._procs import ROOT, children, free_port, hub_metrics, wait_http_ok

__all__ = ["MODEL", "Spy", "TandemHub", "language_repo"]

MODEL = "hub"
READY_S = 120.0


def language_repo(root: Path, model: Path, max_output_tokens: int) -> Path:
    """``<root>/repo/hub/1`` (the model folder) and its config: one language model."""
    repo = root / "repo"
    shutil.copytree(model, repo / MODEL / "1")
    (repo / MODEL / "config.json").write_text(json.dumps({
        "platform": "onnxruntime_genai", "engine": "onnxruntime-genai",
        "generation": {"max_output_tokens": max_output_tokens},
    }))  # fmt: skip
    return repo


def _descendants(pid: int) -> list[int]:
    found = [pid]
    for parent in found:
        with contextlib.suppress(OSError):
            found.extend(children(parent))
    return found[1:]


class TandemHub:
    """``tandem hub`` on ``repo`` and ``broker_url``; its prefix and HTTP port kept on restarts."""

    def __init__(self, repo: Path, broker_url: str, workdir: Path, prefix: str) -> None:
        self.repo, self.broker_url, self.workdir, self.prefix = repo, broker_url, workdir, prefix
        self.port = free_port()
        self.log = workdir / "tandem-hub.log"
        self.tmp = workdir / "hub-tmp"
        self.tmp.mkdir(parents=True, exist_ok=True)
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> TandemHub:
        command = [
            sys.executable, "-m", "tandem.cli", "hub", "--repo", str(self.repo),
            "--broker", self.broker_url, "--prefix", self.prefix,
            "--http-port", str(self.port), "--http-host", "127.0.0.1", "--workers", "2",
            "--log-level", "warning", "--restart-max-s", "2",
        ]  # fmt: skip
        env = {k: v for k, v in os.environ.items() if not k.startswith("TANDEM_")}
        env.update(PYTHONPATH=str(ROOT), TMPDIR=str(self.tmp))
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=out, start_new_session=True
            )
        self.ready()
        return self

    def check_alive(self) -> None:
        if self.process is None or self.process.poll() is not None:
            tail = self.log.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"tandem hub exited:\n{tail}")

    def ready(self) -> None:
        wait_http_ok(self.port, "/v2/health/ready", READY_S, self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def executor_pid(self) -> int:
        """The language executor's PID (waits for the one a restart starts)."""
        assert self.process is not None
        deadline = time.monotonic() + READY_S
        while time.monotonic() < deadline:
            self.check_alive()
            for pid in _descendants(self.process.pid):
                with contextlib.suppress(OSError):
                    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                    if b"cloud_hub.plane._child" in argv and b"llm" in argv:
                        return pid
            time.sleep(0.02)
        raise TimeoutError("no language executor process")

    def restarts(self) -> float:
        """``tandem_hub_process_restarts_total{role="llm"}`` (0 when absent)."""
        for line in hub_metrics(self.port).splitlines():
            if line.startswith("tandem_hub_process_restarts_total{") and 'role="llm"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def executor_back(self, pid: int, before: float) -> None:
        """Wait until the supervisor counted the restart, a new executor runs, and ready."""
        deadline = time.monotonic() + READY_S
        while self.restarts() <= before or self.executor_pid() == pid:
            if time.monotonic() > deadline:
                raise TimeoutError("the language executor was not restarted")
            time.sleep(0.02)
        self.ready()

    def kill_all(self) -> None:
        """SIGKILL the whole process group (supervisor and every child) and reap it."""
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


class Spy:
    """A paho client on ``topics`` that keeps ``(request id, kind, seq, text)`` of each frame.

    On a device's text topic: the hub's chunks (their text) and finals; on its
    generate topic: the device's requests (``kind`` "request", seq -1), in the
    order they were published.
    """

    def __init__(self, broker_url: str, topics: list[str]) -> None:
        from shared import MqttSettings, create_client

        settings = MqttSettings.from_url(broker_url)
        self.frames: list[tuple[str, str, int, str]] = []
        self._lock = threading.Lock()
        self.client = create_client(settings, f"bench-spy-{os.getpid()}", protocol="5")
        subscribed = threading.Event()
        self.client.on_connect = lambda c, *_: c.subscribe([(t, 1) for t in topics])
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.on_message = self._on_message
        self.client.connect(settings.host, settings.port)
        self.client.loop_start()
        if not subscribed.wait(10):
            raise RuntimeError("the spy could not subscribe")

    def _on_message(self, _c: Any, _u: Any, message: Any) -> None:
        from shared import GenerateChunk, GenerateFinal, GenerateRequest, decode_text_message

        try:
            frame = decode_text_message(message.payload)
        except Exception:  # a bad frame is the hub's to count, not ours
            return
        if isinstance(frame, GenerateChunk):
            seen = (frame.request_id, "chunk", frame.seq, frame.text)
        elif isinstance(frame, GenerateFinal):
            seen = (frame.request_id, "final", frame.seq, "")
        elif isinstance(frame, GenerateRequest):
            seen = (frame.request_id, "request", -1, "")
        else:
            return
        with self._lock:
            self.frames.append(seen)

    def requests(self) -> list[str]:
        """The request ids the device published, each once, in order."""
        with self._lock:
            ids = [rid for rid, kind, _, _ in self.frames if kind == "request"]
        return list(dict.fromkeys(ids))

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()
