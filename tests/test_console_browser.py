"""The fleet console in a real browser: Debian's headless Chromium, driven by Selenium.

Real parts: a Mosquitto broker of its own, the CDN app (uvicorn on loopback)
with its rollout controller and API keys, a simulated fleet (real MQTT
connections, real signed downloads) labelled by the operator, and a rollout
running with a health gate. ``scripts/ensure-chromium`` installs Chromium and
ChromeDriver with apt-get where they are missing.

Set ``TANDEM_CONSOLE_SCREENSHOTS=docs`` to write the screenshots the README
shows (``docs/console-*.png``); otherwise they go to the test's temp folder.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from model_cdn import LocalBlobStore, create_app, open_registry
from model_cdn.rollout._service import FleetService
from shared import ApiKeyFile, ApiKeyGuard, MqttSettings, SigningKey, Topics, generate_api_key
from tandem.simulator import FleetSimulator, SimulatorConfig

from ._brokers import MosquittoProcess
from ._cdn import make_manifest_doc, serve_in_thread
from ._cli import ROOT

MODEL = "mnist-edge"
DEVICES = 60

webdriver = pytest.importorskip("selenium.webdriver")
By = pytest.importorskip("selenium.webdriver.common.by").By
WebDriverWait = pytest.importorskip("selenium.webdriver.support.ui").WebDriverWait


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    subprocess.run(["bash", str(ROOT / "scripts" / "ensure-chromium")], check=True, timeout=900)
    from selenium.webdriver.chrome.options import Options
    from selenium.webdriver.chrome.service import Service

    options = Options()
    options.binary_location = "/usr/bin/chromium"
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        "--disable-quic",
        "--window-size=1600,1000",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service("/usr/bin/chromedriver"), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Console:
    """A CDN with keys, a labelled simulated fleet, a running health-gated rollout."""

    def __init__(self, root: Path, port: int) -> None:
        self.key = SigningKey.generate()
        self.topics = Topics(f"t{os.urandom(4).hex()}")
        self.registry = open_registry(root / "registry.db")
        store = LocalBlobStore(root / "blobs")
        for v in (1, 2):
            blob = os.urandom(3000 + v)
            store.put(blob)
            self.registry.add_version(make_manifest_doc(self.key, MODEL, v, blob))
        keys_file = root / "keys.json"
        self.reader, reader = generate_api_key(["models:read"], name="reader")
        self.admin, admin = generate_api_key(["rollout:admin"], name="operator")
        for k in (reader, admin):
            ApiKeyFile(keys_file).add(k)
        self.settings = MqttSettings(host="127.0.0.1", port=port)
        self.service = FleetService(self.registry, self.key, self.settings, self.topics)
        self.app = create_app(
            registry=self.registry,
            store=store,
            admin_token=None,
            api_keys=ApiKeyGuard.from_file(keys_file),
            controller=self.service.controller,
        )
        self.url = ""

    def api(self, method: str, path: str, **kw: Any) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.admin}"}
        response = httpx.request(method, self.url + path, headers=headers, timeout=30, **kw)
        assert response.status_code < 300, response.text
        return dict(response.json())


@pytest.fixture
def console(tmp_path: Path) -> Iterator[Console]:
    broker = MosquittoProcess(tmp_path).start()
    c = Console(tmp_path, broker.port)
    try:
        with c.service, serve_in_thread(c.app) as url:
            c.url = url
            config = SimulatorConfig(
                devices=DEVICES,
                broker=c.settings,
                topic_prefix=c.topics.prefix,
                cdn_url=url,
                read_token=c.reader,  # with API keys set, downloads need models:read
                trusted_keys=(c.key.public_key,),
                model=MODEL,
                initial_version=1,
                telemetry_interval_s=1.0,
                install_delay_s=(0.01, 0.1),
                requests_per_s=(20.0, 40.0),
            )
            labels = {config.device_id(i): config.device_labels(i) for i in range(DEVICES)}
            c.api("POST", "/v1/fleet/labels", json={"devices": labels})
            with FleetSimulator(config):
                # Labelled devices are listed before they say anything: wait until each
                # one has reported running the model (a rollout targets only those).
                running = f"/v1/devices?model={MODEL}"
                _wait(lambda: len(c.api("GET", running)["devices"]) == DEVICES, 60)
                yield c
    finally:
        c.registry.close()
        broker.stop()


def _wait(predicate: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.2)


def _shots() -> Path | None:
    where = os.environ.get("TANDEM_CONSOLE_SCREENSHOTS")
    return Path(where) if where else None


def _sign_in(driver: Any, url: str, key: str) -> None:
    driver.get(url + "/console/")
    driver.execute_script("sessionStorage.clear()")
    driver.get(url + "/console/#/fleet")
    wait = WebDriverWait(driver, 30)
    wait.until(lambda d: d.find_element(By.ID, "key").is_displayed())
    driver.find_element(By.ID, "key").send_keys(key)
    driver.find_element(By.ID, "sign-in").click()
    wait.until(lambda d: d.find_element(By.ID, "logout").is_displayed())


def _text(driver: Any, element_id: str) -> str:
    found = driver.find_elements(By.ID, element_id)
    return str(found[0].text) if found else ""


def _post_from_page(driver: Any, path: str) -> int:
    """A POST made by the page's own script, with the key it holds: the status code."""
    return int(
        driver.execute_async_script(
            "const done = arguments[arguments.length - 1];"
            "fetch(arguments[0], {method: 'POST', headers: {Authorization: 'Bearer ' + "
            "sessionStorage.getItem('tandem-key')}}).then(r => done(r.status));",
            path,
        )
    )


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_console_shows_the_fleet_and_a_rollout_and_only_an_admin_can_act(
    console: Console, chromium: Any, tmp_path: Path
) -> None:
    try:
        _walk_through(console, chromium, tmp_path)
    except Exception:
        chromium.save_screenshot(str(tmp_path / "failed.png"))  # what the page showed
        raise


