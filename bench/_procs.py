"""Servers the latency and throughput parts start for themselves, each stopped by its PID.

A Mosquitto on a free loopback port (``BrokerProcess``), the hub as users
start it (``python -m cloud_hub``, ``HubProcess``) and the bench's own
baselines (``python -m bench._baselines ...``: ``EchoProcess``,
``PlainServerProcess``, and ``OtlpSinkProcess``, where traced parts export spans). Every
process logs to a file in the part's work directory, so a failure to start
says why. ``write_model`` lays out a hub model repository entry; ``cpu_ns``,
``children``, ``pss_bytes`` and ``hub_metrics`` read a running process's CPU
time, child processes, proportional memory and (for a hub) Prometheus text;
``hub_processes`` names a multi-process hub's processes by role (py-spy
profiles are in ``bench._pyspy``).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "BrokerProcess",
    "EchoProcess",
    "HubProcess",
    "OtlpSinkProcess",
    "PlainServerProcess",
    "children",
    "cpu_ns",
    "free_port",
    "hub_metrics",
    "hub_processes",
    "mosquitto_version",
    "pss_bytes",
    "tree_cpu_ns",
    "wait_http_ok",
    "write_model",
]

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def cpu_ns(pid: int) -> int:
    """CPU time of every thread of ``pid`` so far, in ns (``/proc/PID/task/*/schedstat``)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):  # a thread that just ended
            total += int((task / "schedstat").read_text().split()[0])
    return total


def tree_cpu_ns(pid: int) -> int:
    """``cpu_ns`` of ``pid`` and of its children (a hub's supervisor and its processes)."""
    total = cpu_ns(pid)
    for child in children(pid):
        with contextlib.suppress(OSError):  # it ended meanwhile
            total += cpu_ns(child)
    return total


def children(pid: int) -> list[int]:
    """Child processes of ``pid`` (a hub's workers), from /proc."""
    found: list[int] = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):
            found += [int(c) for c in (task / "children").read_text().split()]
    return found


def pss_bytes(pid: int) -> int:
    """Proportional set size of ``pid`` (pages shared between processes counted once in all)."""
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("Pss:"):
            return int(line.split()[1]) * 1024
    raise OSError(f"no Pss line for process {pid}")


def hub_processes(pid: int) -> dict[str, list[int]]:
    """A hub's processes by role: ``supervisor`` (``pid``), ``executor 0``, ``mqtt 1``, ``http 0``.

    The roles come from each child's command line (``-m cloud_hub.plane._child
    ROLE INDEX``); a child of another kind keeps its PID as its label.
    """
    found = {"supervisor": [pid]}
    for child in children(pid):
        try:
            args = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except OSError:  # it ended meanwhile
            continue
        words = [a.decode(errors="replace") for a in args if a]
        if "cloud_hub.plane._child" in words[:-2]:
            found[" ".join(words[-2:])] = [child]
        else:
            found[f"pid {child}"] = [child]
    return found


def hub_metrics(port: int) -> str:
    """The text of a hub's ``GET /metrics`` on loopback."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/metrics")
        return conn.getresponse().read().decode()
    finally:
        conn.close()


def mosquitto_version() -> str | None:
    exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
    if not Path(exe).exists():
        return None
    done = subprocess.run([exe, "-h"], capture_output=True, text=True, timeout=10, check=False)
    for line in (done.stdout + done.stderr).splitlines():
        if line.startswith("mosquitto version"):
            return line.split()[-1]
    return "unknown"


def wait_http_ok(port: int, path: str, timeout_s: float, process: _Process | None = None) -> None:
    """Poll ``GET path`` on loopback until it answers 200."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process is not None:
            process.check_alive()
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1.0)
            conn.request("GET", path)
            if conn.getresponse().status == 200:
                conn.close()
                return
            conn.close()
        except OSError:
            pass
        time.sleep(0.05)
    raise TimeoutError(f"127.0.0.1:{port}{path} did not answer 200 within {timeout_s} s")


def _wait_port(port: int, timeout_s: float, process: _Process) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        process.check_alive()
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s} s")


def write_model(repo: Path, name: str, model: bytes | Path, config: dict[str, Any]) -> Path:
    """``<repo>/<name>/1/model.onnx`` plus ``<repo>/<name>/config.json``."""
    version = repo / name / "1"
    version.mkdir(parents=True, exist_ok=True)
    target = version / "model.onnx"
    if isinstance(model, Path):
        shutil.copyfile(model, target)
    else:
        target.write_bytes(model)
    (repo / name / "config.json").write_text(json.dumps(config))
    return target


class _Process:
    """A child process with a log file; ``stop`` terminates it by PID, then kills.

    ``command(port)`` builds the command line for a free port (``port`` is 0 for
    a process that listens on none); ``_ready`` waits until it serves. A start
    that fails because another process took the port meanwhile is retried on a
    new one.
    """

    log_name = "process.log"

    def __init__(self, workdir: Path, *, listens: bool = True) -> None:
        self.workdir = workdir
        self.listens = listens
        self.port = 0
        self.log = workdir / self.log_name
        self.process: subprocess.Popen[bytes] | None = None

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def _ready(self) -> None:
        raise NotImplementedError

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> Any:
        for attempt in range(3):
            self.port = free_port() if self.listens else 0
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    self.command(self.port), cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
                )
            try:
                self._ready()
                return self
            except BaseException as e:  # a failed start leaves no process behind
                taken = isinstance(e, RuntimeError) and "already in use" in self._log_tail().lower()
                self.stop()
                if not (taken and attempt < 2):
                    raise
        raise AssertionError("unreachable")

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-3000:]
        except OSError:
            return ""

    def check_alive(self) -> None:
        if self.process is not None and self.process.poll() is not None:
            raise RuntimeError(
                f"{self.log_name[:-4]} exited with {self.process.returncode}:\n{self._log_tail()}"
            )

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        os.kill(process.pid, signal.SIGTERM)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(10)

    def __enter__(self) -> Any:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.stop()


class BrokerProcess(_Process):
    """Mosquitto on a free loopback port, anonymous, Nagle off, no in-flight cap."""

    log_name = "mosquitto.log"

    def __init__(self, workdir: Path) -> None:
        self.exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(self.exe).exists():
            raise RuntimeError("mosquitto is not installed (scripts/ensure-broker installs it)")
        super().__init__(workdir)

    def command(self, port: int) -> list[str]:
        config = self.workdir / "mosquitto.conf"
        config.write_text(
            f"listener {port} 127.0.0.1\n"
            "allow_anonymous true\n"
            "set_tcp_nodelay true\n"  # Mosquitto >= 2.0; replies leave without Nagle's wait
            "persistence false\n"
            "max_inflight_messages 0\n"  # MQTT 3.1.1 clients: no cap on QoS 1 in flight
            "max_queued_messages 100000\n"
        )
        return [self.exe, "-c", str(config)]

    def _ready(self) -> None:
        _wait_port(self.port, 10.0, self)

    @property
    def url(self) -> str:
        return f"mqtt://127.0.0.1:{self.port}"


class HubProcess(_Process):
    """``python -m cloud_hub`` on a repository, with its HTTP API on a free port."""

    log_name = "hub.log"

    def __init__(
        self, repo: Path, broker_url: str, workdir: Path, *, args: Sequence[str] = ()
    ) -> None:
        self.repo = repo
        self.broker_url = broker_url
        self.args = list(args)  # more options: --workers 2, --device cuda, ...
        super().__init__(workdir)

    @property
    def http_port(self) -> int:
        return self.port

    def command(self, port: int) -> list[str]:
        return [
            sys.executable,
            "-m",
            "cloud_hub",
            "--repo",
            str(self.repo),
            "--broker",
            self.broker_url,
            "--http-port",
            str(port),
            "--log-level",
            "warning",
            *self.args,
        ]

    def _ready(self) -> None:
        wait_http_ok(self.port, "/v2/health/ready", 60.0, self)


class EchoProcess(_Process):
    """``python -m bench._baselines echo|echo-crt ...``: ready once it has subscribed."""

    log_name = "echo.log"

    def __init__(
        self, broker_url: str, request: str, reply: str, workdir: Path, *, mode: str = "echo"
    ) -> None:
        self.mode = mode
        self.log_name = f"{mode}.log"
        self.args = [broker_url, request, reply, str(workdir / f"{mode}.ready")]
        super().__init__(workdir, listens=False)

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "bench._baselines", self.mode, *self.args]

    def _ready(self) -> None:
        ready = Path(self.args[-1])
        deadline = time.monotonic() + 30.0
        while not ready.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise TimeoutError(f"the {self.mode} client did not subscribe within 30 s")
            time.sleep(0.02)


class OtlpSinkProcess(_Process):
    """``python -m bench._baselines otlp-sink PORT``: an OTLP/HTTP receiver that drops spans."""

    log_name = "otlp-sink.log"

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "bench._baselines", "otlp-sink", str(port)]

    def _ready(self) -> None:
        wait_http_ok(self.port, "/health", 30.0, self)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


class PlainServerProcess(_Process):
    """``python -m bench._baselines plain-http MODEL PORT``: FastAPI + ONNX Runtime."""

    log_name = "plain-http.log"

    def __init__(self, model: Path, workdir: Path) -> None:
        self.model = model
        super().__init__(workdir)

    def command(self, port: int) -> list[str]:
        return [sys.executable, "-m", "bench._baselines", "plain-http", str(self.model), str(port)]

    def _ready(self) -> None:
        wait_http_ok(self.port, "/health", 60.0, self)
