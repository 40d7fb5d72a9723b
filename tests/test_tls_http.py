"""HTTPS on the CDN and the hub's HTTP API, and the TLS options of the commands.

A throwaway CA (tests/_pki.py) signs a server certificate for 127.0.0.1 and a
client certificate. The device's CDN client pins the CA: it downloads over
HTTPS, and refuses a server its CA did not sign at once, without retrying.
The hub's API answers httpx over HTTPS, and with a client CA set refuses a
client without a certificate. A mistake in the TLS options is one line on
stderr and exit code 2.
"""

from __future__ import annotations

import signal
import ssl
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from cloud_hub import Hub, HubError
from cloud_hub.http import HttpServer, create_app
from edge_agent import DownloadError
from edge_agent.updater import CdnClient, DownloadSettings
from model_cdn.http import create_app as create_cdn_app
from model_cdn.registry import SqliteRegistry
from shared import SigningKey, TlsSettings, digest
from shared.server.store import LocalBlobStore

from ._brokers import free_port, wait_for_port
from ._cdn import make_manifest_doc, serve_in_thread
from ._cli import tandem_env
from ._hub_http_kit import write_repo
from ._pki import Pki, make_pki

BLOB = b"weights over TLS" * 1000


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def client_context(pki: Pki, *, ca: Path | None = None, with_cert: bool = False) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(ca or pki.ca))
    if with_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


# -- the device's CDN client over HTTPS -----------------------------------------------------


@pytest.fixture(scope="module")
def https_cdn(tmp_path_factory: pytest.TempPathFactory, pki: Pki) -> Iterator[str]:
    root = tmp_path_factory.mktemp("cdn")
    registry = SqliteRegistry(root / "registry.db")
    store = LocalBlobStore(root / "blobs")
    store.put(BLOB)
    registry.add_version(make_manifest_doc(SigningKey.generate(), "mnist", 1, blob=BLOB))
    app = create_cdn_app(registry=registry, store=store, admin_token=None)
    ssl_options = {"ssl_certfile": str(pki.server_cert), "ssl_keyfile": str(pki.server_key)}
    try:
        with serve_in_thread(app, ssl=ssl_options) as url:
            yield url
    finally:
        registry.close()


def test_device_downloads_manifest_and_blob_with_the_cdn_ca_pinned(
    https_cdn: str, pki: Pki, tmp_path: Path
) -> None:
    assert https_cdn.startswith("https://")
    tls = TlsSettings(ca_certs=str(pki.ca))
    cdn = CdnClient(https_cdn, settings=DownloadSettings(tls=tls))
    document = cdn.fetch_document(cdn.manifest_url("mnist"))
    assert document is not None and digest(BLOB).encode() in document
    result = cdn.download_blob(digest(BLOB), len(BLOB), tmp_path / "blob.part")
    assert result.path.read_bytes() == BLOB and result.requests == 1


def test_server_signed_by_another_ca_is_refused_at_once(
    https_cdn: str, pki: Pki, tmp_path: Path
) -> None:
    # Same CA name, another key.
    tls = TlsSettings(ca_certs=str(pki.rogue_ca))
    settings = DownloadSettings(tls=tls, max_attempts=3)
    cdn = CdnClient(https_cdn, settings=settings)
    with pytest.raises(DownloadError, match="CERTIFICATE_VERIFY_FAILED"):
        cdn.fetch_document(cdn.manifest_url("mnist"))
    with pytest.raises(DownloadError, match="CERTIFICATE_VERIFY_FAILED"):
        cdn.download_blob(digest(BLOB), len(BLOB), tmp_path / "blob.part")
    assert not (tmp_path / "blob.part").exists()


def test_device_without_a_pinned_ca_refuses_a_private_ca(https_cdn: str) -> None:
    cdn = CdnClient(https_cdn, settings=DownloadSettings(timeout_s=5))  # the system's CAs
    with pytest.raises(DownloadError, match="CERTIFICATE_VERIFY_FAILED"):
        cdn.fetch_document(cdn.manifest_url("mnist"))


def test_unreadable_tls_files_are_a_value_error_up_front(pki: Pki, tmp_path: Path) -> None:
    tls = TlsSettings(ca_certs=str(tmp_path / "absent.pem"))
    with pytest.raises(ValueError, match="CDN TLS files"):
        CdnClient("https://127.0.0.1:1", settings=DownloadSettings(tls=tls))


# -- the hub's HTTP API over HTTPS ----------------------------------------------------------


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Hub]:
    with Hub(write_repo(tmp_path_factory.mktemp("tls-repo"))) as running:
        yield running


