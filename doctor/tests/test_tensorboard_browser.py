"""The Diagnose tab as a person sees it: TensorBoard started as a user starts it, over runs the template's
`compare` and two-worker training made, opened in headless Chromium.

Needs Debian's `chromium` and `chromium-driver` (.ci/run installs them) and selenium (the doctor's `test`
extra). Without them the tests skip, saying why, except under CI (the CI variable set), where they fail:
a browser check that silently stops running is no check. The runs come from the template's own
commands (`python -m train ...`), so these tests need the repository, not the doctor alone.
Set DIAGNOSE_TAB_SCREENSHOT=path.png to keep the screenshot (docs/diagnose-tab.png was taken so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import DOCTOR

pytestmark = pytest.mark.slow
REPOSITORY = DOCTOR.parent
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMEDRIVER = shutil.which("chromedriver") or "/usr/bin/chromedriver"
OPTIONS = (
    "--headless=new --no-sandbox --disable-dev-shm-usage --disable-gpu --disable-background-networking "
    "--disable-component-update --disable-sync --window-size=1400,2600"
).split()
TINY = [  # the template's tests' tiny dataset and short runs (tests/conftest.py: TINY_DATA, SHORT_RUN)
    "data.image_size=32",
    "data.num_train=128",
    "data.num_val=32",
    "data.num_shards=4",
    "train.epochs=2",
    "monitor.interval_s=0.05",
    "profile.start_step=1",
    "profile.num_steps=3",
    "pipeline.shuffle_buffer=16",
]
MULTI_WORKER = ["train.strategy=multi_worker", "pipeline.batch_size=8", "model.name=tiny", "model.width=4"]
MULTI_WORKER += ["train.precision=float32", "train.collective_timeout_s=30"]


def _missing() -> str | None:
    if not Path(CHROMIUM).exists() or not Path(CHROMEDRIVER).exists():
        return f"no Chromium here ({CHROMIUM}, {CHROMEDRIVER}): apt-get install -y chromium chromium-driver"
    if importlib.util.find_spec("selenium") is None:
        return "selenium is not installed: pip install -e './doctor[test]'"
    if not (REPOSITORY / "train" / "__main__.py").exists():
        return "the template (train/) is not beside the doctor: these tests make their runs with it"
    return None


@pytest.fixture(scope="module", autouse=True)
def browser_available():
    why = _missing()
    if why and os.environ.get("CI"):
        pytest.fail(f"CI must run the browser test: {why}", pytrace=False)
    if why:
        pytest.skip(why)


def _sets(items: list[str]) -> list[str]:
    return [arg for item in items for arg in ("--set", item)]


def _train(*args: str, timeout: float = 300) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "train", *args],
        cwd=REPOSITORY,
        env={**os.environ, "PYTHONPATH": str(REPOSITORY), "TF_CPP_MIN_LOG_LEVEL": "2"},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("tab")
    (root / "runs").mkdir()
    return root


@pytest.fixture(scope="module")
def runs(root, board) -> Path:
    """runs/compare (naive, optimized, report) and runs/mw (two workers, each profiled): 30 s to 90 s here,
    while TensorBoard starts (it finds them when the tab asks)."""
    data = _sets([f"data.data_dir={root / 'data'}", *TINY[:4]])
    _train("data", "--config", "configs/base.yaml", *data)
    _train("compare", "--out", str(root / "runs" / "compare"), *data, *_sets(TINY[4:] + ["pipeline.batch_size=16"]))
    # Each worker profiled, with the fix for TensorFlow's crash in stop() loaded (step_doctor's consume_fix.py)
    _train(
        "launch",
        "--workers",
        "2",
        "--",
        "fit",
        "--config",
        "configs/optimized.yaml",
        "--name",
        "mw",
        *data,
        "--fresh",
        *_sets([f"runs_dir={root / 'runs'}", *TINY[4:], *MULTI_WORKER]),
    )
    return root / "runs"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _get(url: str, timeout: float = 5):
    with urllib.request.urlopen(url, timeout=timeout) as response:
        return json.loads(response.read())


@pytest.fixture(scope="module")
def board(root):
    """`tensorboard --logdir runs` on a free port of this machine only, started as a user starts it; it takes
    15-25 s to answer, so it starts before the runs are made."""
    port = _free_port()
    command = [str(Path(sys.executable).parent / "tensorboard"), "--logdir", str(root / "runs"), "--port", str(port)]
    log = root / "tensorboard.log"  # a file, not a pipe nobody reads: a full pipe would stop TensorBoard
    with open(log, "wb") as output:
        process = subprocess.Popen([*command, "--host", "127.0.0.1"], stdout=output, stderr=subprocess.STDOUT)
    try:
        yield f"http://127.0.0.1:{port}", process, log
    finally:
        process.terminate()
        process.wait(timeout=30)


def _ready(board) -> str:
    url, process, log = board
    deadline = time.monotonic() + 120
    while True:
        try:
            if _get(f"{url}/data/plugins_listing")["diagnose"]["enabled"]:
                return url
        except (OSError, KeyError, ValueError):
            pass
        assert process.poll() is None, log.read_text(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "TensorBoard did not list the Diagnose tab in 120 s"
        time.sleep(1)


@pytest.fixture(scope="module")
def url(board, runs) -> str:
    return _ready(board)


@pytest.fixture(scope="module")
def tab(url):
    """Chromium on TensorBoard's Diagnose tab, switched into the tab's frame (TensorBoard loads it in an iframe)."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for option in OPTIONS:
        options.add_argument(option)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.get(f"{url}/#diagnose")
        frame = WebDriverWait(driver, 60).until(
            lambda d: d.find_element(By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=diagnose']")
        )
        driver.switch_to.frame(frame)
        yield driver
    finally:
        driver.quit()


def _wait_for(driver, find, timeout: float = 90):
    from selenium.common.exceptions import NoSuchElementException, StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    def found(d):
        try:
            return find(d)
        except (NoSuchElementException, StaleElementReferenceException):
            return False

    return WebDriverWait(driver, timeout, poll_frequency=0.5).until(found)


def test_the_naive_run_reads_input_bound_with_its_first_fix_and_the_speedup(tab, url, runs):
    from selenium.webdriver.common.by import By

    card = _wait_for(tab, lambda d: d.find_element(By.CSS_SELECTOR, "details[data-run='compare/naive']"))
    verdict = _wait_for(tab, lambda d: card.find_element(By.CSS_SELECTOR, ".verdict .badge"))
    assert verdict.text == "INPUT-BOUND" and verdict.is_displayed()
    naive = _get(f"{url}/data/plugin/diagnose/run?run=compare/naive")  # done: the card shows its verdict
    assert naive["diagnosis"]["recommendations"][0]["title"] in card.text
    assert "Evidence:" in card.text and "Fix:" in card.text
    # the template's profiler recorded the process CPU beside the profile: the estimates' budget, measured
    naive_card = "details[data-run='compare/naive']"
    budget = _wait_for(tab, lambda d: d.find_element(By.CSS_SELECTOR, f"{naive_card} p.together"))
    said = budget.get_attribute("textContent")  # as written, whether or not the card is open now
    assert "Cores' budget:" in said and "(measured: process_cpu.json)" in said
    if naive["diagnosis"]["together"]:
        assert "Together: " + " + ".join(naive["diagnosis"]["together"]["causes"]) in said
    speedup = json.loads((runs / "compare" / "report.json").read_text())["speedup"]
    compared = _wait_for(tab, lambda d: d.find_element(By.CSS_SELECTOR, "section[data-folder='compare'] table"))
    compared = tab.find_element(By.CSS_SELECTOR, "section[data-folder='compare']")
    assert f"{speedup:.2f}x" in compared.text and "naive" in compared.text and "optimized" in compared.text
    _wait_for(tab, lambda d: "INPUT-BOUND" in compared.find_element(By.CSS_SELECTOR, "td.v-input-bound").text)
    picture = compared.find_element(By.CSS_SELECTOR, "img.report")
    assert _wait_for(tab, lambda d: d.execute_script("return arguments[0].naturalWidth", picture) > 100)
    chart = _wait_for(tab, lambda d: card.find_element(By.CSS_SELECTOR, "svg.chart polyline"))
    assert chart.get_attribute("points").count(",") > 5
    link = card.find_element(By.LINK_TEXT, "Profile tab")
    assert link.get_attribute("href") == f"{url}/#profile"
    errors = [e["message"] for e in tab.get_log("browser") if e["level"] == "SEVERE" and "diagnose" in e["message"]]
    assert not errors, errors  # the tab's modules ran without an error in the console
    if os.environ.get("DIAGNOSE_TAB_SCREENSHOT"):
        tab.switch_to.default_content()
        tab.save_screenshot(os.environ["DIAGNOSE_TAB_SCREENSHOT"])
        tab.switch_to.frame(tab.find_element(By.CSS_SELECTOR, "iframe[src*='plugin_entry.html?name=diagnose']"))


def test_a_two_worker_run_shows_one_card_per_worker(tab):
    from selenium.webdriver.common.by import By

    cards = _wait_for(
        tab, lambda d: d.find_elements(By.CSS_SELECTOR, "section.group details.card.run") or False, timeout=30
    )
    assert [card.get_attribute("data-run") for card in cards] == ["mw", "mw/workers/worker-1"]
    for card in cards:
        badge = _wait_for(tab, lambda d, card=card: card.find_element(By.CSS_SELECTOR, ".verdict .badge"))
        assert badge.text in ("INPUT-BOUND", "DEVICE-BOUND", "HOST-BOUND")
    assert "chief (worker 0)" in cards[0].text and "worker-1" in cards[1].text


def test_the_profile_page_the_card_links_to_answers(tab, url):
    from selenium.webdriver.common.by import By

    card = _wait_for(tab, lambda d: d.find_element(By.CSS_SELECTOR, "details[data-run='compare/optimized']"))
    page = card.find_element(By.PARTIAL_LINK_TEXT, "input pipeline of").get_attribute("href")
    assert page.startswith(f"{url}/data/plugin/profile/index.html?run=compare%2Foptimized%2F")
    with urllib.request.urlopen(page, timeout=30) as response:
        assert response.status == 200
