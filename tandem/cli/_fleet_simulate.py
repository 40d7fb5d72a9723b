"""``tandem fleet simulate``: a fleet of simulated devices on a real broker and CDN.

The command runs ``tandem.simulator.FleetSimulator`` until Ctrl-C,
SIGTERM or ``--duration``, with a live summary on stderr (devices online,
versions running, installs and failures) on a terminal, or a progress line
every ``--progress-every`` seconds in a log, then disconnects every device
and exits 0. With an admin token it first records each device's labels at
the CDN as the operator's (a rollout targets the operator's labels, never a
device's own claims). Failures are one line on stderr and exit 1 (the work failed)
or 2 (the command line was wrong).
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from ._common import (
    MqttCaOption,
    MqttCertOption,
    MqttKeyOption,
    PrefixOption,
    clean_errors,
    fail,
    load_trusted_key,
)

if TYPE_CHECKING:
    from tandem.simulator import FleetSnapshot, SimulatorConfig

__all__ = ["fleet_simulate"]

_COMMAND = "fleet simulate"
_REFRESH_S = 0.5


DevicesOption = Annotated[
    int, typer.Option("--devices", help="How many devices to simulate.", min=1, max=100_000)
]
TrustedKeyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--trusted-key",
        help="publisher.pub file or 'ed25519:…' text the devices trust (repeatable).",
        show_default=False,
    ),
]
BrokerOption = Annotated[
    str, typer.Option("--broker", envvar="TANDEM_BROKER", help="MQTT broker URL.")
]
CdnUrlOption = Annotated[
    str, typer.Option("--cdn", envvar="TANDEM_CDN_URL", help="The model CDN's base URL.")
]
ReadTokenOption = Annotated[
    str | None,
    typer.Option(
        "--read-token",
        envvar="TANDEM_CDN_READ_TOKEN",
        help="Bearer token for the CDN's reads, when it wants one.",
        show_default=False,
    ),
]
CdnCaOption = Annotated[
    Path | None,
    typer.Option(
        "--cdn-ca",
        help="PEM CA that signed an https:// CDN's certificate; default: the system's.",
        show_default=False,
    ),
]
ModelOption = Annotated[str, typer.Option("--model", help="The model the devices run.")]
InitialVersionOption = Annotated[
    int, typer.Option("--initial-version", help="The version they start on.", min=1)
]
IdPrefixOption = Annotated[
    str, typer.Option("--id-prefix", help="Device ids are PREFIX-0001, PREFIX-0002, …")
]
LabelOption = Annotated[
    list[str] | None,
    typer.Option(
        "--label",
        help="KEY=VALUE added to every device's labels (repeatable); site and hw are "
        "spread over the fleet already.",
        show_default=False,
    ),
]
TelemetryIntervalOption = Annotated[
    float,
    typer.Option("--telemetry-interval", help="Seconds between telemetry reports.", min=0.05),
]
InstallDelayOption = Annotated[
    str,
    typer.Option(
        "--install-delay",
        help="Seconds an install takes after its download: LOW-HIGH.",
    ),
]
FailRateOption = Annotated[
    float,
    typer.Option("--fail-rate", help="Fraction of devices whose installs fail.", min=0, max=1),
]
FailVersionOption = Annotated[
    list[int] | None,
    typer.Option("--fail-version", help="A bad version: installs fail on every device.", min=1),
]
OfflineRateOption = Annotated[
    float,
    typer.Option("--offline-rate", help="Fraction of devices that drop off once.", min=0, max=1),
]
OfflineAfterOption = Annotated[
    float,
    typer.Option("--offline-after", help="They drop within this many seconds.", min=0),
]
OfflineForOption = Annotated[
    float,
    typer.Option("--offline-for", help="Seconds they stay away.", min=0.1),
]
DisagreeRateOption = Annotated[
    float,
    typer.Option(
        "--disagree-rate",
        help="Fraction of devices whose model agrees with the cloud ~60% (not ~97%).",
        min=0,
        max=1,
    ),
]
DisagreeVersionOption = Annotated[
    list[int] | None,
    typer.Option(
        "--disagree-version", help="A version that disagrees with the cloud everywhere.", min=1
    ),
]
SeedOption = Annotated[int, typer.Option("--seed", help="Picks which devices misbehave.")]
DownloadWorkersOption = Annotated[
    int, typer.Option("--download-workers", help="Download threads.", min=1, max=256)
]
RequestsPerSOption = Annotated[
    str, typer.Option("--requests-per-s", help="Each device's request rate: LOW-HIGH.")
]
VersionRateOption = Annotated[
    list[str] | None,
    typer.Option(
        "--version-agreement",
        help="VERSION=RATE: that version's edge-cloud agreement (0.92), repeatable.",
        show_default=False,
    ),
]
VersionErrorOption = Annotated[
    list[str] | None,
    typer.Option(
        "--version-error-rate",
        help="VERSION=RATE: that version's error rate (0.004), repeatable.",
        show_default=False,
    ),
]
LiarRateOption = Annotated[
    float,
    typer.Option("--liar-rate", help="Fraction of devices forging telemetry.", min=0, max=1),
]
LieOption = Annotated[
    str,
    typer.Option("--lie", help="What liars forge: labels, version, huge, bad or good."),
]
AdminTokenOption = Annotated[
    str | None,
    typer.Option(
        "--token",
        envvar="TANDEM_CDN_ADMIN_TOKEN",
        help="Admin token (or rollout:admin key): record the devices' labels at the CDN.",
        show_default=False,
    ),
]
LabelDevicesOption = Annotated[
    bool,
    typer.Option(
        "--label-devices/--no-label-devices",
        help="Record each device's labels at the CDN first (needs --token).",
    ),
]
ProgressOption = Annotated[
    float,
    typer.Option(
        "--progress-every", help="Seconds between progress lines when not on a terminal.", min=0.1
    ),
]
PasswordFileOption = Annotated[
    Path | None,
    typer.Option(
        "--password-file",
        help="'DEVICE PASSWORD' lines, as 'tandem fleet provision --password-out' writes them: "
        "each device then connects as itself (username = client id = its id), as real devices "
        "do on a broker with per-device users (--passwd-file/--acl-file or --dynsec-file). "
        "Without it every device uses the --broker URL's user (mqtt://user:pass@host).",
        dir_okay=False,
        show_default=False,
    ),
]
DurationOption = Annotated[
    float | None,
    typer.Option("--duration", help="Stop after this many seconds (default: Ctrl-C).", min=0.1),
]


def fleet_simulate(
    devices: DevicesOption = 100,
    trusted_key: TrustedKeyOption = None,
    broker: BrokerOption = "mqtt://127.0.0.1:1883",
    cdn: CdnUrlOption = "http://127.0.0.1:8700",
    read_token: ReadTokenOption = None,
    cdn_ca: CdnCaOption = None,
    model: ModelOption = "mnist",
    initial_version: InitialVersionOption = 1,
    id_prefix: IdPrefixOption = "sim",
    prefix: PrefixOption = "tandem/v1",
    label: LabelOption = None,
    telemetry_interval: TelemetryIntervalOption = 2.0,
    install_delay: InstallDelayOption = "0.05-0.5",
    fail_rate: FailRateOption = 0.0,
    fail_version: FailVersionOption = None,
    offline_rate: OfflineRateOption = 0.0,
    offline_after: OfflineAfterOption = 5.0,
    offline_for: OfflineForOption = 10.0,
    disagree_rate: DisagreeRateOption = 0.0,
    disagree_version: DisagreeVersionOption = None,
    seed: SeedOption = 0,
    download_workers: DownloadWorkersOption = 16,
    duration: DurationOption = None,
    requests_per_s: RequestsPerSOption = "2-20",
    version_agreement: VersionRateOption = None,
    version_error_rate: VersionErrorOption = None,
    liar_rate: LiarRateOption = 0.0,
    lie: LieOption = "bad",
    token: AdminTokenOption = None,
    label_devices: LabelDevicesOption = True,
    progress_every: ProgressOption = 10.0,
    mqtt_ca: MqttCaOption = None,
    mqtt_cert: MqttCertOption = None,
    mqtt_key: MqttKeyOption = None,
    password_file: PasswordFileOption = None,
) -> None:
    """Simulate a fleet: real MQTT connections, real signed downloads, no models run.

    Each device connects with its own client id, takes signed assignments
    from its retained topic, downloads and verifies the manifest and blob
    from the CDN, reports update status and telemetry like a real device.
    Some can fail installs (--fail-rate, --fail-version), drop off for a
    while (--offline-rate) or disagree with the cloud (--disagree-rate,
    --disagree-version), so rollouts and their gates are tested end to end.

    Example:

        tandem fleet simulate --devices 1000 --trusted-key ~/.tandem/publisher.pub \\
            --broker mqtt://127.0.0.1:1883 --cdn http://127.0.0.1:8700 --fail-rate 0.01
    """
    from shared import ConfigError, MqttSettings, TlsSettings
    from tandem.simulator import SimulatorConfig

    with clean_errors(_COMMAND):
        try:
            if not trusted_key:
                raise ConfigError("no --trusted-key: the devices must trust the publisher's key")
            config = SimulatorConfig(
                devices=devices,
                id_prefix=id_prefix,
                broker=MqttSettings.from_url(broker).with_tls(
                    ca_certs=mqtt_ca, certfile=mqtt_cert, keyfile=mqtt_key
                ),
                topic_prefix=prefix,
                cdn_url=cdn,
                read_token=read_token or None,
                cdn_tls=TlsSettings.from_files(ca_certs=cdn_ca),
                trusted_keys=tuple(load_trusted_key(k) for k in trusted_key),
                model=model,
                initial_version=initial_version,
                labels=_labels(label or []),
                telemetry_interval_s=telemetry_interval,
                install_delay_s=_span(install_delay),
                fail_rate=fail_rate,
                fail_versions=frozenset(fail_version or ()),
                offline_rate=offline_rate,
                offline_after_s=offline_after,
                offline_for_s=offline_for,
                disagree_rate=disagree_rate,
                disagree_versions=frozenset(disagree_version or ()),
                seed=seed,
                download_workers=download_workers,
                requests_per_s=_span(requests_per_s, "--requests-per-s"),
                version_agreement=_version_rates(version_agreement, "--version-agreement"),
                version_error_rate=_version_rates(version_error_rate, "--version-error-rate"),
                liar_rate=liar_rate,
                lie=lie,
                passwords=None if password_file is None else _passwords(password_file),
            )
        except (ConfigError, ValueError) as e:
            fail(_COMMAND, str(e), 2)
        if label_devices and token:
            _label(config, token)
        _run(config, duration, progress_every)


def _passwords(path: Path) -> dict[str, str]:
    """``DEVICE PASSWORD`` lines (blank lines and ``#`` comments skipped); ``ConfigError``
    names the line that is neither."""
    from shared import ConfigError

    try:
        text = path.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"--password-file {path}: {e}") from e
    passwords: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        words = line.split()
        if not words or words[0].startswith("#"):
            continue
        if len(words) != 2:
            raise ConfigError(
                f"--password-file {path}, line {number}: expected 'DEVICE PASSWORD' "
                f"(as 'tandem fleet provision --password-out' writes)"
            )
        passwords[words[0]] = words[1]
    return passwords


def _label(config: SimulatorConfig, token: str) -> None:
    """Record every device's labels at the CDN, as the operator's inventory would."""
    from model_cdn import AdminApiError, AdminClient

    labels = {config.device_id(i): config.device_labels(i) for i in range(config.devices)}
    names = list(labels)
    try:
        client = AdminClient(config.cdn_url, token=token, timeout_s=30)
        for at in range(0, len(names), 1000):
            client.set_labels({n: labels[n] for n in names[at : at + 1000]})
    except (AdminApiError, ValueError) as e:
        fail(_COMMAND, f"cannot record the devices' labels at the CDN: {e}", 1)
    typer.echo(f"recorded the labels of {len(names)} devices at {config.cdn_url}", err=True)


def _run(config: SimulatorConfig, duration: float | None, progress_s: float = 10.0) -> None:
    """The fleet, with its live summary, until SIGTERM, Ctrl-C or ``duration``; then a line."""
    from tandem.simulator import FleetSimulator

    stop = threading.Event()
    started = time.monotonic()
    with _stop_on_signals(stop), FleetSimulator(config) as simulator:
        with contextlib.suppress(KeyboardInterrupt):
            _watch(simulator, config, stop, duration, started, progress_s)
        final = simulator.snapshot()
    typer.echo(
        f"simulated {final.total} devices for {time.monotonic() - started:.0f} s: "
        f"{final.summary()}",
        err=True,
    )


def _watch(
    simulator: Any,
    config: SimulatorConfig,
    stop: threading.Event,
    duration: float | None,
    started: float,
    progress_s: float = 10.0,
) -> None:
    """Show the live summary (a terminal) or progress lines (a log) until ``stop`` is set
    or ``duration`` has passed."""
    from rich.console import Console
    from rich.live import Live

    deadline = None if duration is None else started + duration
    console = Console(stderr=True)
    if not console.is_terminal:
        _log_progress(simulator, stop, deadline, started, progress_s)
        return
    with Live(console=console, refresh_per_second=4, transient=not console.is_terminal) as live:
        while not stop.is_set():
            live.update(_render(simulator.snapshot(), config, time.monotonic() - started))
            left = _REFRESH_S if deadline is None else min(_REFRESH_S, deadline - time.monotonic())
            if left <= 0 or stop.wait(left):
                break
        live.update(_render(simulator.snapshot(), config, time.monotonic() - started))


def _log_progress(
    simulator: Any, stop: threading.Event, deadline: float | None, started: float, every_s: float
) -> None:
    """One line on stderr every ``every_s``, flushed: what a log shows of a long run."""
    while True:
        snapshot = simulator.snapshot()
        elapsed = time.monotonic() - started
        typer.echo(f"{_COMMAND}: {elapsed:.0f} s: {snapshot.summary()}", err=True)
        left = every_s if deadline is None else min(every_s, deadline - time.monotonic())
        if left <= 0 or stop.wait(left):
            return


def _render(snapshot: FleetSnapshot, config: SimulatorConfig, elapsed: float) -> Any:
    from rich.table import Table

    table = Table(
        title=f"{snapshot.total} simulated devices · {config.model} · {elapsed:.0f} s",
        show_header=False,
    )
    table.add_column(style="bold", no_wrap=True)
    table.add_column()
    versions = "  ".join(f"v{v}: {n}" for v, n in sorted(snapshot.versions.items()))
    states = "  ".join(f"{s}: {n}" for s, n in sorted(snapshot.last_states().items()))
    rows = [
        ("online", f"{snapshot.online} / {snapshot.total}"),
        ("running", versions),
        ("installs", f"{snapshot.installs} done, {snapshot.installing} in progress"),
        ("failures", str(snapshot.failures)),
        ("last reports", states),
        (
            "traffic",
            f"{snapshot.status_reports} status, {snapshot.telemetry_reports} telemetry, "
            f"{snapshot.http_requests} HTTP requests",
        ),
        ("broker / CDN", f"{config.mqtt.url}  {config.cdn_url}"),
    ]
    if snapshot.last_error:
        rows.append(("last error", snapshot.last_error))
    for row in rows:
        table.add_row(*row)
    return table


@contextlib.contextmanager
def _stop_on_signals(stop: threading.Event) -> Iterator[None]:
    """SIGTERM (and SIGINT) set ``stop``: the fleet then disconnects cleanly."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}

    def handler(_signum: int, _frame: Any) -> None:
        stop.set()

    for s in previous:
        signal.signal(s, handler)
    try:
        yield
    finally:
        for s, old in previous.items():
            signal.signal(s, old)


def _labels(items: list[str]) -> dict[str, str]:
    labels: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--label {item!r}: write KEY=VALUE")
        labels[key.strip()] = value.strip()
    return labels


def _span(text: str, option: str = "--install-delay") -> tuple[float, float]:
    """``"0.1-2"`` -> (0.1, 2.0); ``"1"`` -> (1.0, 1.0)."""
    low, sep, high = text.partition("-")
    try:
        values = (float(low), float(high)) if sep else (float(low), float(low))
    except ValueError as e:
        raise ValueError(f"{option} {text!r}: write LOW-HIGH") from e
    return values


def _version_rates(items: list[str] | None, option: str) -> dict[int, float]:
    """``["2=0.92"]`` -> ``{2: 0.92}``."""
    out: dict[int, float] = {}
    for item in items or []:
        version, sep, rate = item.partition("=")
        try:
            out[int(version)] = float(rate)
        except ValueError as e:
            raise ValueError(f"{option} {item!r}: write VERSION=RATE, e.g. 2=0.92") from e
        if not sep:
            raise ValueError(f"{option} {item!r}: write VERSION=RATE, e.g. 2=0.92")
    return out
