"""The dashboard in a real browser: headless Chromium (Debian's ``chromium`` and
``chromium-driver``) driven by Selenium, against a provider and a buyer that trade real
container jobs (whole nodes on the in-memory network, each serving its real control API).

The browser logs in as a person would (the token in the login form, or the one-time link
``cx dashboard`` prints), sees the node's data, and sees a job it did not start move
through its states to its logs without a reload. Screenshots are written to
``$CX_TEST_ARTIFACTS`` (default ``test-artifacts/`` in the checkout) for people to look at.
Waits are the browser's own (``WebDriverWait``, bounded), never sleeps.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_support import Market, market_fixture  # noqa: F401 - the fixture `market`
from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, TimeoutException
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from node.api.sessions import LINK_TTL_S

pytestmark = pytest.mark.integration

ROOT = Path(__file__).parents[2]
CX = str(ROOT / ".venv" / "bin" / "cx")
ARTIFACTS = Path(os.environ.get("CX_TEST_ARTIFACTS", ROOT / "test-artifacts"))
WAIT_S = 30  # a bound for a loaded CI machine, never a timing assertion


@pytest.fixture
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1400,1100",
        "--no-first-run",
        "--disable-extensions",
    ):
        options.add_argument(arg)
    service = Service(shutil.which("chromedriver") or "/usr/bin/chromedriver")
    driver = webdriver.Chrome(service=service, options=options)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(browser: WebDriver, name: str) -> None:
    """The whole page, as ``$CX_TEST_ARTIFACTS/<name>.png``."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    height = browser.execute_script("return document.documentElement.scrollHeight")
    browser.set_window_size(1400, max(900, int(height) + 160))  # the window frame too
    browser.save_screenshot(str(ARTIFACTS / f"{name}.png"))


def wait_for(browser: WebDriver, what: str, check: Any) -> Any:
    try:
        wait = WebDriverWait(browser, WAIT_S, ignored_exceptions=(StaleElementReferenceException,))
        return wait.until(lambda d: check(d))
    except TimeoutException:
        screenshot(browser, "failed-" + what.replace(" ", "-"))
        raise AssertionError(f"the page never showed {what}") from None


def text(browser: WebDriver, css: str) -> str:
    """The text of the first element ``css`` selects now ("" if none); the page redraws
    whenever the node changes, so this asks the page itself rather than hold an element."""
    found = browser.execute_script(
        "const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css
    )
    return str(found).strip()


def one_time_link(home: Path) -> str:
    out = subprocess.run(
        [CX, "dashboard", "--home", str(home), "--json"], check=True, capture_output=True
    )
    link = json.loads(out.stdout)
    assert link["expires_s"] == LINK_TTL_S
    return str(link["url"])


def test_a_browser_logs_in_with_the_token_or_a_one_time_link_once(
    market: Market, browser: WebDriver
) -> None:
    browser.get(market.buyer.url + "/dashboard")
    assert browser.current_url == market.buyer.url + "/dashboard/login"

    browser.find_element(By.ID, "token").send_keys("not-the-token")
    browser.find_element(By.ID, "login-submit").click()  # returns before the answer loads
    wait_for(
        browser,
        "the wrong token refused",
        lambda d: "not this node's token" in text(d, "#login-error"),
    )

    token = (market.buyer.home / "api.token").read_text().strip()
    browser.find_element(By.ID, "token").send_keys(token)
    browser.find_element(By.ID, "login-submit").click()
    wait_for(
        browser, "the node's peer id", lambda d: text(d, "#node-peer-id") == market.buyer.peer_id
    )

    browser.delete_all_cookies()
    link = one_time_link(market.buyer.home)
    browser.get(link)
    wait_for(
        browser,
        "the dashboard after the link",
        lambda d: text(d, "#node-peer-id") == market.buyer.peer_id,
    )
    browser.delete_all_cookies()
    browser.get(link)  # spent
    wait_for(browser, "the spent link refused", lambda d: "used already" in text(d, "#login-error"))
    browser.get(market.buyer.url + "/dashboard")
    assert browser.current_url.endswith("/dashboard/login")


