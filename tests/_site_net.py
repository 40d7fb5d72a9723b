"""A site behind an uplink that a test can cut: a network namespace and two veth pairs.

::

    this namespace (the test, the cloud)            namespace tgw<suffix> (the site)
      <uplink>.1  ─── veth tu<suffix>r/s ───  <uplink>.2   the gateway's way to the cloud
      <lan>.1     ─── veth tl<suffix>r/s ───  <lan>.2      devices reach the site broker here

The site namespace has no default route: the gateway reaches the cloud
broker over the uplink only, so ``cut()`` (the site end of the uplink down)
leaves it no way there, while devices keep reaching it over the LAN.
Everything is named with a random suffix and removed by name in ``close()``;
a process started in the namespace (``command``) is the caller's to stop.

``SiteNetwork.unavailable()`` says why a test cannot have one here (not
root, no ``ip``), or ``None``. This kernel has no ``netem``; a cut is a link
taken down, which a TCP connection on it notices only by its keepalive.
"""

from __future__ import annotations

import os
import random
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

__all__ = ["GatewayBroker", "SiteNetwork"]

_TCP_ESTABLISHED = "01"


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class SiteNetwork:
    def __init__(self) -> None:
        suffix = uuid.uuid4().hex[:8]
        self.namespace = f"tgw{suffix}"
        self.uplink_cloud, self.uplink_site = f"tu{suffix}r", f"tu{suffix}s"
        self.lan_devices, self.lan_site = f"tl{suffix}r", f"tl{suffix}s"
        # Two /30s in 10.200-249.x.y, clear of this machine's own addresses.
        taken = subprocess.run(["ip", "-o", "addr"], capture_output=True, text=True).stdout
        while True:
            a, b = random.randrange(200, 250), random.randrange(256)
            base = f"10.{a}.{b}"
            if f" {base}." not in taken:
                break
        self.cloud_address, self.gateway_uplink = f"{base}.1", f"{base}.2"
        self.device_side, self.gateway_address = f"{base}.5", f"{base}.6"
        self._created = False

    @staticmethod
    def unavailable() -> str | None:
        if shutil.which("ip") is None:
            return "needs iproute2's ip"
        if os.geteuid() != 0:
            return "needs root (network namespaces and veth pairs)"
        return None

    def create(self) -> SiteNetwork:
        ns = self.namespace
        _ip("netns", "add", ns)
        self._created = True
        for here, there, mine, theirs in (
            (self.uplink_cloud, self.uplink_site, self.cloud_address, self.gateway_uplink),
            (self.lan_devices, self.lan_site, self.device_side, self.gateway_address),
        ):
            _ip("link", "add", here, "type", "veth", "peer", "name", there)
            _ip("link", "set", there, "netns", ns)
            _ip("addr", "add", f"{mine}/30", "dev", here)
            _ip("link", "set", here, "up")
            _ip("-n", ns, "addr", "add", f"{theirs}/30", "dev", there)
            _ip("-n", ns, "link", "set", there, "up")
        _ip("-n", ns, "link", "set", "lo", "up")
        return self

    def cut(self) -> None:
        _ip("-n", self.namespace, "link", "set", self.uplink_site, "down")

    def restore(self) -> None:
        _ip("-n", self.namespace, "link", "set", self.uplink_site, "up")

    def command(self, *args: str) -> list[str]:
        """``args`` run inside the site's namespace (``ip netns exec`` keeps the PID)."""
        return ["ip", "netns", "exec", self.namespace, *args]

    def uplink_connections(self, cloud_port: int) -> int:
        """ESTABLISHED TCP connections between the gateway and the cloud port, counted on
        both ends (the cloud's side in this namespace, the gateway's in the site's)."""
        here = Path("/proc/net/tcp").read_text()
        there = subprocess.run(
            self.command("cat", "/proc/net/tcp"), capture_output=True, text=True, timeout=30
        ).stdout
        return _established(here, self.cloud_address, cloud_port) + _established(
            there, self.cloud_address, cloud_port, remote=True
        )

    def close(self) -> None:
        for link in (self.uplink_cloud, self.lan_devices):  # deleting one end removes the pair
            subprocess.run(["ip", "link", "del", link], capture_output=True, timeout=30)
        if self._created:
            subprocess.run(["ip", "netns", "del", self.namespace], capture_output=True, timeout=30)
            self._created = False


def _hex_endpoint(address: str, port: int) -> str:
    """``/proc/net/tcp``'s spelling of an IPv4 endpoint (little-endian address, hex port)."""
    packed = socket.inet_aton(address)[::-1].hex().upper()
    return f"{packed}:{port:04X}"


def _established(table: str, address: str, port: int, *, remote: bool = False) -> int:
    """Rows of a ``/proc/net/tcp`` table in ESTABLISHED state with ``address:port`` as
    their local end (or, with ``remote``, their remote end)."""
    endpoint = _hex_endpoint(address, port)
    count = 0
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) > 3 and fields[3] == _TCP_ESTABLISHED:
            count += fields[2 if remote else 1] == endpoint
    return count


class GatewayBroker:
    """The site broker: Mosquitto on ``address`` (in the site's namespace with ``net``),
    with persistence, the site's users (the plugin's file) and the bridge file appended."""

    def __init__(
        self,
        workdir: Path,
        *,
        address: str,
        port: int,
        plugin: Path,
        dynsec_file: Path,
        bridge_file: Path,
        net: SiteNetwork | None = None,
    ) -> None:
        self.address, self.port, self.workdir, self.net = address, port, workdir, net
        self.store = workdir / "gateway-store"
        self.store.mkdir(exist_ok=True)
        self.config = workdir / "gateway.conf"
        self.log_path = workdir / "gateway.log"
        self.config.write_text(
            "per_listener_settings false\n"
            "allow_anonymous false\n"
            f"plugin {plugin}\n"
            f"plugin_opt_config_file {dynsec_file}\n"
            + ("user root\n" if os.geteuid() == 0 else "")  # our 0600 files, 0700 directories
            + f"listener {port} {address}\n"
            "set_tcp_nodelay true\n"
            "persistence true\n"
            f"persistence_location {self.store}/\n"
            "max_queued_messages 10000\n"
            "log_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
            + bridge_file.read_text()
        )
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"mqtt://{self.address}:{self.port}"

    def start(self, *, within_s: float = 10.0) -> GatewayBroker:
        with self.log_path.open("ab") as log:
            command = ["mosquitto", "-c", str(self.config)]
            self.process = subprocess.Popen(
                self.net.command(*command) if self.net else command,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        end = time.monotonic() + within_s
        while time.monotonic() < end:
            if self.process.poll() is not None:
                raise RuntimeError(f"the gateway broker exited:\n{self.log_path.read_text()}")
            try:
                with socket.create_connection((self.address, self.port), 0.2):
                    return self
            except OSError:
                time.sleep(0.02)
        raise TimeoutError(f"the gateway broker did not listen within {within_s} s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None
