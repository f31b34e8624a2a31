"""The dashboard in a real headless browser (Debian's chromium + chromium-driver, selenium),
against a real server under a small load: `make test-browser` (after `make install-browser`).

The page loads with no console error through --api-key (HTTP Basic in the URL, as a person
types it); its queue, KV and disk tier figures equal /metrics at the same moment (the engine held still
under load, the page a snapshot later); a request sent during the test appears on the timeline with its states
in order, one that is aborted shows as aborted, its hover shows its details; a screenshot is
saved under results/browser-tests/ (the path is printed)."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.model_factory import STORIES
from tests.server_utils import FAST_ENGINE_ARGS, ServerProcess, stories_model

if os.environ.get("MINIVLLM_BROWSER_TESTS") != "1":
    pytest.skip("browser tests run from `make test-browser`", allow_module_level=True)
# Asked for (`make test-browser`), they fail instead of skipping when something they need is
# missing: a CI run with the browser tests skipped would look green.
MISSING = [name for name in ("chromium", "chromedriver") if shutil.which(name) is None]
MISSING += ["selenium"] if importlib.util.find_spec("selenium") is None else []
MISSING += [] if (STORIES / "model.safetensors").exists() else [str(STORIES)]
if MISSING:
    pytest.fail(f"MINIVLLM_BROWSER_TESTS=1, but missing: {', '.join(MISSING)} (`make "
                "install-browser` installs chromium, chromium-driver and selenium)", pytrace=False)
from selenium import webdriver  # noqa: E402
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

KEY = "browser-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
INTERVAL = 0.25
ARTIFACTS = Path("results/browser-tests")
FIELDS = {"q-running": "vllm:num_requests_running", "q-waiting": "vllm:num_requests_waiting",
          "q-swapped": "vllm:num_requests_swapped", "kv-usage": "vllm:kv_cache_usage_perc",
          "kv-disk-blocks": "minivllm:kv_disk_blocks",
          "kv-disk-used": "minivllm:kv_disk_used_bytes"}


# Steps of at least 5 ms, and none while the pause file exists: the engine holds still, so
# that the page and /metrics can be read at the same moment.
PAUSABLE_STEPS = """
import os, time
from minivllm.model.runner import ModelRunner

def _execute(self, *args, _original=ModelRunner.execute):
    time.sleep(0.005)
    while os.path.exists({pause!r}):
        time.sleep(0.02)
    return _original(self, *args)

ModelRunner.execute = _execute
"""


@pytest.fixture(scope="module")
def pause_file(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("pause") / "pause"


@pytest.fixture(scope="module")
def server(tmp_path_factory, pause_file):
    tmp = tmp_path_factory.mktemp("dashboard_browser")
    # Two seats for three clients: a queue forms.
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-num-seqs", "2",
                                             "--api-key", KEY, "--dashboard-interval",
                                             str(INTERVAL), "--kv-offloading-backend", "disk",
                                             "--kv-offloading-path", str(tmp / "tier"),
                                             "--kv-offloading-size", "0.05"],
                           tmp / "server.log", prelude=PAUSABLE_STEPS.format(pause=str(pause_file)),
                           ready_timeout=300)
    yield server
    server.stop()


@pytest.fixture(scope="module")
def browser():
    options = webdriver.ChromeOptions()
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                 "--window-size=1400,1100"):
        options.add_argument(flag)
    options.binary_location = shutil.which("chromium")
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    service = webdriver.ChromeService(executable_path=shutil.which("chromedriver"))
    driver = webdriver.Chrome(options=options, service=service)
    yield driver
    driver.quit()


class Load:
    """Three clients, each sending long completions one after the other, until stopped
    (bounded: at most 20 requests in all)."""

    def __init__(self, url: str) -> None:
        self.url, self.stop, self.sent = url, threading.Event(), 0
        self.threads = [threading.Thread(target=self._client, daemon=True) for _ in range(3)]
        for thread in self.threads:
            thread.start()

    def _client(self) -> None:
        body = {"prompt": "Once upon a time", "max_tokens": 150, "ignore_eos": True}
        while not self.stop.is_set() and self.sent < 20:
            self.sent += 1
            httpx.post(self.url + "/v1/completions", json=body, headers=AUTH, timeout=120)

    def close(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def page_values(driver) -> tuple[float, dict]:
    """The snapshot time the page shows and its queue and KV figures."""
    values = driver.execute_script(
        "return [document.getElementById('q-running').dataset.t,"
        " ...arguments[0].map(id => document.getElementById(id).dataset.value)]",
        list(FIELDS))
    return float(values[0]), {k: float(v) for k, v in zip(FIELDS, values[1:])}


def row_states(driver, request_id: str) -> list[str] | None:
    # In the page's own script: the timeline is redrawn with every event, and an element
    # found a moment ago may be gone.
    states = driver.execute_script(
        "const row = document.querySelector(`g.request[data-request-id=\"${arguments[0]}\"]`);"
        " return row ? row.dataset.states : null", request_id)
    return states.split() if states else None


def hover(driver, request_id: str) -> None:
    """The mouse over the request's bar (again if the bar was redrawn meanwhile)."""
    for _ in range(10):
        try:
            row = driver.find_element(By.CSS_SELECTOR,
                                      f'g.request[data-request-id="{request_id}"]')
            bar = row.find_element(By.TAG_NAME, "rect")
            # the timeline is the page's last panel: a late request's bar can be below the
            # window, where the mouse cannot go
            driver.execute_script("arguments[0].scrollIntoView({block: 'center'})", bar)
            ActionChains(driver).move_to_element(bar).perform()
            return
        except StaleElementReferenceException:
            continue
    raise AssertionError(f"could not hover {request_id}")