def test_the_dashboard_shows_the_market_and_follows_a_job_without_a_reload(
    market: Market, browser: WebDriver
) -> None:
    browser.get(one_time_link(market.buyer.home))
    wait_for(browser, "the live stream", lambda d: text(d, "#live-status").startswith("live"))
    wait_for(
        browser,
        "the provider's offer",
        lambda d: d.find_elements(
            By.CSS_SELECTOR, f'#offers [data-provider="{market.provider.peer_id}"]'
        ),
    )
    browser.execute_script("window.stillThisPage = true")

    job_id = market.submit("echo hello from the job; sleep 1")
    row = f'#jobs tr[data-job-id="{job_id}"]'
    wait_for(browser, "the new job", lambda d: d.find_elements(By.CSS_SELECTOR, row))
    browser.execute_script("document.querySelector(arguments[0]).click()", row)
    wait_for(
        browser,
        "the job running",
        lambda d: d.find_elements(By.CSS_SELECTOR, '#job-timeline li[data-state="running"]'),
    )
    wait_for(browser, "the job succeeded", lambda d: text(d, f"{row} [data-state]") == "succeeded")
    wait_for(browser, "the job's stdout", lambda d: text(d, "#job-stdout") == "hello from the job")
    states = [
        e.get_attribute("data-state")
        for e in browser.find_elements(By.CSS_SELECTOR, "#job-timeline li")
    ]
    assert states[0] == "waiting", states
    assert states[-1] == "succeeded", states
    wait_for(browser, "the receipt in the ledger", lambda d: "buyer" in text(d, "#ledger tbody"))
    assert browser.execute_script("return window.stillThisPage") is True  # never reloaded
    assert text(browser, "#balance").startswith("-")  # it paid for the job
    screenshot(browser, "dashboard-buyer")


def test_a_provider_sees_its_machine_and_the_jobs_holding_it(
    market: Market, browser: WebDriver
) -> None:
    browser.get(one_time_link(market.provider.home))
    wait_for(
        browser, "the machine card", lambda d: d.find_element(By.ID, "machine-card").is_displayed()
    )
    assert "0 cores of 2 cores reserved" in text(browser, '[data-resource="cpu_milli"]')
    assert text(browser, "#quotas tbody") == "no quotas: every buyer is served alike"

    config = market.provider.home / "config.toml"
    before = config.read_text()
    config.write_text(before + '\n[[provider.quota]]\nname = "everyone"\njobs = 3\n')
    reload = [CX, "quota", "--reload", "--home", str(market.provider.home)]
    try:
        subprocess.run(reload, check=True, capture_output=True)
        group = '#quotas [data-group="everyone"]'
        wait_for(browser, "the quota group", lambda d: d.find_elements(By.CSS_SELECTOR, group))
        assert text(browser, f'{group} [data-quota="jobs"]') == "0 of 3"

        # Half a core's worth of busy loop for a few seconds: its use shows up, measured.
        market.submit("end=$(($(date +%s) + 6)); while [ $(date +%s) -lt $end ]; do :; done")
        wait_for(
            browser,
            "a running job on the machine",
            lambda d: text(d, "#running tbody [data-state]") == "running",
        )
        # The machine card and the quota panel redraw from the same events, maybe later.
        wait_for(
            browser,
            "the half core reserved",
            lambda d: "0.5 cores of 2 cores reserved" in text(d, '[data-resource="cpu_milli"]'),
        )
        wait_for(
            browser,
            "the job counted in its quota group",
            lambda d: text(d, f'{group} [data-quota="jobs"]') == "1 of 3",
        )
        assert text(browser, f'{group} [data-quota="cpu_milli"]') == "0.5 cores of no limit"
        wait_for(browser, "the CPU it uses", lambda d: "core" in text(d, "#running .cpu-used"))
        assert text(browser, "#running .cpu-used") != "0 cores"
        assert text(browser, "#running .memory-peak").endswith(("KiB", "MiB"))
        screenshot(browser, "dashboard-provider")
    finally:
        config.write_text(before)
        subprocess.run(reload, check=True, capture_output=True)


def test_the_control_api_page_tries_a_reading_operation_and_shows_curl_for_the_rest(
    market: Market, browser: WebDriver
) -> None:
    browser.get(one_time_link(market.buyer.home))
    wait_for(browser, "the dashboard", lambda d: text(d, "#node-peer-id") == market.buyer.peer_id)
    browser.get(market.buyer.url + "/dashboard/api")
    node = "#get-v1-node"
    wait_for(browser, "the operations", lambda d: d.find_elements(By.CSS_SELECTOR, node))
    browser.execute_script("document.querySelector(arguments[0]).click()", f"{node} button.try")
    wait_for(
        browser, "the node's answer", lambda d: market.buyer.peer_id in text(d, f"{node}-result")
    )
    assert text(browser, f"{node}-result").startswith("200")
    assert "-X POST" in text(browser, "#post-v1-jobs pre.curl")
    assert not browser.find_elements(By.CSS_SELECTOR, "#post-v1-jobs button.try")
    screenshot(browser, "control-api")
