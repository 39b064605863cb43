"""A person's view of ``turnpool view``: headless Chromium opens the page over a rollout, a
record and a tree, and finds an episode's observation text, its reward, a board image that
loaded, the filters at work, a group side by side, the tree's chosen path and a replay's
first divergence."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from tests.envs.test_webshop_browser import browser  # noqa: F401 - the shared fixture
from turnpool.rollout.trajectory import read_jsonl
from turnpool.view.server import ViewServer

pytestmark = pytest.mark.timeout(120)


def _until(browser: Any, check: Any) -> Any:  # noqa: F811
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.support.ui import WebDriverWait

    # a route change redraws the detail pane, so an element may go stale mid-check
    return WebDriverWait(browser, 30, poll_frequency=0.1,
                         ignored_exceptions=(StaleElementReferenceException,)
                         ).until(lambda _: check())


def _css(browser: Any, css: str) -> list[Any]:  # noqa: F811
    from selenium.webdriver.common.by import By

    return list(browser.find_elements(By.CSS_SELECTOR, css))


def _loaded_boards(browser: Any) -> int:  # noqa: F811
    return int(browser.execute_script(
        "return [...document.querySelectorAll('img.board')]"
        ".filter(i => i.complete && i.naturalWidth > 0).length"))


def test_a_rollout_episode_its_board_filters_and_group(browser: Any,  # noqa: F811
                                                       outputs: dict[str, Path]) -> None:
    trajectories = list(read_jsonl(outputs["rollout"]))
    t = trajectories[1]
    with ViewServer(outputs["rollout"]) as server:
        browser.get(server.url + "/")
        rows = _until(browser, lambda: _css(browser, "tr.episode-row"))
        assert len(rows) == 6
        from selenium.webdriver.support.ui import Select

        Select(browser.find_element("id", "filter-success")).select_by_value("true")
        wins = sum(1 for x in trajectories if x.success)
        _until(browser, lambda: len(_css(browser, "tr.episode-row")) == wins)
        Select(browser.find_element("id", "filter-success")).select_by_value("")
        _until(browser, lambda: len(_css(browser, "tr.episode-row")) == 6)

        browser.get(server.url + "/#episode/1")
        _until(browser, lambda: _css(browser, "#episode-view .turn"))
        observations = [e.text for e in _css(browser, "#episode-view pre.obs")]
        assert observations[0] == t.turns[0].state.strip()
        assert observations[-1] == t.final_state.strip()
        replies = [e.text for e in _css(browser, "#episode-view pre.reply")]
        assert replies == [turn.llm_response.strip() for turn in t.turns]
        reward = _css(browser, "#episode-view > dl.kv dd.v-reward")[0].text
        assert float(reward) == pytest.approx(t.score, abs=1e-3)
        _until(browser, lambda: _loaded_boards(browser) == len(t.turns) + 1)

        browser.get(server.url + "/#group/0-1")
        members = _until(browser, lambda: _css(browser, "#group-view .member"))
        assert len(members) == 3
        advantages = [m.find_element("css selector", "dd.v-advantage").text for m in members]
        assert [float(a) for a in advantages] == pytest.approx(
            [x.normalized_score for x in trajectories[3:]], abs=1e-3)


def test_a_tree_shows_its_chosen_path(browser: Any,  # noqa: F811
                                      outputs: dict[str, Path]) -> None:
    nodes = [json.loads(line) for line in outputs["tree"].read_text().splitlines()]
    chosen = [n["node_id"] for n in nodes if n["group_uid"] == "0-1" and n["chosen"]]
    with ViewServer(outputs["tree"], env="sokoban") as server:
        browser.get(server.url + "/")
        _until(browser, lambda: _css(browser, "#trees a"))
        [link] = [a for a in _css(browser, "#trees a") if a.text == "0-1"]
        link.click()
        drawn = _until(browser, lambda: _css(browser, "#tree-svg g.tree-node"))
        assert len(drawn) == sum(n["group_uid"] == "0-1" for n in nodes)
        marked = [g.get_attribute("data-node") for g in _css(browser, "g.tree-node.chosen")]
        assert marked == chosen and len(_css(browser, "line.edge.chosen")) == len(chosen)
        assert browser.find_element("id", "chosen-path").text.count("→") == len(chosen) - 1
        _css(browser, "g.tree-node.chosen")[-1].click()  # opens the chosen path's turns
        turns = _until(browser, lambda: _css(browser, "#episode-view .turn[data-turn]"))
        assert len(turns) == len(chosen)
        _until(browser, lambda: _loaded_boards(browser) >= len(chosen))


def test_a_record_and_its_first_divergence(browser: Any,  # noqa: F811
                                           outputs: dict[str, Path], tmp_path: Path) -> None:
    with gzip.open(outputs["record"], "rt", encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh]
    target = lines[2]
    target["steps"][0]["obs"] = "a board that never was"
    tampered = tmp_path / "tampered.jsonl.gz"
    with gzip.open(tampered, "wt", encoding="utf-8") as fh:
        fh.write("".join(json.dumps(d) + "\n" for d in lines))
    with ViewServer(tampered) as server:
        browser.get(server.url + f"/#episode/{lines[1]['episode']}")
        _until(browser, lambda: _css(browser, "#episode-view .turn"))
        assert _css(browser, "#episode-view pre.obs")[0].text == lines[1]["reset"]["obs"].strip()
        _until(browser, lambda: _loaded_boards(browser) >= 1)
        browser.find_element("id", "replay-button").click()
        marked = _until(browser, lambda: [e.get_attribute("data-turn")
                                          for e in _css(browser, ".turn.divergent")])
        assert marked == [str(target["steps"][0]["turn"])]
        assert "never was" in browser.find_element("id", "replay").text
        assert browser.current_url.endswith(f"#episode/{target['episode']}")
