"""The dashboard in a real headless browser (Debian's chromium + chromium-driver, selenium),
against a real server under a small load: `make test-browser` (after `make install-browser`).

The page loads with no console error through --api-key (HTTP Basic in the URL, as a person
types it); its queue and KV figures equal /metrics sampled within one interval of the
snapshot they show; a request sent during the test appears on the timeline with its states
in order, one that is aborted shows as aborted, its hover shows its details; a screenshot is
saved under results/browser-tests/ (the path is printed)."""

from __future__ import annotations

import json
import os
import shutil
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server_utils import FAST_ENGINE_ARGS, SLOW_STEPS, ServerProcess, stories_model

if os.environ.get("MINIVLLM_BROWSER_TESTS") != "1":
    pytest.skip("browser tests run from `make test-browser`", allow_module_level=True)
webdriver = pytest.importorskip(
    "selenium.webdriver", reason="selenium is not installed: make install-browser")
if not (shutil.which("chromium") and shutil.which("chromedriver")):
    pytest.skip("chromium / chromedriver are not installed and `make install-browser` could "
                "not install them (apt-get install chromium chromium-driver)",
                allow_module_level=True)
from selenium.webdriver.common.action_chains import ActionChains  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import WebDriverWait  # noqa: E402

KEY = "browser-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
INTERVAL = 0.25
ARTIFACTS = Path("results/browser-tests")
FIELDS = {"q-running": "vllm:num_requests_running", "q-waiting": "vllm:num_requests_waiting",
          "q-swapped": "vllm:num_requests_swapped", "kv-usage": "vllm:kv_cache_usage_perc"}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dashboard_browser")
    # Two seats for three clients: a queue forms; slow steps keep requests alive for seconds.
    server = ServerProcess(stories_model(), [*FAST_ENGINE_ARGS, "--max-num-seqs", "2",
                                             "--api-key", KEY, "--dashboard-interval",
                                             str(INTERVAL)],
                           tmp / "server.log", prelude=SLOW_STEPS, ready_timeout=300)
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


class MetricsRecorder:
    """/metrics every 50 ms, timestamped, to compare with what the page showed."""

    def __init__(self, server) -> None:
        self.server, self.samples, self.stop = server, [], threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            before = time.time()
            values = self.server.metrics()
            self.samples.append((before, time.time(), values))
            time.sleep(0.05)

    def near(self, t: float, window: float) -> list[dict]:
        """The samples read within `window` seconds of time t."""
        return [values for before, after, values in self.samples
                if before - window <= t <= after + window]

    @property
    def since(self) -> float:
        return self.samples[0][0] if self.samples else float("inf")


def page_values(driver) -> tuple[float, dict]:
    """The snapshot time the page shows and its queue and KV figures."""
    values = driver.execute_script(
        "return [document.getElementById('q-running').dataset.t,"
        " ...arguments[0].map(id => document.getElementById(id).dataset.value)]",
        list(FIELDS))
    return float(values[0]), {k: float(v) for k, v in zip(FIELDS, values[1:])}


def row_states(driver, request_id: str) -> list[str] | None:
    rows = driver.find_elements(By.CSS_SELECTOR, f'g.request[data-request-id="{request_id}"]')
    return rows[0].get_attribute("data-states").split() if rows else None


def wait_for_states(driver, request_id: str, last: str, timeout: float = 90) -> list[str]:
    WebDriverWait(driver, timeout, poll_frequency=0.2).until(
        lambda d: (row_states(d, request_id) or [None])[-1] == last,
        f"{request_id} never showed as {last} on the timeline")
    return row_states(driver, request_id)


def test_the_dashboard_live_against_metrics(server, browser):
    host = server.url.removeprefix("http://")
    browser.get(f"http://dashboard:{KEY}@{host}/dashboard")  # Basic credentials, as typed
    WebDriverWait(browser, 30).until(
        lambda d: d.find_element(By.ID, "status").text == "live", "the page never went live")
    assert browser.find_element(By.ID, "policy-name").text == "fcfs"

    recorder = MetricsRecorder(server)
    load = Load(server.url)
    try:
        # The figures, under load: each equals /metrics read within one interval of the
        # snapshot the page shows.
        compared, busy = 0, 0
        deadline = time.monotonic() + 60
        while (compared < 8 or not busy) and time.monotonic() < deadline:
            time.sleep(INTERVAL)
            shown_at, shown = page_values(browser)
            if shown_at < recorder.since:
                continue  # a snapshot from before the recording
            time.sleep(INTERVAL * 1.5)  # let /metrics samples after the snapshot come
            nearby = recorder.near(shown_at, INTERVAL)
            assert nearby, "no /metrics sample near the snapshot"
            for element, metric in FIELDS.items():
                seen = sorted({values[metric] for values in nearby})
                assert shown[element] in seen, (element, shown[element], seen)
            compared += 1
            busy += shown["q-running"] > 0 and shown["q-waiting"] > 0
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

        row = browser.find_element(By.CSS_SELECTOR,
                                   f'g.request[data-request-id="{done["id"]}-0"]')
        ActionChains(browser).move_to_element(row.find_element(By.TAG_NAME, "rect")).perform()
        tooltip = browser.find_element(By.ID, "tooltip")
        WebDriverWait(browser, 5).until(lambda d: tooltip.is_displayed())
        assert done["id"] in tooltip.text and "priority 0" in tooltip.text
        ActionChains(browser).move_by_offset(0, 400).perform()  # the tooltip off the shot
    finally:
        load.close()
        recorder.stop.set()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shot = ARTIFACTS / "dashboard.png"
    browser.save_screenshot(str(shot))
    print(f"\nscreenshot: {shot.resolve()}")
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
