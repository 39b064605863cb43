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
                "(`apt-get install -y chromium chromium-driver`, as `make test` does)")


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
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    def wait_for(css: str) -> list[Any]:
        """Elements that exist only on the next page: a click's navigation has finished."""
        return WebDriverWait(browser, 20).until(
            ec.presence_of_all_elements_located((By.CSS_SELECTOR, css)))

    with ShopServer() as server:
        browser.get(f"{server.url}/?goal=12")
        instruction = browser.find_element(By.ID, "instruction").text
        assert instruction.startswith("Instruction: ")
        box = browser.find_element(By.ID, "search-input")
        box.send_keys("lightweight running shoes")
        browser.find_element(By.ID, "search-button").click()

        links = wait_for("a.product-link")
        assert "Page 1 (Total results: 50)" in browser.page_source
        assert len(links) == 10
        row = browser.find_elements(By.CSS_SELECTOR, "div.result")[0].text
        title = row.split(" ", 1)[1].rsplit(" | ", 1)[0]
        links[0].click()

        groups = wait_for("div.option-group")
        assert title in browser.page_source
        names = {g.get_attribute("data-option") for g in groups}
        assert {"size", "color"} <= names, names
        assert browser.find_elements(By.LINK_TEXT, "Buy Now")

        size = browser.find_element(By.CSS_SELECTOR, "div.option-group[data-option='size']")
        first = size.find_elements(By.CSS_SELECTOR, "a.option")[0]
        value = first.text
        first.click()
        chosen = wait_for("div.option-group[data-option='size'] a.option.selected")
        assert [c.text for c in chosen] == [value]

        # the person and an agent see the same session: the text rendering agrees
        sid = browser.current_url.split("/s/")[1].split("?")[0]
        text = httpx.get(f"{server.url}/s/{sid}?format=text", trust_env=False).text
        assert f"(selected: {value})" in text and instruction in text and title in text
