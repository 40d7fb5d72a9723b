"""The fleet console in a real browser: Debian's headless Chromium, driven by Selenium.

Real parts: a Mosquitto broker of its own, the CDN app (uvicorn on loopback)
with its rollout controller and API keys, a simulated fleet (real MQTT
connections, real signed downloads) labelled by the operator, and a rollout
running with a health gate. ``make test`` installs Chromium and ChromeDriver
(``scripts/ensure-chromium``, apt-get) where they are missing; without them
these tests skip, and fail under CI.

Set ``TANDEM_CONSOLE_SCREENSHOTS=docs`` to write the screenshots the README
shows (``docs/console-*.png``); otherwise they go to the test's temp folder.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from model_cdn import FleetService, LocalBlobStore, create_app, open_registry
from model_cdn.http._console_gates import with_cohorts
from shared import MqttSettings, SigningKey, Topics
from shared.server import ApiKeyFile, ApiKeyGuard, generate_api_key
from tandem.simulator import FleetSimulator, SimulatorConfig

from ._brokers import MosquittoProcess
from ._cdn import make_manifest_doc, serve_in_thread
from ._console_fleet import SITES, judged_with_an_outlier, quantized_manifest_doc, seed_fleet
from ._needs import need

MODEL = "mnist-edge"
DEVICES = 60

CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")


def _browser_missing() -> str | None:
    for exe in (CHROMIUM, CHROMEDRIVER):
        if not os.access(exe, os.X_OK):
            return (
                f"{exe} is not installed (`make chromium` or scripts/ensure-chromium installs it)"
            )
    return None


@pytest.fixture(scope="module")
def chromium() -> Iterator[Any]:
    need(_browser_missing())  # installed by `make test`, not here; failed under CI when absent
    options = Options()
    options.binary_location = str(CHROMIUM)
    for flag in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-background-networking",
        "--disable-component-update",
        "--no-first-run",
        "--disable-sync",
        "--disable-quic",
        "--window-size=1400,1000",  # the width: nothing may be cut off
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Console:
    """A CDN with keys, a labelled simulated fleet, a running health-gated rollout."""

    def __init__(self, root: Path, port: int, *, rollouts: bool = True) -> None:
        self.key = SigningKey.generate()
        self.topics = Topics(f"t{os.urandom(4).hex()}")
        self.registry = open_registry(root / "registry.db")
        store = LocalBlobStore(root / "blobs")
        for v in (1, 2):
            blob = os.urandom(3000 + v)
            store.put(blob)
            doc = (make_manifest_doc if v == 1 else quantized_manifest_doc)(
                self.key, MODEL, v, blob
            )
            self.registry.add_version(doc)
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
            controller=self.service.controller if rollouts else None,
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


_CUT_OFF = """
const width = document.documentElement.clientWidth, out = [];
if (document.documentElement.scrollWidth > width) out.push("the page scrolls sideways");
for (const cell of document.querySelectorAll(arguments[0])) {
  const r = cell.getBoundingClientRect();
  if (r.right > width + 0.5 || r.left < 0) out.push(`${cell.textContent} ends at ${r.right}`);
  if (cell.scrollWidth > cell.clientWidth) out.push(`${cell.textContent} overflows its cell`);
}
return out;
"""


def _screenshot(driver: Any, path: Path) -> None:
    """The whole page at 1400 px wide (the window grows to its height, then shrinks back)."""
    height = int(driver.execute_script("return document.documentElement.scrollHeight"))
    driver.set_window_size(1400, min(max(height + 140, 1000), 2400))
    try:
        driver.save_screenshot(str(path))
    finally:
        driver.set_window_size(1400, 1000)


def _cut_off(driver: Any, selector: str) -> list[str]:
    """What of the cells ``selector`` finds is not wholly visible (at the window's width)."""
    assert driver.find_elements(By.CSS_SELECTOR, selector), selector
    return list(driver.execute_script(_CUT_OFF, selector))


def _text(driver: Any, element_id: str) -> str:
    """The element's visible text, read in one script call (the page re-renders every 2 s:
    an element found in one call may be gone by the next)."""
    script = "const e = document.getElementById(arguments[0]); return e ? e.innerText : '';"
    return str(driver.execute_script(script, element_id)).replace("\t", " ")


def _cells(driver: Any, table_id: str) -> list[list[str]]:
    """Every body row's cell texts, read in one script call."""
    script = (
        "return [...document.querySelectorAll(`#${arguments[0]} tbody tr`)]"
        ".map((r) => [...r.cells].map((c) => c.innerText));"
    )
    return [list(map(str, row)) for row in driver.execute_script(script, table_id)]


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
            "accept_inconclusive": True,  # 4 vs 4 devices: it judges on, for the page to show
        },
    )["id"]
    wait = WebDriverWait(  # a loaded machine: minutes, not seconds; the page re-renders every 2 s
        driver, 120, ignored_exceptions=(StaleElementReferenceException,)
    )

    # A reader: the fleet by site, with data from the running CDN.
    _sign_in(driver, url, console.reader)
    assert _text(driver, "who") == "read-only"
    wait.until(lambda d: "factory-a" in _text(d, "sites"))
    sites = _text(driver, "sites")
    for site in ("factory-a", "factory-b", "factory-c"):
        assert f"{site} 20 20" in sites, sites
    assert _text(driver, "page-summary") == f"Devices 1\u201350 of {DEVICES}"
    assert len(driver.find_elements(By.CSS_SELECTOR, "#devices tbody tr")) == 50

    # The rollout: waves, the gate judgements with their evidence plotted over time.
    driver.get(f"{url}/console/#/rollouts")
    wait.until(lambda d: rid in _text(d, "rollouts"))
    wait.until(lambda d: "health inconclusive" in _text(d, "rollouts"))  # a long "now"
    assert _cut_off(driver, "#rollouts td") == []
    driver.save_screenshot(str(shots / "console-rollouts.png"))
    _click(driver, rid, By.LINK_TEXT)
    wait.until(lambda d: "agreement" in _text(d, "judgements"))
    wait.until(lambda d: d.find_elements(By.CSS_SELECTOR, "svg.plot polyline"))
    judgements = _text(driver, "judgements")
    assert "error_rate" in judgements and "/ " in judgements
    assert _cut_off(driver, "#judgements td") == []  # the "why" column wraps, whole
    _header_counts_what_the_table_counts(driver)
    assert driver.find_elements(By.ID, "read-only")
    assert not driver.find_elements(By.ID, "action-pause")
    assert _post_from_page(driver, f"/console/api/rollouts/{rid}/pause") == 403
    assert console.api("GET", f"/v1/rollouts/{rid}")["state"] != "paused"
    wait.until(lambda d: len(d.find_elements(By.CSS_SELECTOR, "svg.plot circle.look")) >= 2)
    # the charts say what they plot, and in which unit
    wait.until(lambda d: any(t.endswith(" pts") for t in _plot_labels(d, "agreement")))
    assert "percentage points" in _plot_labels(driver, "agreement")
    legends = _plot_labels(driver, None)
    assert any("agreement: control \u2212 new, in percentage points" in t for t in legends)
    assert any("error_rate: new \u2212 control, in percentage points" in t for t in legends)
    _screenshot(driver, shots / "console-rollout.png")

    # Model versions: manifest sizes, deltas, the quantization report.
    driver.get(f"{url}/console/#/models/{MODEL}")
    wait.until(lambda d: "quantization" in _text(d, "versions"))
    assert "method=int8-static" in _text(driver, "versions")
    assert "kernel_max_abs_diff=0.000122" in _text(driver, "versions")
    assert "quantized_bytes=458,930" in _text(driver, "versions")
    assert _cut_off(driver, "#versions td") == []  # the whole report, wrapped
    driver.save_screenshot(str(shots / "console-models.png"))

    # An operator: pause, with a confirmation, changes the rollout.
    _click(driver, "logout")
    _sign_in(driver, url, console.admin)
    assert "can act" in _text(driver, "who")
    driver.get(f"{url}/console/#/rollouts/{rid}")
    wait.until(lambda d: d.find_elements(By.ID, "action-pause"))
    wait.until(lambda d: d.find_element(By.ID, "action-pause").is_enabled())
    _click(driver, "action-pause")
    wait.until(lambda d: d.find_element(By.ID, "confirm").is_displayed())
    assert rid in _text(driver, "confirm-text")
    assert console.api("GET", f"/v1/rollouts/{rid}")["state"] == "running"  # not yet
    _click(driver, "confirm-ok")
    _wait(lambda: console.api("GET", f"/v1/rollouts/{rid}")["state"] == "paused", 30)
    wait.until(lambda d: d.find_element(By.ID, "action-resume").is_enabled())
    _screenshot(driver, shots / "console-rollout-paused.png")
    state = json.loads(json.dumps(console.api("GET", f"/v1/rollouts/{rid}")))
    assert state["reason"] == "paused by operator"

    # Skip gate (issue 21): a confirm dialog with a reason; cancelling changes nothing.
    wait.until(lambda d: d.find_element(By.ID, "action-skip-gate").is_enabled())
    _click(driver, "action-skip-gate")
    wait.until(lambda d: d.find_element(By.ID, "skip-reason").is_displayed())
    assert "without its judgement" in _text(driver, "confirm-text")
    _click(driver, "confirm-cancel")
    assert not driver.find_elements(By.ID, "skip-reason")
    history = console.api("GET", f"/v1/rollouts/{rid}")["history"]
    assert [e["action"] for e in history] == ["start", "pause"]
    _click(driver, "action-skip-gate")
    wait.until(lambda d: d.find_element(By.ID, "skip-reason").is_displayed())
    driver.find_element(By.ID, "skip-reason").send_keys("checked the cameras by hand")
    _click(driver, "confirm-ok")
    _wait(
        lambda: console.api("GET", f"/v1/rollouts/{rid}")["history"][-1]["action"] == "skip-gate",
        30,
    )
    last = console.api("GET", f"/v1/rollouts/{rid}")["history"][-1]
    assert last["reason"] == "checked the cameras by hand" and last["by"].startswith("key ")


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
        assert versions["versions"][1]["manifest"]["quantization"]["method"] == "int8-static"
        refused = httpx.post(url + "/console/api/rollouts/ro-000000000000/pause", headers=reader)
        assert refused.status_code == 403
        unknown = httpx.post(url + "/console/api/rollouts/ro-000000000000/nope", headers=admin)
        assert unknown.status_code == 404


