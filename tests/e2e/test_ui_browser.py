"""The dashboard in a real browser: headless Chromium (Debian's chromium and chromium-driver) over ``gpud up``.

Skipped, saying why, only where no browser can be had; .ci/run installs one.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import tempfile

import pytest

from daemons import wait_for
from node_helpers import kill_everything
from test_up import Up

webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install -e '.[test]')")
from selenium.common.exceptions import (NoSuchElementException, StaleElementReferenceException,  # noqa: E402
                                        WebDriverException)
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support.ui import Select  # noqa: E402

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
EVIL = "<script>document.title='pwned'</script>"
SECRET = "sekrit-env-value-42"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--window-size=1280,900")


@pytest.fixture
def browser():
    """A headless Chromium with a fresh profile, quit (and its profile removed) afterwards."""
    if CHROMIUM is None or DRIVER is None:
        pytest.skip("no browser: install Debian's chromium and chromium-driver (apt-get install chromium "
                    "chromium-driver) to run the dashboard's browser test")
    profile = tempfile.mkdtemp(prefix="gpud-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    try:
        driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=DRIVER))
    except WebDriverException as exc:
        shutil.rmtree(profile, ignore_errors=True)
        pytest.skip(f"chromium would not start here: {exc.msg}")
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def up(tmp_path):
    """``gpud up`` with two fake GPUs; stopped by pid afterwards, its tasks killed."""
    made = Up(tmp_path, "--fake-gpus", "2")
    try:
        yield made.start()
    finally:
        made.stop(signal.SIGKILL)
        kill_everything(str(made.state_dir / "node"))
        kill_everything(str(tmp_path / "run"))


def dashboard_url(up: Up) -> str:
    """The dashboard's address as gpud up printed it."""
    found = re.search(r"dashboard on (http://\S+/ui/)", up.output())
    assert found, up.output()
    return found.group(1)


# A live region is replaced whenever the cluster changes: an element found a moment ago may be gone.
GONE = (NoSuchElementException, StaleElementReferenceException)


def text_of(driver, by: str, what: str) -> str | None:
    """The element's text now; None while it is not there (or was just replaced)."""
    try:
        return driver.find_element(by, what).text
    except GONE:
        return None


def click(driver, by: str, what: str) -> None:
    """Click the element, finding it again if a refresh replaced it in between."""
    def clicked() -> bool:
        try:
            driver.find_element(by, what).click()
            return True
        except GONE:
            return False
    wait_for(clicked, f"{what} to be clickable")


def sign_in(driver, base: str, token: str) -> None:
    """Sign in through the form, with the keyboard as a person would."""
    driver.get(base)
    wait_for(lambda: "/ui/login" in driver.current_url, "the sign-in page")
    field = driver.find_element(By.ID, "token")
    field.send_keys(token)
    field.submit()
    wait_for(lambda: "/ui/login" not in driver.current_url, f"sign-in to go through: {driver.page_source[:500]}")


def test_a_user_watches_a_job_arrive_opens_it_and_cancels_it(up, browser):
    base = dashboard_url(up)
    token = (up.state_dir / "controller" / "admin.token").read_text().strip()
    sign_in(browser, base, token)
    browser.get(base + "queue")
    browser.execute_script("window.stillTheSamePage = true;")
    submitted = up.gpuctl("submit", "--parsable", "--name", EVIL, "--env", f"SECRET={SECRET}", "--gpus", "1", "--",
                          "sh", "-c", "echo hello from the job; sleep 300")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    name = wait_for(lambda: text_of(browser, By.CSS_SELECTOR, f"#row-{job} .name"), f"job {job} in the queue")
    assert browser.execute_script("return window.stillTheSamePage === true;"), "the queue page reloaded"
    assert name == EVIL  # shown as text, never run
    assert browser.title != "pwned"

    click(browser, By.LINK_TEXT, job)
    wait_for(lambda: browser.current_url.endswith(f"/ui/jobs/{job}"), "the job's page")
    assert wait_for(lambda: text_of(browser, By.CSS_SELECTOR, "dd.name"), "the job's name") == EVIL
    wait_for(lambda: "hello from the job" in (text_of(browser, By.ID, "log") or ""), "the job's log to show")
    assert browser.find_element(By.ID, "command-line").get_attribute("value") == f"gpuctl logs -f {job}"
    click(browser, By.ID, "cancel-button")
    wait_for(lambda: text_of(browser, By.ID, "job-state") == "cancelled", "the job to show cancelled")
    assert up.wait_state(job, "CANCELLED")["state"] == "CANCELLED"
    assert browser.title != "pwned"


def test_another_users_job_page_shows_no_environment(up, browser):
    base = dashboard_url(up)
    submitted = up.gpuctl("submit", "--parsable", "--name", "private-run", "--env", f"SECRET={SECRET}", "--gpus",
                          "1", "--", "sleep", "300")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip().split(";")[0]
    made = up.gpuctl("token", "create", "--user", "bob", "--json")
    assert made.returncode == 0, made.stderr
    sign_in(browser, base, json.loads(made.stdout)["token"])
    browser.get(f"{base}jobs/{job}")
    assert wait_for(lambda: text_of(browser, By.CSS_SELECTOR, "dd.name"), "the job's page") == "private-run"
    page = browser.page_source
    assert SECRET not in page and "SECRET" not in page and "sleep 300" not in page
    assert not browser.find_elements(By.ID, "cancel-button") and not browser.find_elements(By.ID, "log")


def test_headless_chromium_renders_every_page(up, browser):
    base = dashboard_url(up)
    browser.get(base)
    assert "/ui/login" in browser.current_url
    sign_in(browser, base, (up.state_dir / "controller" / "admin.token").read_text().strip())
    submitted = up.gpuctl("submit", "--parsable", "--gpus", "1", "--", "sleep", "300")
    job = submitted.stdout.strip().split(";")[0]
    for path, heading in (("", "Overview"), ("queue", "Queue"), ("projects", "Projects"), ("nodes", "Nodes"),
                          ("usage", "Usage"), (f"jobs/{job}", f"Job {job}"), ("admin/tokens", "Tokens")):
        browser.get(base + path)
        assert wait_for(lambda: text_of(browser, By.TAG_NAME, "h1"), f"{path} to render") == heading, path
        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, (path, errors)  # a CSP refusal or a script error shows here


def test_a_filtered_queue_stays_filtered_as_it_updates(up, browser):
    base = dashboard_url(up)
    token = (up.state_dir / "controller" / "admin.token").read_text().strip()
    sign_in(browser, base, token)
    browser.get(base + "queue")
    browser.execute_script("window.stillTheSamePage = true;")
    Select(browser.find_element(By.ID, "f-state")).select_by_visible_text("RUNNING")
    wait_for(lambda: "state=RUNNING" in browser.current_url, "the filter in the address")
    held = up.gpuctl("submit", "--parsable", "--hold", "--name", "held-one", "--", "sleep", "300")
    assert held.returncode == 0, held.stderr
    running = up.gpuctl("submit", "--parsable", "--gpus", "1", "--name", "running-one", "--", "sleep", "300")
    assert running.returncode == 0, running.stderr
    held_id, running_id = held.stdout.strip().split(";")[0], running.stdout.strip().split(";")[0]
    wait_for(lambda: text_of(browser, By.CSS_SELECTOR, f"#row-{running_id} .name"), "the running job in the queue")
    # the part pushed after both submissions is the filtered one: the held (pending) job is not in it
    assert not browser.find_elements(By.ID, f"row-{held_id}")
    assert browser.execute_script("return window.stillTheSamePage === true;"), "the queue page reloaded"
