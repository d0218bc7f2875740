"""The cockpit in a browser: `cockpit serve` (textual-serve) driven by a real headless Chromium
through Selenium. The page's terminal draws on a canvas, so the test reads what the browser
received over the page's own websocket, and types into the page like a person would."""

import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import free_port, run_cli, wait_port

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"

# Wraps the page's WebSocket before its scripts run: every message the cockpit sends is decoded
# and kept in window.__cockpit.
CAPTURE = """
window.__cockpit = {text: "", opened: 0};
const Original = window.WebSocket;
function Capturing(url, protocols) {
  const ws = protocols === undefined ? new Original(url) : new Original(url, protocols);
  window.__cockpit.opened += 1;
  ws.addEventListener("message", async (event) => {
    let data = event.data;
    if (data instanceof Blob) data = await data.arrayBuffer();
    if (data instanceof ArrayBuffer) data = new TextDecoder().decode(data);
    window.__cockpit.text += data;
  });
  return ws;
}
Capturing.prototype = Original.prototype;
Object.assign(Capturing, {CONNECTING: 0, OPEN: 1, CLOSING: 2, CLOSED: 3});
window.WebSocket = Capturing;
"""


def browser_missing() -> str | None:
    if not (os.path.exists(CHROMIUM) and os.path.exists(DRIVER)):
        return "chromium and chromium-driver are not installed (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
        import textual_serve  # noqa: F401
    except ImportError:
        return "selenium or textual-serve is missing (pip install -e '.[test]')"
    return None


@pytest.fixture
def browser():
    missing = browser_missing()
    if missing:
        if os.environ.get("CI"):
            pytest.fail(missing + ": scripts/test installs them")
        pytest.skip(missing)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1600,1000",
                "--disable-gpu"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    driver.execute_cdp_cmd("Page.addScriptToEvaluateOnNewDocument", {"source": CAPTURE})
    yield driver
    driver.quit()


def received(driver) -> str:
    return driver.execute_script("return window.__cockpit ? window.__cockpit.text : ''") or ""


def wait_text(driver, needles: list[str], timeout: float, since: int = 0) -> str:
    deadline = time.monotonic() + timeout
    text = ""
    while time.monotonic() < deadline:
        text = received(driver)[since:]
        if all(n in text for n in needles):
            return text
        time.sleep(0.2)
    raise AssertionError(f"the browser never received {needles!r}; got {len(text)} chars")


def test_the_cockpit_renders_in_headless_chromium_and_answers_a_key(browser, sim_state, ranks, tmp_path):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By

    ranks.spawn("sglang::scheduler_TP0", gpu=0, mib=6000)
    port = free_port()
    server = subprocess.Popen([sys.executable, "-m", "cockpit", "serve", "local", "--port", str(port),
                               "--sim", str(sim_state), "--python", sys.executable, "--read-only"],
                              stdout=open(tmp_path / "serve.log", "wb"), stderr=subprocess.STDOUT,
                              start_new_session=True)
    try:
        wait_port(port, 20)
        browser.get(f"http://127.0.0.1:{port}/")
        text = wait_text(browser, [f"GPU{i}" for i in range(8)] + ["sglang::scheduler_TP0"], 40)
        assert "RTX PRO 6000" in text or "H200" in text  # the simulated GPUs' names in the pane titles
        terminal = browser.find_element(By.ID, "terminal")
        ActionChains(browser).click(terminal).perform()
        before = len(received(browser))
        ActionChains(browser).send_keys("?").perform()
        wait_text(browser, ["kill the whole run"], 15, since=before)  # the help screen, drawn after the key
        browser.save_screenshot(str(tmp_path / "browser.png"))
        assert (tmp_path / "browser.png").stat().st_size > 10_000
    finally:
        os.killpg(server.pid, 15)
        server.wait(10)
    assert "Serving" in (tmp_path / "serve.log").read_text()


def test_serve_binds_loopback_unless_told_and_then_warns():
    out = run_cli("serve", "demo", "--bind", "0.0.0.0", "--port", str(free_port()))
    assert out.returncode == 2
    assert "no authentication" in out.stderr and "ssh -L" in out.stderr and "--allow-remote" in out.stderr
    assert "Traceback" not in out.stderr
