"""Real MQTT brokers for tests: a Mosquitto of our own on a free port.

A broker may also require credentials (``password_file``, see
``write_password_file``, or ``dynsec_file``: the dynamic-security plugin's
state, found by ``dynsec_plugin``) and speak TLS only (``tls``: a
``BrokerTls`` of PEM paths); its ``url`` then reads ``mqtts://``.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tandem.broker import mosquitto_password_hash, render_broker_limits

__all__ = [
    "BrokerTls",
    "MosquittoProcess",
    "dynsec_plugin",
    "free_port",
    "mosquitto_password_hash",
    "wait_for_port",
    "write_password_file",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def dynsec_plugin() -> Path | None:
    """Mosquitto's dynamic-security plugin where the distribution installs it, or None."""
    named = os.environ.get("TANDEM_MOSQUITTO_DYNSEC")
    candidates = [named] if named else []
    for lib in ("/usr/lib", "/usr/local/lib", "/opt/homebrew/lib"):
        candidates += sorted(glob.glob(f"{lib}/*/mosquitto_dynamic_security.so"))
        candidates.append(f"{lib}/mosquitto_dynamic_security.so")
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def wait_for_port(port: int, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.02)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port} after {timeout_s}s")


def write_password_file(
    path: Path, users: Mapping[str, str], *, use_mosquitto_passwd: bool = True
) -> Path:
    """Write a Mosquitto password file for ``users`` (name -> password).

    Uses ``mosquitto_passwd -b`` when it is installed (and wanted), else hashes in
    Python with the same PBKDF2-SHA512 ``$7$`` format Mosquitto 2 reads.
    """
    if not users:
        raise ValueError("a password file needs at least one user")
    tool = shutil.which("mosquitto_passwd") if use_mosquitto_passwd else None
    path.unlink(missing_ok=True)
    if tool is not None:
        for i, (user, password) in enumerate(users.items()):
            flags = ["-b", "-c"] if i == 0 else ["-b"]
            subprocess.run(
                [tool, *flags, str(path), user, password],
                check=True,
                capture_output=True,
                timeout=30,
            )
    else:
        path.write_text(
            "".join(f"{user}:{mosquitto_password_hash(pw)}\n" for user, pw in users.items())
        )
    path.chmod(0o600)  # newer Mosquittos warn about (and will refuse) readable files
    return path


@dataclass(frozen=True)
class BrokerTls:
    """PEM files for a TLS listener: the CA the broker trusts, its certificate and key."""

    cafile: Path
    certfile: Path
    keyfile: Path


class MosquittoProcess:
    """A mosquitto started from its own config on a free port; stopped by its PID.

    By default it listens in plain MQTT and lets anyone in. ``password_file``
    turns anonymous access off and checks credentials against that file;
    ``tls`` makes the one listener a TLS listener. ``extra_config`` is appended.
    It carries the generated size limit (``tandem.broker._conf``) unless
    ``size_limit=False``.
    """

    def __init__(
        self,
        workdir: Path,
        *,
        port: int | None = None,
        extra_config: str = "",
        password_file: Path | None = None,
        tls: BrokerTls | None = None,
        dynsec_file: Path | None = None,
        size_limit: bool = True,
    ) -> None:
        exe = shutil.which("mosquitto") or "/usr/sbin/mosquitto"
        if not Path(exe).exists():
            raise RuntimeError("mosquitto is not installed (make test installs it)")
        self.exe = exe
        self.port = port or free_port()
        self.workdir = workdir
        self.tls = tls
        self.password_file = password_file
        self.config = workdir / f"mosquitto-{self.port}.conf"
        listener = f"listener {self.port} 127.0.0.1\n"
        if tls is not None:
            listener += f"cafile {tls.cafile}\ncertfile {tls.certfile}\nkeyfile {tls.keyfile}\n"
        if password_file is not None:
            auth = f"allow_anonymous false\npassword_file {password_file}\n"
        elif dynsec_file is not None:
            plugin = dynsec_plugin()
            if plugin is None:
                raise RuntimeError("Mosquitto's dynamic-security plugin is not installed")
            auth = f"allow_anonymous false\nplugin {plugin}\nplugin_opt_config_file {dynsec_file}\n"
        else:
            auth = "allow_anonymous true\n"
        secured = password_file is not None or dynsec_file is not None
        if (tls is not None or secured) and os.geteuid() == 0:
            # Run as root, Mosquitto drops to the "mosquitto" user before it reads
            # the password file, which then cannot see into pytest's 0700 tmp dirs.
            auth += "user root\n"
        self.config.write_text(
            listener + auth + "set_tcp_nodelay true\n"
            "persistence false\n"
            "max_queued_messages 100000\n"
            # what 'tandem fleet provision --broker-conf' writes (size_limit=False: none)
             + (render_broker_limits() if size_limit else "") + extra_config
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        scheme = "mqtts" if self.tls is not None else "mqtt"
        return f"{scheme}://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"mosquitto-{self.port}.log"

    def start(self) -> MosquittoProcess:
        log = self.log_path.open("ab")
        self.process = subprocess.Popen(
            [self.exe, "-c", str(self.config)], stdout=log, stderr=subprocess.STDOUT
        )
        log.close()
        try:
            wait_for_port(self.port)
        except TimeoutError as e:
            if self.process.poll() is None:
                raise
            # It exited (a bad config, an unreadable file): say why, from its log.
            self.process = None
            tail = self.log_path.read_text(errors="replace")[-2000:]
            raise RuntimeError(f"mosquitto exited at start:\n{tail}") from e
        return self

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
