"""A person's view of the shop: headless Chromium (the Debian ``chromium`` package, driven by
Selenium through the system ``chromedriver``) searches, opens an item and picks an option."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from turnpool.webshop.server import ShopServer

pytestmark = pytest.mark.timeout(120)


def _require(*names: str) -> str:
    for name in names:
        found = shutil.which(name)
        if found:
            return found
    pytest.fail(f"none of {names} is on PATH; install Debian's chromium and chromium-driver "
                "(`apt-get install -y chromium chromium-driver`, as .ci/run does)")


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    binary = _require("chromium", "chromium-browser")
    driver_path = _require("chromedriver")
    options = webdriver.ChromeOptions()
    options.binary_location = binary
    profile: Path = tmp_path_factory.mktemp("chromium-profile")
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--no-first-run", f"--user-data-dir={profile}"):
        options.add_argument(arg)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SE_OFFLINE", "true")  # selenium-manager must never fetch a driver
        driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(30)
    try:
        yield driver
    finally:
        driver.quit()


def test_search_open_item_and_pick_an_option(browser: Any) -> None:
    from selenium.webdriver.common.by import By

    with ShopServer() as server:
        browser.get(f"{server.url}/?goal=12")
        instruction = browser.find_element(By.ID, "instruction").text
        assert instruction.startswith("Instruction: ")
        box = browser.find_element(By.ID, "search-input")
        box.send_keys("lightweight running shoes")
        browser.find_element(By.ID, "search-button").click()

        assert "Page 1 (Total results: 50)" in browser.page_source
        links = browser.find_elements(By.CSS_SELECTOR, "a.product-link")
        assert len(links) == 10
        row = browser.find_elements(By.CSS_SELECTOR, "div.result")[0].text
        title = row.split(" ", 1)[1].rsplit(" | ", 1)[0]
        links[0].click()

        assert title in browser.page_source
        groups = browser.find_elements(By.CSS_SELECTOR, "div.option-group")
        names = {g.get_attribute("data-option") for g in groups}
        assert {"size", "color"} <= names, names
        assert browser.find_elements(By.LINK_TEXT, "Buy Now")

        size = browser.find_element(By.CSS_SELECTOR, "div.option-group[data-option='size']")
        first = size.find_elements(By.CSS_SELECTOR, "a.option")[0]
        value = first.text
        first.click()
        chosen = browser.find_element(
            By.CSS_SELECTOR, "div.option-group[data-option='size'] a.option.selected")
        assert chosen.text == value

        # the person and an agent see the same session: the text rendering agrees
        sid = browser.current_url.split("/s/")[1].split("?")[0]
        text = httpx.get(f"{server.url}/s/{sid}?format=text", trust_env=False).text
        assert f"(selected: {value})" in text and instruction in text and title in text
