"""The cockpit in a browser: `cockpit serve` (textual-serve) driven by a real headless Chromium
through Selenium. The page's terminal draws on a canvas, so the test reads what the browser
received over the page's own websocket, and types into the page like a person would."""

import asyncio
import os
import re
import shutil
import subprocess
import sys
import time

import pytest
from conftest import cannot_run, free_port, run_cli, wait_port

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
        cannot_run(missing + ": scripts/test installs them")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--window-size=1600,1000",
        "--disable-gpu",
    ):
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
    server, url = start_serve(tmp_path, "local", "--sim", str(sim_state), "--python", sys.executable)
    try:
        browser.get(url)
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
    assert "plain HTTP" in out.stderr and "ssh -L" in out.stderr and "--allow-remote" in out.stderr
    assert "Traceback" not in out.stderr


def start_serve(tmp_path, *args: str) -> tuple[subprocess.Popen, str]:
    """`cockpit serve` in a subprocess, and the URL it printed (with this start's token)."""
    port = free_port()
    log = tmp_path / "serve.log"
    server = subprocess.Popen(
        [sys.executable, "-m", "cockpit", "serve", *args, "--port", str(port)],
        stdout=open(log, "wb"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    wait_port(port, 20)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        m = re.search(r"Serving gpu-cockpit on (http://127\.0\.0\.1:%d/\?token=[\w-]+)" % port, log.read_text())
        if m:
            return server, m.group(1)
        time.sleep(0.1)
    raise AssertionError(log.read_text())


def test_the_served_page_and_websocket_need_the_token_and_the_pages_own_origin(tmp_path):
    import aiohttp

    server, url = start_serve(tmp_path, "local", "--python", "/bin/false")
    base, token = url.split("/?token=")
    own = {"Origin": base}

    async def probe():
        out = {}
        async with aiohttp.ClientSession() as http:
            for name, path in (
                ("bare", "/"),
                ("wrong", "/?token=" + token[:-1]),
                ("good", f"/?token={token}"),
                ("download", "/download/abc"),
            ):
                async with http.get(base + path) as r:
                    out[name] = (r.status, await r.text(), dict(r.headers))
            async with http.get(
                f"{base}/?token={token}", headers={"Host": f"evil.example:{base.rsplit(':', 1)[1]}"}
            ) as r:
                out["rebound"] = (r.status, await r.text(), {})
            ws = base.replace("http", "ws")
            for name, path, headers in (
                ("ws-bare", "/ws", own),
                ("ws-wrong", "/ws/nope", own),
                ("ws-evil", f"/ws/{token}", {"Origin": "http://evil.example"}),
                ("ws-no-origin", f"/ws/{token}", {}),
                ("ws-good", f"/ws/{token}", own),
            ):
                try:
                    async with http.ws_connect(ws + path + "?width=80&height=24", headers=headers) as sock:
                        out[name] = 101
                        await sock.close()
                except aiohttp.WSServerHandshakeError as exc:
                    out[name] = exc.status
        return out

    try:
        got = asyncio.run(probe())
    finally:
        os.killpg(server.pid, 15)
        server.wait(10)
    assert got["bare"][0] == 403 and "token" in got["bare"][1] and "textual" not in got["bare"][1].lower()
    assert [got[k][0] for k in ("wrong", "download", "rebound")] == [403, 403, 403], got
    status, page, headers = got["good"]
    assert status == 200 and f"/ws/{token}" in page
    assert (
        headers["Referrer-Policy"] == "no-referrer" and "frame-ancestors 'none'" in headers["Content-Security-Policy"]
    )
    assert got["ws-bare"] == got["ws-wrong"] == got["ws-evil"] == got["ws-no-origin"] == 403
    assert got["ws-good"] == 101
    log = (tmp_path / "serve.log").read_text()
    assert "--read-only" in log  # each browser session's command, as printed


def test_a_new_token_each_start_and_actions_only_with_allow_actions(tmp_path):
    from cockpit.cli import build_parser
    from cockpit.serve import served_command

    parse = lambda *a: build_parser().parse_args(["serve", *a])
    assert "--read-only" in served_command(parse("demo"))
    assert served_command(parse("demo"))[4:6] == ["open", "demo"]  # attaches to the running demo, starts none
    assert "--read-only" not in served_command(parse("demo", "--allow-actions"))
    assert "--read-only" in served_command(parse("demo", "--allow-actions", "--read-only"))
    tokens = set()
    for _ in range(2):
        server, url = start_serve(tmp_path, "demo")
        os.killpg(server.pid, 15)
        server.wait(10)
        tokens.add(url.split("token=")[1])
    assert len(tokens) == 2 and all(len(t) >= 32 for t in tokens)
