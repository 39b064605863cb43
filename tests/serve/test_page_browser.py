"""A person's view of ``turnpool serve``: headless Chromium opens ``/`` and sees the env, the
live sessions (a session opened after the page loaded appears, its steps count up) and a
failure with its class."""

from __future__ import annotations

from typing import Any

import pytest

from tests.envs.test_webshop_browser import browser  # noqa: F401 - the shared fixture
from tests.serve.conftest import client
from turnpool.serve import ServeSettings, TurnpoolServer

pytestmark = pytest.mark.timeout(120)


def test_the_page_shows_live_sessions_and_failures(browser: Any) -> None:  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def text(element_id: str) -> str:
        return str(browser.find_element(By.ID, element_id).text)

    def watched_steps() -> str | None:
        """The steps column of the watched session's row (rows are redrawn every second)."""
        for row in browser.find_elements(By.CSS_SELECTOR, "tr.session-row"):
            cells = [c.text for c in row.find_elements(By.TAG_NAME, "td")]
            if len(cells) > 5 and cells[3] == "watched-episode"[:16]:
                return cells[5]
        return None

    def until(check: Any) -> Any:
        # the page redraws its tables every second, so an element may go stale mid-check
        return WebDriverWait(browser, 30, poll_frequency=0.2,
                             ignored_exceptions=(StaleElementReferenceException,)
                             ).until(lambda _: check())

    settings = ServeSettings(env="faulty", max_sessions=4, backend="process", num_workers=1)
    with TurnpoolServer(settings) as server:
        browser.get(server.url + "/")
        until(lambda: text("env") == "faulty")
        assert text("sessions-count") == "0" and text("capacity") == "4"
        with client(server.url) as env, client(server.url) as other:
            env.reset(seed=1, episode_id="watched-episode")
            other.reset(seed=2)
            for _ in range(3):
                env.step({"action": "go"})
            until(lambda: text("sessions-count") == "2")
            rows = until(lambda: browser.find_elements(By.CSS_SELECTOR, "tr.session-row"))
            assert len(rows) == 2
            assert "watched-episode" in browser.find_element(By.ID, "sessions").text
            until(lambda: watched_steps() == "3")
            # the plots draw the history the page keeps; the workers table has each worker
            until(lambda: text("plot-sessions-last") == "2")
            svg = browser.find_element(By.ID, "plot-rate")
            assert svg.find_elements(By.TAG_NAME, "polyline")
            assert len(browser.find_elements(By.CSS_SELECTOR, "tr.worker-row")) == 1
            with pytest.raises(RuntimeError):
                other.step({"action": "raise"})
            until(lambda: text("failures-total") == "1")
            assert "env_error" in text("failures")
        until(lambda: text("sessions-count") == "0")
        assert not browser.find_elements(By.CSS_SELECTOR, "tr.session-row")
