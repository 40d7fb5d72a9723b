"""MQTT connection settings shared by the edge uplink and the hub's MQTT front.

``MqttSettings.from_url("mqtts://user:pass@host:8883")`` reads a broker URL;
``create_client`` builds a paho-mqtt 2.x client from settings: credentials,
TLS, reconnect backoff and TCP_NODELAY (paho leaves Nagle on, which costs tens
of milliseconds per QoS 1 round trip on loopback). ``resolve_protocol`` finds
whether a broker speaks MQTT 5 when settings say ``"auto"``.
``TlsSettings`` (PEM paths: a CA, a certificate and its key) also serves the
HTTP servers and the device's CDN client; ``TlsSettings.from_files`` and
``MqttSettings.with_tls`` turn the commands' ``--…-ca/--…-cert/--…-key``
options into settings, checked once for all of them.

**Client ids.** A device holds one MQTT connection (agent, updater and
telemetry share it) whose client id is its device id, which is also its
MQTT username: ``device_client_id(device)``. The broker configuration that
``tandem fleet provision --dynsec-file`` writes binds each device's
credentials to that id, so no other device can connect under it and have
the broker disconnect the owner (a client-id takeover). Services (hubs, the
CDN) use ids starting with ``tandem-``, which no device id may.

paho-mqtt is imported inside the functions, so the codec half of ``shared``
works without it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import socket
import ssl
import struct
import threading
import uuid
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal
from urllib.parse import quote, unquote, urlsplit

from ._errors import ConfigError
from ._topics import validate_name

if TYPE_CHECKING:
    import paho.mqtt.client as paho
    import paho.mqtt.properties as paho_properties

__all__ = [
    "MqttSettings",
    "TlsSettings",
    "create_client",
    "device_client_id",
    "publish_properties",
    "resolve_protocol",
]

Protocol = Literal["auto", "5", "3.1.1"]


def device_client_id(device_id: str) -> str:
    """The MQTT client id of a device's one connection: its device id (= its username)."""
    return validate_name(device_id, "device id")


@dataclass(frozen=True, kw_only=True)
class TlsSettings:
    """TLS for a connection; paths are PEM files.

    For a client: the CA to trust and an optional client certificate. For a
    server (``HttpServer``): its certificate and key, and ``ca_certs`` the CA
    whose client certificates it requires.
    """

    ca_certs: str | None = None  # None: the system trust store
    certfile: str | None = None  # client certificate, for mutual TLS
    keyfile: str | None = None
    insecure: bool = False  # skip hostname checks (test brokers only)

    @classmethod
    def from_files(
        cls,
        *,
        ca_certs: str | os.PathLike[str] | None = None,
        certfile: str | os.PathLike[str] | None = None,
        keyfile: str | os.PathLike[str] | None = None,
    ) -> TlsSettings | None:
        """Settings from command-line file options; ``None`` when none is given.

        Raises ``ConfigError`` for a file that is not there, or a certificate
        without its key (or a key without its certificate).
        """
        given = {"CA": ca_certs, "certificate": certfile, "key": keyfile}
        if all(path is None for path in given.values()):
            return None
        if (certfile is None) != (keyfile is None):
            raise ConfigError("a TLS certificate needs its key, and a key its certificate")
        for what, path in given.items():
            if path is not None and not os.path.isfile(path):
                raise ConfigError(f"TLS {what} file not found: {os.fspath(path)}")

        def text(path: str | os.PathLike[str] | None) -> str | None:
            return None if path is None else os.fspath(path)

        return cls(ca_certs=text(ca_certs), certfile=text(certfile), keyfile=text(keyfile))


