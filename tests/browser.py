"""Headless Debian Chromium through Selenium for the page tests. bin/test installs chromium and
chromium-driver where they are missing and it may (root with apt-get); elsewhere these tests
skip, except under CI, where a missing browser is a failure."""
import os
import shutil

import pytest

ARTIFACTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "build", "test-artifacts")


def chromium():
    binary, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (binary and driver):
        message = "headless Chromium is missing (apt-get install chromium chromium-driver)"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = binary
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 "--window-size=1400,1300", "--no-first-run", "--disable-extensions"):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(driver), options=options)
