"""Headless Chromium for the tests that look at pages the way a user does: Debian's chromium and chromium-driver
(`make browser-tools`), driven by Selenium through that driver (Selenium never downloads one). Required under
CI=true; skipped elsewhere when they are missing (tests/required.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.required import unavailable

CHROMIUM, CHROMEDRIVER = "/usr/bin/chromium", "/usr/bin/chromedriver"
# No first-run, background networking, component updates or sync: on a closed network each would only fail.
FLAGS = ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
         "--window-size=1400,1000")


@contextlib.contextmanager
def chromium(checks: str) -> Iterator[Any]:
    """A headless Chromium (a Selenium WebDriver) with a fresh profile, its console log kept; `checks` names the
    test for the failure under CI when it is missing."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        unavailable("Debian's chromium and chromium-driver are not installed (make browser-tools)", checks)
    from selenium import webdriver  # noqa: PLC0415 - only once the browser is known to be there
    from selenium.webdriver.chrome.service import Service  # noqa: PLC0415

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    profile = tempfile.mkdtemp(prefix="test-chromium-")
    for flag in (*FLAGS, f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def console_problems(driver: Any) -> list[dict[str, Any]]:
    """The console's errors and warnings since the last call."""
    return [entry for entry in driver.get_log("browser") if entry["level"] in ("SEVERE", "WARNING")]


def screenshot(driver: Any, name: str) -> None:
    """With PAGEDSERVE_SCREENSHOTS=dir set, the page as it is now, saved there (how docs' screenshots are made)."""
    folder = os.environ.get("PAGEDSERVE_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / name))