def _plot_labels(driver: Any, metric: str | None) -> list[str]:
    """The texts in a gate's chart (``metric``), or every chart's legend (``None``)."""
    script = (
        "const where = arguments[0] ? `svg.plot[data-metric='${arguments[0]}'] text`"
        " : '.chart .legend';"
        "return [...document.querySelectorAll(where)].map((t) => t.textContent);"
    )
    return [str(t) for t in driver.execute_script(script, metric)]


def _header_counts_what_the_table_counts(driver: Any) -> None:
    """The gate header's devices per cohort are the table's (one source): each cohort's
    size is the table's "of N", and its counted devices (a range where gates differ) are
    the fewest and most of the table's column."""
    header = _text(driver, "cohorts")
    rows = [row[8] for row in _cells(driver, "judgements")]  # "n of N / c of C"
    for side, name in ((0, "new version"), (1, "previous version")):
        pairs = [tuple(map(int, r.split(" / ")[side].split(" of "))) for r in rows]
        members = {m for _, m in pairs}
        lo, hi = min(n for n, _ in pairs), max(n for n, _ in pairs)
        counted = f"{hi} counted" if lo == hi else f"{lo}\u2013{hi} counted, by gate"
        assert len(members) == 1, rows
        assert f"{name}: {members.pop()} devices, {counted}" in header, (header, rows)


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_gate_header_names_an_excluded_outlier_as_the_table_counts_it(
    chromium: Any, tmp_path: Path
) -> None:
    """The page's own header and table code, in the browser, on a real judgement that
    excluded one control device: 3 control devices, 2 counted, the outlier named."""
    c = Console(tmp_path, 1)
    gates = judged_with_an_outlier()
    with serve_in_thread(c.app) as url:
        _sign_in(chromium, url, c.reader)
        g = with_cohorts({"gates": gates})["gates"]
        header = chromium.execute_script("return cohortLine(arguments[0])", g["cohorts"])
        agreement = next(j for j in g["judgements"] if j["metric"] == "agreement")
        cell = chromium.execute_script(
            "return counted(arguments[0], arguments[1])", agreement, g["cohorts"]
        )
    assert "control, kept on the previous version: 3 devices, 2 counted" in header, header
    assert "1 excluded as an outlier: ctl-2" in header, header
    assert "new version: 3 devices, 3 counted" in header, header
    assert cell == "3 of 3 / 2 of 3", cell


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_fleet_page_pages_and_filters_ten_thousand_devices(
    chromium: Any, tmp_path: Path
) -> None:
    """10,000 devices in the registry: the page shows 50 at a time, stays short, pages
    forward and back, and its filter box narrows on the server."""
    c = Console(tmp_path, 1, rollouts=False)  # no broker: the fleet is the registry's
    seed_fleet(c.registry, 10_000, time.time())
    driver = chromium
    shots = _shots() or tmp_path
    try:
        with serve_in_thread(c.app) as url:
            _paging_and_filtering(driver, url, c.reader, shots)
    except Exception:
        driver.save_screenshot(str(tmp_path / "failed.png"))
        raise
    finally:
        c.registry.close()