def wait_for_states(driver, request_id: str, last: str, timeout: float = 90) -> list[str]:
    WebDriverWait(driver, timeout, poll_frequency=0.2).until(
        lambda d: (row_states(d, request_id) or [None])[-1] == last,
        f"{request_id} never showed as {last} on the timeline")
    return row_states(driver, request_id)


def test_the_dashboard_live_against_metrics(server, browser, pause_file):
    host = server.url.removeprefix("http://")
    browser.get(f"http://dashboard:{KEY}@{host}/dashboard")  # Basic credentials, as typed
    WebDriverWait(browser, 30).until(
        lambda d: d.find_element(By.ID, "status").text == "live", "the page never went live")
    assert browser.find_element(By.ID, "policy-name").text == "fcfs"
    WebDriverWait(browser, 10).until(  # the server has a tier: its figures show
        lambda d: d.find_element(By.ID, "kv-disk").is_displayed(), "no disk tier figures")

    load = Load(server.url)
    try:
        # Under load, the engine held still a few times: the page's figures, a snapshot
        # later, equal /metrics at that moment.
        busy = 0
        for _ in range(4):
            time.sleep(1.0)
            pause_file.touch()
            try:
                time.sleep(4 * INTERVAL)  # the step in flight ends; a snapshot comes after
                metrics = server.metrics()
                shown_at, shown = page_values(browser)
                assert shown_at > time.time() - 3 * INTERVAL, "the page is not live"
                for element, metric in FIELDS.items():
                    assert shown[element] == metrics[metric], (element, shown, metrics[metric])
                busy += shown["q-running"] == 2 and shown["q-waiting"] >= 1
            finally:
                pause_file.unlink()
        assert busy, "the load never filled the running batch and the queue"

        # A request of our own, then one we abort: both on the timeline.
        done = httpx.post(server.url + "/v1/completions", headers=AUTH, timeout=120, json={
            "prompt": "One day", "max_tokens": 40, "ignore_eos": True}).json()
        states = wait_for_states(browser, done["id"] + "-0", "finished")
        order = ["queued", "prefill", "decode", "finished"]
        assert [s for s in states if s in order] == order, states
        aborted_id = abort_mid_stream(server.url)
        states = wait_for_states(browser, aborted_id + "-0", "aborted")
        assert states[0] == "queued" and states[-1] == "aborted", states
        # That stream had its first token: the TTFT panel shows where its time went.
        WebDriverWait(browser, 10).until(
            lambda d: float(d.find_element(By.ID, "ttft-prefill").get_attribute("data-value")
                            or 0) > 0, "the TTFT panel never showed a stream's prefill")

        hover(browser, done["id"] + "-0")
        tooltip = browser.find_element(By.ID, "tooltip")
        WebDriverWait(browser, 5).until(lambda d: tooltip.is_displayed())
        assert done["id"] in tooltip.text and "priority 0" in tooltip.text
        # The tooltip out of the picture, taken while the load may still run.
        ActionChains(browser).move_to_element(browser.find_element(By.TAG_NAME, "h1")).perform()
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        shot = ARTIFACTS / "dashboard.png"
        browser.save_screenshot(str(shot))
        print(f"\nscreenshot: {shot.resolve()}")
    finally:
        load.close()
    errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    assert not errors, errors


def abort_mid_stream(url: str) -> str:
    """A streamed request left after its first chunk: the server aborts it."""
    body = {"prompt": "The cat", "max_tokens": 400, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", url + "/v1/completions", json=body, headers=AUTH,
                      timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith("data: {"):
                return json.loads(line[len("data: "):])["id"]
    raise AssertionError("no chunk came")