def test_hub_api_answers_https_clients_that_trust_its_ca(hub: Hub, pki: Pki) -> None:
    tls = TlsSettings(certfile=str(pki.server_cert), keyfile=str(pki.server_key))
    with HttpServer(create_app(hub), port=0, tls=tls) as server:
        assert server.url.startswith("https://127.0.0.1:")
        with httpx.Client(base_url=server.url, verify=client_context(pki), timeout=10) as client:
            assert client.get("/v2/health/live").json() == {"live": True}
        with (
            httpx.Client(base_url=server.url, verify=client_context(pki, ca=pki.rogue_ca)) as c,
            pytest.raises(httpx.ConnectError, match="CERTIFICATE_VERIFY_FAILED"),
        ):
            c.get("/v2/health/live")


def test_hub_api_with_a_client_ca_refuses_clients_without_a_certificate(hub: Hub, pki: Pki) -> None:
    tls = TlsSettings(
        certfile=str(pki.server_cert), keyfile=str(pki.server_key), ca_certs=str(pki.ca)
    )
    with HttpServer(create_app(hub), port=0, tls=tls) as server:
        mutual = client_context(pki, with_cert=True)
        with httpx.Client(base_url=server.url, verify=mutual, timeout=10) as client:
            assert client.get("/v2/health/ready").json() == {"ready": True}
        with (
            httpx.Client(base_url=server.url, verify=client_context(pki), timeout=10) as client,
            pytest.raises(httpx.TransportError),  # TLS 1.3: the alert comes at the first read
        ):
            client.get("/v2/health/ready")


def test_hub_tls_files_that_do_not_match_fail_start(hub: Hub, pki: Pki) -> None:
    tls = TlsSettings(certfile=str(pki.server_cert), keyfile=str(pki.client_key))
    server = HttpServer(create_app(hub), port=0, tls=tls)
    with pytest.raises(HubError, match="TLS files"):
        server.start()
    with pytest.raises(HubError, match="certificate"):
        HttpServer(create_app(hub), tls=TlsSettings(ca_certs=str(pki.ca)))


# -- the commands' options ------------------------------------------------------------------


def tandem(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = tandem_env()
    env.update(COLUMNS="200")
    return subprocess.run(
        [sys.executable, "-m", "tandem.cli", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["hub", "--repo", ".", "--tls-cert", "server.pem"], "needs its key"),
        (["hub", "--repo", ".", "--tls-key", "server.key"], "needs its key"),
        (["hub", "--repo", ".", "--tls-client-ca", "ca.pem"], "--tls-client-ca needs"),
        (
            ["hub", "--repo", ".", "--tls-cert", "absent.pem", "--tls-key", "server.key"],
            "not found: absent.pem",
        ),
        (["hub", "--repo", ".", "--mqtt-key", "server.key"], "needs its key"),
        (["hub", "--repo", ".", "--mqtt-ca", "absent.pem"], "not found: absent.pem"),
        (["cdn", "serve", "--tls-key", "server.key"], "needs its key"),
        (["cdn", "serve", "--tls-client-ca", "ca.pem"], "--tls-client-ca needs"),
        (["cdn", "serve", "--broker", "mqtt://127.0.0.1:1", "--mqtt-ca", "ca.pem"], "mqtts://"),
        (["cdn", "serve", "--mqtt-cert", "server.pem"], "needs its key"),
        (
            ["models", "assign", "m@1", "--device", "d", "--broker", "mqtts://h", "--mqtt-ca", "x"],
            "not found: x",
        ),
    ],
)
def test_tls_option_mistakes_are_one_line_and_exit_code_2(
    args: list[str], needle: str, pki: Pki, tmp_path: Path
) -> None:
    for path in (pki.ca, pki.server_cert, pki.server_key):
        (tmp_path / path.name).write_bytes(path.read_bytes())
    result = tandem(*args, cwd=tmp_path)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert result.returncode == 2, result.stdout + result.stderr
    assert len(lines) == 1 and lines[0].startswith("tandem "), result.stderr
    assert needle in lines[0], lines[0]


def test_cdn_serve_with_tls_cert_serves_https(pki: Pki, tmp_path: Path) -> None:
    port = free_port()
    env = tandem_env()
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "tandem.cli",
            "cdn",
            "serve",
            "--port",
            str(port),
            "--registry",
            str(tmp_path / "registry.db"),
            "--store",
            str(tmp_path / "blobs"),
            "--tls-cert",
            str(pki.server_cert),
            "--tls-key",
            str(pki.server_key),
            "--log-level",
            "warning",
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for_port(port, timeout_s=60)
        url = f"https://127.0.0.1:{port}"
        with httpx.Client(base_url=url, verify=client_context(pki), timeout=10) as client:
            assert client.get("/v1/models").json() == {"models": []}
    finally:
        server.terminate()
        _, stderr = server.communicate(timeout=30)
    assert server.returncode in (0, -signal.SIGTERM), stderr
    assert "Traceback" not in stderr