@dataclass(frozen=True, kw_only=True)
class MqttSettings:
    host: str = "127.0.0.1"
    port: int = 1883
    username: str | None = None
    password: str | None = None
    tls: TlsSettings | None = None
    protocol: Protocol = "auto"
    keepalive_s: int = 30
    connect_timeout_s: float = 5.0
    reconnect_min_delay_s: float = 0.25  # backoff doubles from here …
    reconnect_max_delay_s: float = 8.0  # … up to here
    tcp_nodelay: bool = True
    # Advertised in an MQTT 5 CONNECT: a compliant broker never delivers a larger packet
    # (it drops it instead). None: no limit (MQTT 3.1.1 has no way to say one).
    max_packet_bytes: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ConfigError("MQTT host is empty")
        if (
            not isinstance(self.port, int)
            or isinstance(self.port, bool)
            or not 0 < self.port < 65536
        ):
            raise ConfigError(f"MQTT port {self.port!r} is out of range")
        if self.protocol not in ("auto", "5", "3.1.1"):
            raise ConfigError(f"MQTT protocol must be auto, 5 or 3.1.1, got {self.protocol!r}")
        if not self.keepalive_s >= 0:
            raise ConfigError(f"keepalive_s must be >= 0, got {self.keepalive_s!r}")
        if not self.connect_timeout_s > 0:
            raise ConfigError(f"connect_timeout_s must be > 0, got {self.connect_timeout_s!r}")
        if not 0 < self.reconnect_min_delay_s <= self.reconnect_max_delay_s:
            raise ConfigError("reconnect delays must satisfy 0 < min <= max")
        if self.max_packet_bytes is not None and not 0 < self.max_packet_bytes < 1 << 32:
            raise ConfigError(f"max_packet_bytes must be 1 to 2**32-1, got {self.max_packet_bytes}")

    @classmethod
    def from_url(cls, url: str, **options: Any) -> MqttSettings:
        """Parse ``mqtt://[user[:pass]@]host[:port]`` (``mqtts://`` turns TLS on)."""
        if not isinstance(url, str):
            raise ConfigError(f"broker URL must be a string, got {url!r:.80}")
        try:
            parts = urlsplit(url)
            explicit_port = parts.port  # parsed lazily: raises for "host:abc" or "host:99999"
        except ValueError as e:  # also an unclosed "[" of an IPv6 address
            raise ConfigError(f"broker URL {url!r}: {e}") from e
        if parts.scheme not in ("mqtt", "mqtts", "tcp", "ssl"):
            raise ConfigError(f"broker URL {url!r}: scheme must be mqtt:// or mqtts://")
        secure = parts.scheme in ("mqtts", "ssl")
        # "is None", not "or": an explicit port 0 is an error, not the default.
        port = (8883 if secure else 1883) if explicit_port is None else explicit_port
        if not parts.hostname:
            raise ConfigError(f"broker URL {url!r} has no host")
        settings = cls(
            host=parts.hostname,
            port=port,
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            tls=TlsSettings() if secure else None,
        )
        return replace(settings, **options) if options else settings

    def with_tls(
        self,
        *,
        ca_certs: str | os.PathLike[str] | None = None,
        certfile: str | os.PathLike[str] | None = None,
        keyfile: str | os.PathLike[str] | None = None,
    ) -> MqttSettings:
        """These settings with a CA and client certificate (``TlsSettings.from_files``).

        Only for an ``mqtts://`` URL: TLS files for a plain-text broker are a mistake.
        """
        tls = TlsSettings.from_files(ca_certs=ca_certs, certfile=certfile, keyfile=keyfile)
        if tls is None:
            return self
        if self.tls is None:
            raise ConfigError(f"TLS files given for {self.url}: use an mqtts:// broker URL")
        return replace(self, tls=replace(tls, insecure=self.tls.insecure))

    @property
    def url(self) -> str:
        """The broker URL, without the password."""
        user = f"{quote(self.username, safe='')}@" if self.username else ""
        host = f"[{self.host}]" if ":" in self.host else self.host  # IPv6
        return f"{'mqtts' if self.tls else 'mqtt'}://{user}{host}:{self.port}"


def create_client(
    settings: MqttSettings, client_id: str, *, protocol: Protocol = "5"
) -> paho.Client:
    """A configured paho client (not yet connected). ``protocol`` must be resolved."""
    import paho.mqtt.client as mqtt

    if protocol == "5":
        client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
        )
    else:
        client = mqtt.Client(
            callback_api_version=mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=True,
        )
    client.connect_timeout = settings.connect_timeout_s
    if settings.username is not None:
        client.username_pw_set(settings.username, settings.password)
    if settings.tls is not None:
        client.tls_set_context(_tls_context(settings.tls))
        client.tls_insecure_set(settings.tls.insecure)
    client.reconnect_delay_set(
        min_delay=max(1, round(settings.reconnect_min_delay_s)),
        max_delay=max(1, round(settings.reconnect_max_delay_s)),
    )
    if settings.tcp_nodelay:
        client.on_socket_open = _set_nodelay
    return client


class _ClosingSSLSocket(ssl.SSLSocket):
    """An SSLSocket that closes itself when its handshake fails.

    paho-mqtt 2.x (``Client._ssl_wrap_socket``) drops the socket without closing
    it when ``do_handshake()`` raises (untrusted CA, wrong host, plain-text
    port), leaving the descriptor to the garbage collector on every retry.
    """

    def do_handshake(self, block: bool = False) -> None:
        try:
            super().do_handshake(block)
        except BaseException:
            self.close()
            raise


