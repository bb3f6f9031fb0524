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

import pytest

from garlic.app import sources
from garlic.metrics.threshold import threshold_at_sensitivity
from helpers import tiny_run

REPO = Path(__file__).resolve().parents[1]
CHROMIUM, CHROMEDRIVER = Path("/usr/bin/chromium"), Path("/usr/bin/chromedriver")
SCREENSHOT = REPO / "test-artifacts" / "dashboard.png"
CHROMIUM_FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync", "--window-size=1400,1700",
]  # fmt: skip

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
        reason=f"needs {CHROMIUM} and {CHROMEDRIVER}: apt-get install chromium chromium-driver (as bin/setup does)",
    ),
]
webdriver = pytest.importorskip("selenium.webdriver", reason="needs selenium: pip install -e '.[test]'")
By = pytest.importorskip("selenium.webdriver.common.by").By


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
    command = [sys.executable, "-m", "garlic.cli", "--mlruns", str(run.store), "--data-root", str(run.data_root),
               "dashboard", "--run", run.run_id, "--port", str(port)]  # fmt: skip
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
    return driver.find_elements(By.CSS_SELECTOR, '[data-testid="stVegaLiteChart"] canvas, '
                                                 '[data-testid="stVegaLiteChart"] svg')  # fmt: skip


def playback(driver) -> str:
    metrics = [m.text for m in driver.find_elements(By.CSS_SELECTOR, '[data-testid="stMetric"]')]
    return next((m for m in metrics if m.startswith("Playback")), "")


def test_playing_a_high_risk_stay_shows_the_risk_chart_and_a_warning(run, dashboard, browser):
    test = sources.predictions(run.store, run.run_id, "test")
    validation = sources.predictions(run.store, run.run_id, "validation")
    positive = test[test["label"] == 1].sort_values("risk").iloc[-1]
    threshold = threshold_at_sensitivity(validation["label"], validation["risk"])
    assert positive["risk"] >= threshold, "the chosen stay must end above the default threshold to raise a warning"

    browser.get(f"{dashboard}/?stay={int(positive['stay_id'])}")
    wait_for(lambda: drawn_charts(browser), 90, "the risk chart")
    headings = [h.text for h in browser.find_elements(By.TAG_NAME, "h3")]
    assert any(h.startswith(f"Stay {int(positive['stay_id'])} ") for h in headings), headings

    buttons = [b.text for b in browser.find_elements(By.TAG_NAME, "button")]
    assert not [b for b in buttons if "Deploy" in b] and not browser.find_elements(
        By.CSS_SELECTOR, '[data-testid="stAppDeployButton"], [data-testid="stMainMenu"]')  # no developer toolbar
    play = wait_for(lambda: [b for b in browser.find_elements(By.TAG_NAME, "button") if "Play" in b.text], 30, "Play")
    play[0].click()
    wait_for(lambda: "playing" in playback(browser), 30, "the replay to start")
    wait_for(lambda: "paused" in playback(browser), 120, "the replay to reach the last hour and stop")
    hour, last_hour = re.search(r"hour (\d+) of (\d+)", playback(browser)).groups()
    assert hour == last_hour
    warning = wait_for(lambda: alerts(browser, "Warning: risk"), 30, "the warning at the end of the stay")
    assert "above the alert threshold" in warning[0].text and "Driven by" in warning[0].text
    # The end of the replay reruns the whole page, and Vega redraws its canvas after the alert text is in: poll.
    wait_for(lambda: drawn_charts(browser), 30, "the risk chart to be drawn again after the replay stopped")

    SCREENSHOT.parent.mkdir(exist_ok=True)
    browser.execute_script("window.scrollTo(0, 0)")
    browser.save_screenshot(str(SCREENSHOT))
    assert SCREENSHOT.stat().st_size > 10_000