def _click(driver: Any, what: str, by: str = By.ID) -> None:
    """Click the element ``by`` finds as ``what`` (an id unless told); found again if a
    refresh replaced it between finding and clicking (the page re-renders every 2 s)."""
    WebDriverWait(driver, 30, ignored_exceptions=(StaleElementReferenceException,)).until(
        lambda d: d.find_element(by, what).click() or True
    )


def _erase(box: Any) -> None:
    """Empty a text box as a person does (select all, delete: the page hears the input)."""
    from selenium.webdriver.common.keys import Keys

    box.send_keys(Keys.CONTROL, "a")
    box.send_keys(Keys.DELETE)


def _rows(driver: Any) -> list[str]:
    return [row[0] for row in _cells(driver, "devices")]


def _paging_and_filtering(driver: Any, url: str, key: str, shots: Path) -> None:
    wait = WebDriverWait(driver, 60)
    _sign_in(driver, url, key)
    wait.until(lambda d: _text(d, "page-summary") == "Devices 1\u201350 of 10,000")
    assert len(_rows(driver)) == 50
    assert _cut_off(driver, "#devices td, #sites td") == []
    height = driver.execute_script("return document.documentElement.scrollHeight")
    assert height < 2600, height  # 10,000 rows would be ~330,000 px
    for site in SITES:
        assert site in _text(driver, "sites")
    driver.save_screenshot(str(shots / "console-fleet.png"))

    _click(driver, "page-next")
    wait.until(lambda d: _text(d, "page-summary") == "Devices 51\u2013100 of 10,000")
    assert _rows(driver)[0] == "cam-00050"
    assert "offset=50" in driver.current_url  # a link shows the same page
    _click(driver, "page-prev")
    wait.until(lambda d: _text(d, "page-summary") == "Devices 1\u201350 of 10,000")
    assert not driver.find_element(By.ID, "page-prev").is_enabled()

    # The filter box: a label and a status narrow the total; typing survives the polls.
    box = driver.find_element(By.ID, "filter")
    box.send_keys("site=factory-b status:offline")
    expected = sum(1 for i in range(10_000) if i % 3 == 1 and i % 10 == 9 and i % 100 != 99)
    wait.until(
        lambda d: (
            _text(d, "page-summary")
            == f"Devices 1\u201350 of {expected:,} matching (fleet: 10,000)"
        )
    )
    rendered = driver.execute_script("return generation")
    wait.until(lambda d: d.execute_script("return generation") > rendered + 1)  # two polls
    assert driver.switch_to.active_element.get_attribute("id") == "filter"
    assert box.get_attribute("value") == "site=factory-b status:offline"
    rows = _cells(driver, "devices")
    assert len(rows) == 50 and all("site=factory-b" in r[1] and r[3] == "no" for r in rows)
    _erase(box)
    box.send_keys("CAM-01234")
    wait.until(lambda d: _rows(d) == ["cam-01234"])
    assert _text(driver, "page-summary") == "Devices 1\u20131 of 1 matching (fleet: 10,000)"
    _erase(box)
    box.send_keys("version:two")  # refused by the server: said under the box
    wait.until(lambda d: "version needs model" in _text(d, "filter-error"))
    assert _rows(driver) == []

    # page size
    _erase(box)
    wait.until(lambda d: _text(d, "page-summary") == "Devices 1\u201350 of 10,000")
    Select = pytest.importorskip("selenium.webdriver.support.ui").Select
    Select(driver.find_element(By.ID, "page-size")).select_by_value("200")
    wait.until(lambda d: _text(d, "page-summary") == "Devices 1\u2013200 of 10,000")
    assert len(_rows(driver)) == 200
