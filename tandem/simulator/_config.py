"""What a simulated fleet looks like: ``SimulatorConfig``, and the simulator's error.

Times are seconds, rates are fractions in [0, 1]. The per-device traits
(which devices fail installs, go offline, disagree with the cloud) are drawn
from ``seed`` alone, so the same config always picks the same devices.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from shared import ConfigError, MqttSettings, PublicKey, TlsSettings, Topics, validate_name

__all__ = ["LIES", "SimulatorConfig"]

_SITES = ("factory-a", "factory-b", "factory-c")
_HARDWARE = ("cpu", "npu")
_MAX_DEVICES = 100_000
LIES = ("labels", "version", "huge", "bad", "good")


def _rate(value: object, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= 1:
        raise ConfigError(f"{what} must be a fraction between 0 and 1, got {value!r:.40}")
    return float(value)


def _seconds(value: object, what: str, *, positive: bool = False) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < 0
        or (positive and value == 0)
    ):
        sign = "> 0" if positive else ">= 0"
        raise ConfigError(f"{what} must be a number of seconds {sign}, got {value!r:.40}")
    return float(value)


def _span(value: object, what: str) -> tuple[float, float]:
    if not isinstance(value, tuple | list) or len(value) != 2:
        raise ConfigError(f"{what} must be a (low, high) pair of seconds, got {value!r:.60}")
    low, high = (_seconds(v, what) for v in value)
    if low > high:
        raise ConfigError(f"{what}: low {low:g} is above high {high:g}")
    return low, high


def _versions(value: object, what: str) -> frozenset[int]:
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise ConfigError(f"{what} must be a set of versions, got {value!r:.40}")
    versions = frozenset(value)
    for v in versions:
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ConfigError(f"{what}: {v!r:.20} is not a version (an integer >= 1)")
    return versions


@dataclass(frozen=True, kw_only=True)
class SimulatorConfig:
    """A simulated fleet: its size, where it connects, and how its devices misbehave.

    ``broker`` is an ``MqttSettings`` or a broker URL (``mqtt://host:1883``).
    Each device gets the labels ``site`` (factory-a/b/c) and ``hw`` (cpu/npu),
    spread evenly over the fleet, then ``labels`` on top.

    Misbehaviour: ``fail_rate`` of the devices fail every install (after the
    real download), and installs of ``fail_versions`` fail on every device;
    ``offline_rate`` of the devices disconnect once, at a random moment within
    ``offline_after_s`` of starting, for ``offline_for_s``; ``disagree_rate``
    of the devices, and every device while it runs one of
    ``disagree_versions``, report an edge-cloud agreement of about 60%
    (others about 97%, each device its own, spread by ``agreement_spread``);
    ``version_agreement`` and ``version_error_rate`` set a version's own
    agreement and error rate (e.g. ``{2: 0.92}``: 5 points below 97%).

    Lying devices: ``liar_rate`` of the devices forge their telemetry, as
    ``lie`` says: ``labels`` (claim the first site and ``hw=npu``),
    ``version`` (claim the version above the one they run), ``huge`` (10^15
    requests, every one an error and a disagreement), ``bad`` (plausible
    counts, every request an error and a disagreement) or ``good`` (plausible
    counts, no error, full agreement).
    """

    devices: int = 10
    id_prefix: str = "sim"
    broker: MqttSettings | str = field(default_factory=MqttSettings)
    topic_prefix: str = "tandem/v1"
    cdn_url: str = "http://127.0.0.1:8700"
    read_token: str | None = None
    cdn_tls: TlsSettings | None = None  # https:// CDN: the CA to trust, a client certificate
    trusted_keys: tuple[PublicKey, ...] = ()
    model: str = "mnist"
    initial_version: int = 1
    labels: Mapping[str, str] = field(default_factory=dict)
    telemetry_interval_s: float = 2.0  # each device, jittered by +-25%
    install_delay_s: tuple[float, float] = (0.05, 0.5)  # after the download: the "smoke test"
    fail_rate: float = 0.0
    fail_versions: frozenset[int] = frozenset()
    offline_rate: float = 0.0
    offline_after_s: float = 5.0
    offline_for_s: float = 10.0
    disagree_rate: float = 0.0
    disagree_versions: frozenset[int] = frozenset()
    agreement_spread: float = 0.01  # sd of the devices' own agreement around the version's
    version_agreement: Mapping[int, float] = field(default_factory=dict)
    version_error_rate: Mapping[int, float] = field(default_factory=dict)
    liar_rate: float = 0.0
    lie: str = "bad"
    requests_per_s: tuple[float, float] = (2.0, 20.0)  # each device's request rate, drawn once
    seed: int = 0
    download_workers: int = 16  # threads sharing the CDN downloads (keep-alive connections)
    http_timeout_s: float = 15.0
    keepalive_s: int = 60  # MQTT keep-alive of each device connection
    # Per-device credentials (device id -> password), as 'tandem fleet provision' gives them:
    # each device then connects as itself (username = client id = device id), as a real
    # device does on a broker that checks who is who. None: the broker URL's credentials.
    passwords: Mapping[str, str] | None = field(default=None, repr=False)
    reconnect_delay_s: tuple[float, float] = (0.5, 2.0)  # after an unplanned disconnect

    def __post_init__(self) -> None:
        if isinstance(self.devices, bool) or not isinstance(self.devices, int):
            raise ConfigError(f"devices must be an integer, got {self.devices!r:.40}")
        if not 1 <= self.devices <= _MAX_DEVICES:
            raise ConfigError(f"devices must be between 1 and {_MAX_DEVICES}, got {self.devices}")
        validate_name(self.device_id(self.devices - 1), "device id prefix")
        broker = self.broker
        if isinstance(broker, str):
            broker = MqttSettings.from_url(broker)
        if not isinstance(broker, MqttSettings):
            raise ConfigError("broker must be MqttSettings or a broker URL")
        object.__setattr__(self, "broker", broker)
        Topics(self.topic_prefix)  # validates
        if not self.cdn_url.startswith(("http://", "https://")):
            raise ConfigError(f"CDN URL must be http:// or https://, got {self.cdn_url!r:.80}")
        if self.read_token is not None and (
            not self.read_token or not self.read_token.isprintable() or " " in self.read_token
        ):
            raise ConfigError("the read token must be non-empty printable text without spaces")
        object.__setattr__(self, "trusted_keys", tuple(self.trusted_keys))
        if not self.trusted_keys:
            raise ConfigError("a simulated device needs at least one trusted publisher key")
        if not all(isinstance(k, PublicKey) for k in self.trusted_keys):
            raise ConfigError("trusted_keys must be PublicKey objects")
        validate_name(self.model, "model name")
        if (
            isinstance(self.initial_version, bool)
            or not isinstance(self.initial_version, int)
            or self.initial_version < 1
        ):
            raise ConfigError(f"initial_version must be >= 1, got {self.initial_version!r:.20}")
        labels = dict(self.labels)
        for key, value in labels.items():
            if not isinstance(key, str) or not isinstance(value, str) or not key:
                raise ConfigError(f"label {key!r:.40}={value!r:.40}: names and values are text")
        object.__setattr__(self, "labels", labels)
        _seconds(self.telemetry_interval_s, "telemetry_interval_s", positive=True)
        object.__setattr__(self, "install_delay_s", _span(self.install_delay_s, "install_delay_s"))
        for name in ("fail_rate", "offline_rate", "disagree_rate", "liar_rate"):
            _rate(getattr(self, name), name)
        if self.lie not in LIES:
            raise ConfigError(f"lie must be one of {', '.join(LIES)}, got {self.lie!r:.40}")
        _rate(self.agreement_spread, "agreement_spread")
        for name in ("version_agreement", "version_error_rate"):
            rates = dict(getattr(self, name))
            _versions(rates, name)
            for v, rate in rates.items():
                _rate(rate, f"{name}[{v}]")
            object.__setattr__(self, name, rates)
        object.__setattr__(self, "fail_versions", _versions(self.fail_versions, "fail_versions"))
        object.__setattr__(
            self, "disagree_versions", _versions(self.disagree_versions, "disagree_versions")
        )
        _seconds(self.offline_after_s, "offline_after_s")
        _seconds(self.offline_for_s, "offline_for_s", positive=True)
        object.__setattr__(self, "requests_per_s", _span(self.requests_per_s, "requests_per_s"))
        object.__setattr__(
            self, "reconnect_delay_s", _span(self.reconnect_delay_s, "reconnect_delay_s")
        )
        if self.reconnect_delay_s[1] <= 0:
            raise ConfigError("reconnect_delay_s must allow a delay above 0")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r:.40}")
        if not 1 <= self.download_workers <= 256:
            raise ConfigError(f"download_workers must be 1-256, got {self.download_workers!r}")
        _seconds(self.http_timeout_s, "http_timeout_s", positive=True)
        if not isinstance(self.keepalive_s, int) or not 5 <= self.keepalive_s <= 65535:
            raise ConfigError(f"keepalive_s must be 5-65535 seconds, got {self.keepalive_s!r}")
        if self.passwords is not None:
            passwords = dict(self.passwords)
            missing = [d for d in map(self.device_id, range(self.devices)) if not passwords.get(d)]
            if missing:
                raise ConfigError(
                    f"no password for {len(missing)} of the {self.devices} devices (the first: "
                    f"{missing[0]}): provision them, e.g. 'tandem fleet provision "
                    f"{missing[0]} … --password-out FILE'"
                )
            object.__setattr__(self, "passwords", passwords)

    def device_mqtt(self, device: str) -> MqttSettings:
        """The MQTT settings device ``device`` connects with: its own credentials if given."""
        if self.passwords is None:
            return self.mqtt
        return replace(self.mqtt, username=device, password=self.passwords[device])

    @property
    def mqtt(self) -> MqttSettings:
        assert isinstance(self.broker, MqttSettings)  # __post_init__ made it one
        return self.broker

    @property
    def topics(self) -> Topics:
        return Topics(self.topic_prefix)

    def device_id(self, index: int) -> str:
        """The id of device ``index`` (0-based): ``sim-0001`` for index 0."""
        width = max(4, len(str(self.devices)))
        return f"{self.id_prefix}-{index + 1:0{width}d}"

    def device_labels(self, index: int) -> dict[str, str]:
        """Every site and hardware pair appears before one repeats: a wave hits all kinds."""
        labels = {"site": _SITES[index % 3], "hw": _HARDWARE[(index // 3) % 2]}
        labels.update(self.labels)
        return labels

    def describe(self) -> dict[str, Any]:
        """The knobs as plain values, for a log line or a summary."""
        return {
            "devices": self.devices,
            "broker": self.mqtt.url,
            "cdn": self.cdn_url,
            "model": f"{self.model}@{self.initial_version}",
            "fail_rate": self.fail_rate,
            "fail_versions": sorted(self.fail_versions),
            "offline_rate": self.offline_rate,
            "disagree_rate": self.disagree_rate,
            "disagree_versions": sorted(self.disagree_versions),
            "version_agreement": dict(self.version_agreement),
            "version_error_rate": dict(self.version_error_rate),
            "liar_rate": self.liar_rate,
            "lie": self.lie,
            "seed": self.seed,
        }
