"""End to end in a real headless Chromium: start the dashboard server, open a stay, play it, see the warning.

Needs Debian's ``chromium`` and ``chromium-driver`` (bin/setup installs them where it can) and selenium (the test
extra). Saves what the browser shows to ``test-artifacts/dashboard.png``.
"""

from __future__ import annotations

import re
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from garlic.app import sources
from garlic.metrics.alert_policy import AlertPolicy
from garlic.metrics.threshold import threshold_at_sensitivity
from helpers import tiny_run

REPO = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOT = REPO / "test-artifacts" / "dashboard.png"
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1400,1700",
]

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
        reason=f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver (as bin/setup does)",
    ),
]
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium: pip install -e '.[test]'")
By = pytest.importorskip("selenium.webdriver.common.by").By
Keys = pytest.importorskip("selenium.webdriver.common.keys").Keys
selenium_errors = pytest.importorskip("selenium.common.exceptions")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for(condition, timeout: float, what: str):
    """Poll ``condition`` until it returns something truthy; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(0.2)
    pytest.fail(f"gave up after {timeout:g} s waiting for {what}")


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/_stcore/health", timeout=2) as response:
            return response.read() == b"ok"
    except OSError:
        return False


def start_dashboard(run, port: int, log: Path) -> subprocess.Popen:
    """The server started by ``garlic dashboard`` (on the loopback address, its default)."""
    command = [
        sys.executable,
        "-m",
        "garlic.cli",
        "--mlruns",
        str(run.store),
        "--data-root",
        str(run.data_root),
        "dashboard",
        "--run",
        run.run_id,
        "--port",
        str(port),
    ]
    return subprocess.Popen(command, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return tiny_run(tmp_path_factory)


@pytest.fixture
def dashboard(run, tmp_path):
    """The running server's address; the server is stopped afterwards."""
    port = free_port()
    server = start_dashboard(run, port, tmp_path / "server.log")
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: healthy(url) or server.poll() is not None, 60, "the dashboard server to start")
        assert server.poll() is None, (tmp_path / "server.log").read_text()
        yield url
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
def browser(tmp_path):
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for flag in [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium-profile'}"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=webdriver.ChromeService(str(CHROMEDRIVER)), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def alerts(driver, text: str) -> list:
    return [a for a in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stAlert"]') if text in a.text]


def drawn_charts(driver) -> list:
    return driver.find_elements(
        By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"] canvas, [data-testid="stVegaLiteChart"] svg'
    )


def playback(driver) -> str:
    metrics = [m.text for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')]
    return next((m for m in metrics if m.startswith("Playback")), "")


def test_playing_a_high_risk_stay_shows_the_risk_chart_and_a_warning(run, dashboard, browser):
    from garlic.app.replay import replay_stay

    test = sources.predictions(run.store, run.run_id, "test")
    validation = sources.predictions(run.store, run.run_id, "validation")
    policy = AlertPolicy(threshold_at_sensitivity(validation["label"], validation["risk"]))  # the run's, as the page
    trained, logged = sources.load_run(run.store, run.run_id)
    dataset = sources.test_split(trained, logged, run.data_root)
    positive = None
    for _, candidate in test[test["label"] == 1].sort_values("risk", ascending=False).iterrows():
        replay = replay_stay(trained, dataset, int(np.searchsorted(dataset.stay_ids, candidate["stay_id"])))
        if policy.alarms(replay.risk, replay.hours, [len(replay.hours)])[-1]:  # its alert on at its last hour
            positive = candidate
            break
    assert positive is not None, "a positive test stay must end with its alert on to raise a warning"

    browser.get(f"{dashboard}/?stay={int(positive['stay_id'])}")
    wait_for(lambda: drawn_charts(browser), 90, "the risk chart")
    headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h3")]
    assert any(h.startswith(f"Stay {int(positive['stay_id'])} ") for h in headings), headings

    buttons = [b.text for b in browser.find_elements(By.TAG_NAME, "button")]
    assert not [b for b in buttons if "Deploy" in b] and not browser.find_elements(
        By.CSS_SELECTOR, '[data-testid="stAppDeployButton"], [data-testid="stMainMenu"]'
    )  # no developer toolbar
    # The fastest replay, one step right of the default speed on the sidebar: the stay plays in half the time.
    speed = wait_for(lambda: browser.find_elements(By.CSS_SELECTOR, 'input[aria-label="Speed"]'), 30, "the speed")
    webdriver.ActionChains(browser).click(speed[0].find_element(By.XPATH, "../..")).perform()
    browser.switch_to.active_element.send_keys(Keys.ARROW_RIGHT)
    wait_for(
        lambda: browser.find_elements(By.CSS_SELECTOR, 'input[aria-label="Speed"][aria-valuetext="8 h/s"]'),
        30,
        "the speed at 8 h/s",
    )
    play = wait_for(lambda: [b for b in browser.find_elements(By.TAG_NAME, "button") if "Play" in b.text], 30, "Play")
    play[0].click()
    wait_for(lambda: "playing" in playback(browser), 30, "the replay to start")
    wait_for(lambda: "paused" in playback(browser), 120, "the replay to reach the last hour and stop")
    hour, last_hour = re.search(r"hour (\d+) of (\d+)", playback(browser)).groups()
    assert hour == last_hour
    warning = wait_for(lambda: alerts(browser, "Warning: alert on"), 30, "the warning at the end of the stay")
    assert "raised at" in warning[0].text and "Driven by" in warning[0].text
    # The end of the replay reruns the whole page, and Vega redraws its canvas after the alert text is in: poll.
    wait_for(lambda: drawn_charts(browser), 30, "the risk chart to be drawn again after the replay stopped")

    SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 10_000


def test_the_ward_view_lists_the_live_beds_by_risk_banners_a_crossing_and_opens_a_bed(run, browser, tmp_path):
    from datetime import datetime, timedelta, timezone

    from garlic.metrics.alert_policy import AlertPolicy
    from garlic.live.feed import recorded_stays
    from garlic.live.fhir import Observed, Stay
    from garlic.live.monitor import Monitor
    from garlic.live.scoring import BedScorer
    from garlic.live.store import LiveStore
    from garlic.methods.saved import load_predictor

    # A ward of three recorded test stays, scored with a threshold none reaches, as garlic monitor scores them.
    trained = load_predictor(run.run_id, run.store)
    _, observations, static = recorded_stays(run.run_id, run.store, run.data_root, beds=3)
    url = f"sqlite:///{tmp_path / 'ward.sqlite'}"
    start = datetime(2026, 1, 1, 8, tzinfo=timezone.utc)
    monitor = Monitor(LiveStore(url, run.run_id), BedScorer(trained), AlertPolicy(0.99))
    for stay in static["stay_id"]:
        monitor.store.admit(Stay(str(stay), True, start, None))
    monitor.take(
        [
            Observed(str(stay), str(variable), start + timedelta(hours=float(time)), float(value))
            for stay, time, variable, value in observations.itertuples(index=False)
        ]
    )
    while monitor.score_round():
        pass
    by_risk = monitor.store.beds().sort_values("risk", ascending=False)["bed"].tolist()

    port = free_port()
    command = [
        sys.executable,
        "-m",
        "garlic.cli",
        "--mlruns",
        str(run.store),
        "--data-root",
        str(run.data_root),
        "dashboard",
        "--run",
        run.run_id,
        "--port",
        str(port),
        "--ward",
        url,
    ]
    log = tmp_path / "server.log"
    server = subprocess.Popen(command, cwd=REPO, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    try:
        dashboard = f"http://127.0.0.1:{port}"
        wait_for(lambda: healthy(dashboard) or server.poll() is not None, 60, "the dashboard server to start")
        assert server.poll() is None, log.read_text()
        browser.get(dashboard)

        def ward_beds() -> list[str]:  # the grid draws on a canvas; its cells are in the page for screen readers
            cells = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"] [role="gridcell"]')
            return [text for cell in cells if (text := cell.get_attribute("textContent")) in by_risk]

        assert wait_for(lambda: ward_beds() == by_risk and ward_beds(), 90, "the ward's beds, highest risk first")
        assert not alerts(browser, "crossed")
        # The last bed crosses a lower threshold at a new reading: the ward, redrawing itself, raises the banner.
        monitor.alerts = AlertPolicy(0.01)
        last = by_risk[-1]
        monitor.take([Observed(last, "HR", start + timedelta(hours=47.9), 150.0)])
        while monitor.score_round():
            pass
        banner = wait_for(lambda: alerts(browser, "crossed"), 30, "the banner of the bed that crossed its threshold")
        assert f"bed {last} crossed" in banner[0].text

        # Picking the first row (its selection box) opens that bed in the bedside view, with its live data. A click
        # that lands while the ward redraws itself is lost, as a user's would be: it is tried again every 20 s; one
        # that finds the table mid-redraw (gone, or not yet laid out) is tried again at the next look.
        next_click = [0.0]

        def picked() -> list[str]:
            heading = [h.text for h in browser.find_elements(By.TAG_NAME, "h3") if h.text.startswith("Bed ")]
            grids = browser.find_elements(By.CSS_SELECTOR, '[data-testid="stDataFrame"]')
            if not heading and grids and time.monotonic() >= next_click[0]:
                try:
                    box = grids[0].rect
                    webdriver.ActionChains(browser).move_to_element_with_offset(
                        grids[0], -box["width"] / 2 + 16, -box["height"] / 2 + 35 + 17
                    ).click().perform()
                except (
                    selenium_errors.ElementNotInteractableException,
                    selenium_errors.StaleElementReferenceException,
                ):
                    return heading
                next_click[0] = time.monotonic() + 20
            return heading

        heading = wait_for(picked, 60, "the bedside view of the bed picked")
        assert heading[0].startswith(f"Bed {monitor.store.beds().sort_values('risk').iloc[-1]['bed']} · live ward")
        wait_for(lambda: drawn_charts(browser), 60, "the bed's risk chart")
        browser.get(f"{dashboard}/?bed={last}")  # a link to one bed opens it too
        wait_for(
            lambda: [h for h in browser.find_elements(By.TAG_NAME, "h3") if h.text.startswith(f"Bed {last} ·")],
            60,
            "the bedside view of the bed linked to",
        )
    finally:
        server.terminate()
        server.wait(timeout=10)
        monitor.store.close()