def _tls_context(tls: TlsSettings) -> ssl.SSLContext:
    """What ``Client.tls_set`` builds (TLS client, CERT_REQUIRED, hostname check)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    if tls.certfile is not None:
        context.load_cert_chain(tls.certfile, tls.keyfile)
    if tls.ca_certs is not None:
        context.load_verify_locations(tls.ca_certs)
    else:
        context.load_default_certs()
    context.sslsocket_class = _ClosingSSLSocket
    return context


def _set_nodelay(_client: Any, _userdata: Any, sock: Any) -> None:
    with contextlib.suppress(OSError, AttributeError):  # unix sockets: nothing to set
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def resolve_protocol(
    settings: MqttSettings, *, client_id: str | None = None
) -> Literal["5", "3.1.1"]:
    """``settings.protocol``, or for ``"auto"`` whether the broker accepts MQTT 5.

    Probes with a short-lived MQTT 5 connection, under ``client_id`` when
    given (a device's own id: a broker that binds ids to credentials would
    refuse any other), else a random ``tandem-probe-…`` one. A broker that answers in
    MQTT 5 speaks it, even when it refuses us (bad credentials, not
    authorized: MQTT 5 reason codes are 0x80 and up); one that answers
    "unsupported protocol version" (0x84), answers in 3.1.1 terms, or drops
    the connection gets 3.1.1, which every broker speaks. An unreachable
    broker also yields 3.1.1, the safe choice.
    """
    if settings.protocol != "auto":
        return settings.protocol
    import paho.mqtt.client as mqtt

    probe_id = client_id or f"tandem-probe-{uuid.uuid4().hex}"
    client = create_client(settings, probe_id, protocol="5")
    answered = threading.Event()
    result: dict[str, bool] = {}

    def on_connect(_c: Any, _u: Any, _f: Any, reason: Any, _p: Any) -> None:
        value = getattr(reason, "value", 0)
        result["ok"] = not reason.is_failure or (value >= 0x80 and value != 0x84)
        answered.set()

    def on_disconnect(*_args: Any) -> None:
        answered.set()

    client.on_connect = on_connect
    client.on_disconnect = on_disconnect
    try:
        client.connect(settings.host, settings.port, keepalive=settings.keepalive_s)
    except (OSError, ValueError):
        return "3.1.1"
    client.loop_start()
    try:
        answered.wait(settings.connect_timeout_s)
    finally:
        client.disconnect()
        client.loop_stop()
    del mqtt
    return "5" if result.get("ok") else "3.1.1"


_MESSAGE_EXPIRY_INTERVAL = 0x02  # MQTT 5 property identifiers (spec 2.2.2.2)
_CORRELATION_DATA = 0x09


def publish_properties(
    *, correlation_data: bytes | None = None, expiry_interval_s: int | None = None
) -> paho_properties.Properties | None:
    """A PUBLISH's correlation data and message expiry as MQTT 5 properties, or None.

    Packed straight into their wire bytes: paho's ``Properties`` builds tables
    and validates names on every message (~60 µs); this costs a few µs.
    paho's ``publish`` only calls ``pack()`` on what it is given.
    """
    body = b""
    if correlation_data is not None:
        if len(correlation_data) > 0xFFFF:
            raise ValueError("MQTT correlation data holds at most 65535 bytes")
        body += struct.pack("!BH", _CORRELATION_DATA, len(correlation_data)) + correlation_data
    if expiry_interval_s is not None:
        seconds = min(max(0, expiry_interval_s), 0xFFFFFFFF)
        body += struct.pack("!BI", _MESSAGE_EXPIRY_INTERVAL, seconds)
    if not body:
        return None
    return _packed_properties_class()(_variable_byte_integer(len(body)) + body)


def _variable_byte_integer(value: int) -> bytes:
    out = bytearray()
    while True:
        value, digit = divmod(value, 128)
        out.append(digit | (0x80 if value else 0))
        if not value:
            return bytes(out)


@functools.cache
def _packed_properties_class() -> type[paho_properties.Properties]:
    """Made on first use, so that importing ``shared`` does not import paho."""
    from paho.mqtt.properties import Properties

    class PackedProperties(Properties):
        _packed: bytes

        def __init__(self, packed: bytes) -> None:  # Properties' own tables are not needed
            object.__setattr__(self, "_packed", packed)  # its __setattr__ takes names only

        def pack(self) -> bytes:
            return self._packed

        def __repr__(self) -> str:
            return f"PackedProperties({self._packed!r})"

        __str__ = __repr__

    return PackedProperties