def _walk_through(console: Console, chromium: Any, tmp_path: Path) -> None:
    driver, url = chromium, console.url
    shots = _shots() or tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    rid = console.api(
        "POST",
        "/v1/rollouts",
        json={
            "model": MODEL,
            "version": 2,
            "waves": "20%,100%",
            "target": {"site": "factory-a"},
            "soak_s": 3,
            "looks": 4,
            "max_soak_s": 600,
            "max_agreement_drop": 0.02,
            "max_error_rate_increase": 0.01,
        },
    )["id"]
    wait = WebDriverWait(driver, 120)  # a loaded machine: minutes, not seconds

    # A reader: the fleet by site, with data from the running CDN.
    _sign_in(driver, url, console.reader)
    assert _text(driver, "who") == "read-only"
    wait.until(lambda d: "factory-a" in _text(d, "sites"))
    sites = _text(driver, "sites")
    for site in ("factory-a", "factory-b", "factory-c"):
        assert f"{site} 20 20" in sites, sites
    assert len(driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")) == DEVICES
    driver.save_screenshot(str(shots / "console-fleet.png"))

    # The rollout: waves, the gate judgements with their evidence plotted over time.
    driver.get(f"{url}/console/#/rollouts")
    wait.until(lambda d: rid in _text(d, "rollouts"))
    driver.find_element(By.LINK_TEXT, rid).click()
    wait.until(lambda d: "agreement" in _text(d, "judgements"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.plot polyline"))
    judgements = _text(driver, "judgements")
    assert "error_rate" in judgements and "/ " in judgements
    assert driver.find_elements(By.ID, "read-only")
    assert not driver.find_elements(By.ID, "action-pause")
    assert _post_from_page(driver, f"/console/api/rollouts/{rid}/pause") == 403
    assert console.api("GET", f"/v1/rollouts/{rid}")["state"] != "paused"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "svg.plot circle.look")) >= 2)
    driver.save_screenshot(str(shots / "console-rollout.png"))

    # Model versions: manifest sizes, deltas, the quantization report.
    driver.get(f"{url}/console/#/models/{MODEL}")
    wait.until(lambda d: "quantization" in _text(d, "versions"))
    assert "method=none" in _text(driver, "versions")
    driver.save_screenshot(str(shots / "console-models.png"))

    # An operator: pause, with a confirmation, changes the rollout.
    driver.find_element(By.ID, "logout").click()
    _sign_in(driver, url, console.admin)
    assert "can act" in _text(driver, "who")
    driver.get(f"{url}/console/#/rollouts/{rid}")
    wait.until(lambda d: d.find_elements(By.ID, "action-pause"))
    wait.until(lambda d: d.find_element(By.ID, "action-pause").is_enabled())
    driver.find_element(By.ID, "action-pause").click()
    wait.until(lambda d: d.find_element(By.ID, "confirm").is_displayed())
    assert rid in _text(driver, "confirm-text")
    assert console.api("GET", f"/v1/rollouts/{rid}")["state"] == "running"  # not yet
    driver.find_element(By.ID, "confirm-ok").click()
    _wait(lambda: console.api("GET", f"/v1/rollouts/{rid}")["state"] == "paused", 30)
    wait.until(lambda d: d.find_element(By.ID, "action-resume").is_enabled())
    driver.save_screenshot(str(shots / "console-rollout-paused.png"))
    state = json.loads(json.dumps(console.api("GET", f"/v1/rollouts/{rid}")))
    assert state["reason"] == "paused by operator"


def test_console_reads_need_a_key_and_actions_need_rollout_admin(tmp_path: Path) -> None:
    """Without a browser: the JSON routes' access rules, and the page's own headers."""
    c = Console(tmp_path, 1)  # the broker is never contacted: the service is not started
    with serve_in_thread(c.app) as url:
        page = httpx.get(url + "/console/")
        assert page.status_code == 200 and "console.js" in page.text
        assert "default-src 'self'" in page.headers["content-security-policy"]
        assert httpx.get(url + "/console/nope.js").status_code == 404
        anonymous = httpx.get(url + "/console/api/overview")
        assert anonymous.status_code == 401
        reader = {"Authorization": f"Bearer {c.reader}"}
        admin = {"Authorization": f"Bearer {c.admin}"}
        assert httpx.get(url + "/console/api/whoami", headers=reader).json() == {
            "read": True,
            "act": False,
        }
        assert httpx.get(url + "/console/api/whoami", headers=admin).json()["act"] is True
        overview = httpx.get(url + "/console/api/overview", headers=reader).json()
        assert overview["models"] == [{"name": MODEL, "versions": [1, 2]}]
        versions = httpx.get(url + f"/console/api/models/{MODEL}", headers=reader).json()
        assert versions["versions"][1]["manifest"]["quantization"]["method"] == "none"
        refused = httpx.post(url + "/console/api/rollouts/ro-000000000000/pause", headers=reader)
        assert refused.status_code == 403
        unknown = httpx.post(url + "/console/api/rollouts/ro-000000000000/nope", headers=admin)
        assert unknown.status_code == 404
