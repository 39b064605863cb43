"""WebShop: catalog, shop service on 127.0.0.1, env semantics, oracle, hostile actions, pool."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import turnpool
from turnpool.envs.webshop import WebShopEnv, WebShopUnavailable, goal_index, oracle
from turnpool.pool import EnvPool
from turnpool.webshop.catalog import (
    Goal,
    Product,
    bundled_path,
    generate_catalog,
    load_catalog,
    score,
    to_json,
)
from turnpool.webshop.server import ShopServer, bind_socket
from turnpool.webshop.shop import can_satisfy

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def shop_url() -> Iterator[str]:
    with ShopServer() as server:
        assert server.host == "127.0.0.1"
        yield server.url


def _env(url: str, **kw: Any) -> WebShopEnv:
    env = turnpool.make("webshop_lite", server_url=url, **kw)
    assert isinstance(env, WebShopEnv)
    return env


def _run_oracle(env: WebShopEnv, seed: int) -> tuple[float, list[str], dict[str, Any]]:
    obs, info = env.reset(seed=seed)
    pages = [obs]
    reward, done = 0.0, False
    while not done:
        actions = oracle(obs)
        assert actions, obs
        obs, reward, terminated, truncated, info = env.step(actions[0])
        assert info["action_is_valid"], (actions, obs)
        pages.append(obs)
        done = terminated or truncated
    return reward, pages, info


# ---------------------------------------------------------------------------- catalog
def test_bundled_catalog_is_the_generator_output_and_big_enough() -> None:
    catalog = load_catalog()
    assert to_json(catalog) == to_json(generate_catalog())  # the script's output, unedited
    assert len(catalog.products) >= 1000
    assert len({p.category for p in catalog.products}) >= 10
    assert len({p.asin for p in catalog.products}) == len(catalog.products)
    for p in catalog.products[:50]:
        assert p.title and p.description and p.features and p.attributes and p.options
        assert p.price > 0
    for g in catalog.goals[:300]:
        assert g.instruction.endswith(f"price lower than {g.price_upper:.2f} dollars")
        assert can_satisfy(g, catalog.product(g.asin))  # every goal has a perfect purchase
    assert bundled_path().stat().st_size < 400_000


def test_catalog_generation_is_deterministic_and_seeded() -> None:
    a, b = generate_catalog(seed=5, n_products=30), generate_catalog(seed=5, n_products=30)
    assert to_json(a) == to_json(b)
    assert to_json(a) != to_json(generate_catalog(seed=6, n_products=30))


def test_reward_formula() -> None:
    product = Product("B000000001", "t", "shoes", "hiking boots", "d", ["f"],
                      ["non slip", "lightweight"], {"size": ["8", "9"], "color": ["red"]},
                      49.99, 4.0)
    goal = Goal("i need ...", "B000000001", "shoes", "hiking boots", ["non slip", "breathable"],
                {"size": "9", "color": "red"}, 50.0)
    # 1 of 2 attributes + 1 of 2 options + price ok = 3 of (2 + 2 + 1)
    assert score(goal, product, {"size": "9", "color": "blue"}).reward == pytest.approx(3 / 5)
    other_type = Product(**{**product.__dict__, "product_type": "sandals"})
    assert score(goal, other_type, {"size": "9"}).reward == pytest.approx(0.5 * 3 / 5)
    other_cat = Product(**{**product.__dict__, "category": "toys", "product_type": "x"})
    assert score(goal, other_cat, {"size": "9"}).reward == pytest.approx(0.1 * 3 / 5)
    perfect = Goal("i need ...", "B000000001", "shoes", "hiking boots", ["lightweight"],
                   {"size": "8"}, 50.0)
    assert score(perfect, product, {"size": "8"}).reward == 1.0
    assert score(perfect, product, {"size": "8", "color": "red"}).reward == 1.0


def test_goal_splits_follow_webshop() -> None:
    n = len(load_catalog().goals)
    assert n == 3000
    assert [goal_index(s, "test", n) for s in (0, 499, 500)] == [0, 499, 0]
    assert [goal_index(s, "val", n) for s in (0, 999, 1000)] == [500, 1499, 500]
    assert goal_index(0, "train", n) == 1500 and goal_index(1499, "train", n) == 2999
    small = [goal_index(s, sp, 40) for sp in ("test", "val", "train") for s in range(100)]
    assert min(small) == 0 and max(small) == 39
    with pytest.raises(ValueError):
        goal_index(0, "dev", n)


# ---------------------------------------------------------------------------- service
def test_service_answers_text_html_and_json(shop_url: str) -> None:
    with httpx.Client(base_url=shop_url, trust_env=False, timeout=10) as c:
        assert c.get("/api/meta").json()["n_goals"] == 3000
        text = c.get("/s/t1?goal=7&format=text")
        assert text.headers["content-type"].startswith("text/plain")
        assert text.text.startswith("Instruction: ")
        assert "Available actions: search[<your query>]" in text.text
        page = c.get("/s/t1", headers={"accept": "text/html"})
        assert page.headers["content-type"].startswith("text/html")
        assert "id='search-input'" in page.text
        # the same action through the browser route, in both renderings
        res = c.get("/s/t1/act", params={"q": "running shoes", "format": "json"}).json()
        assert res["valid"] and res["kind"] == "results" and "click[next >]" in res["actions"]
        assert "Page 1 (Total results: 50)" in res["page"]
        asin = res["actions"][2]
        html_page = c.get("/s/t1/act", params={"action": asin, "format": "html"},
                          follow_redirects=True)
        assert [r.status_code for r in html_page.history] == [303]
        assert "class='option-group'" in html_page.text and "Buy Now" in html_page.text
        # a person's entry point makes a session and redirects to it
        start = c.get("/?goal=3", headers={"accept": "text/html"})
        assert start.status_code == 303 and start.headers["location"].startswith("/s/web-")


def test_results_paginate_ten_per_page(shop_url: str) -> None:
    with httpx.Client(base_url=shop_url, trust_env=False, timeout=10) as c:
        c.post("/api/reset", json={"session": "pg", "goal": 0})
        query = "search[lightweight non slip shoes]"
        r = c.post("/api/step", json={"session": "pg", "action": query}).json()
        first = [a for a in r["actions"] if a.startswith("click[b0")]
        assert len(first) == 10 and "click[< prev]" not in r["actions"]
        seen = set(first)
        for page in range(2, 6):
            r = c.post("/api/step", json={"session": "pg", "action": "click[next >]"}).json()
            items = [a for a in r["actions"] if a.startswith("click[b0")]
            assert f"Page {page} (Total results: 50)" in r["page"] and len(items) == 10
            assert not seen & set(items)
            seen |= set(items)
        assert "click[next >]" not in r["actions"]  # the last page has no next
        r = c.post("/api/step", json={"session": "pg", "action": "click[< prev]"}).json()
        assert "Page 4 " in r["page"]


def test_service_rejects_hostile_requests(shop_url: str) -> None:
    with httpx.Client(base_url=shop_url, trust_env=False, timeout=10) as c:
        c.post("/api/reset", json={"session": "h", "goal": 1})
        before = c.get("/api/page", params={"session": "h"}).json()
        for action in ["search[" + "a" * 1_000_000 + "]", "click[nope]", 42, None, "\x00" * 50]:
            r = c.post("/api/step", json={"session": "h", "action": action})
            assert r.status_code in (200, 400)
            if r.status_code == 200:
                assert r.json()["valid"] is False
        assert c.get("/api/page", params={"session": "h"}).json() == before
        assert c.post("/api/step", json={"session": "nobody", "action": "x"}).status_code == 404
        assert c.post("/api/step", content=b"\xff\xfe not json").status_code == 400
        assert c.post("/api/reset", json={"session": "bad id!", "goal": 1}).status_code == 400
        assert c.post("/api/reset", json={"session": "ok", "goal": 10**9}).status_code == 400
        assert c.get("/api/meta").status_code == 200  # still serving


# ---------------------------------------------------------------------------- env
def test_oracle_reaches_high_reward_and_episodes_end_on_buy(shop_url: str) -> None:
    env = _env(shop_url, split="test")
    rewards = []
    for seed in range(50):
        reward, pages, info = _run_oracle(env, seed)
        rewards.append(reward)
        assert info["success_purchase"] and info["success"] == (reward == 1.0)
        assert "Thank you for shopping" in pages[-1] and len(pages) <= 10
    env.close()
    mean = sum(rewards) / len(rewards)
    assert mean >= 0.9, mean
    assert 0 < sum(r == 1.0 for r in rewards) < len(rewards) or mean == 1.0


def test_group_members_see_identical_pages(shop_url: str) -> None:
    a, b = _env(shop_url, split="val"), _env(shop_url, split="val")
    assert a.instance_id != b.instance_id
    ra, pages_a, _ = _run_oracle(a, 17)
    rb, pages_b, _ = _run_oracle(b, 17)
    assert pages_a == pages_b and ra == rb
    # a member rebuilt from a mid-episode snapshot continues on identical pages
    a.reset(seed=21)
    obs = a.step(oracle(a.render())[0])[0]
    obs = a.step(oracle(obs)[0])[0]
    a.step("click[not a button]")
    c = _env(shop_url, split="val")
    c.set_state(a.get_state())
    assert c.render() == a.render() and c.session != a.session
    assert len(c.history) == len(a.history) == 3
    for _ in range(3):
        act = oracle(a.render())[0]
        assert a.step(act) == c.step(act)
    # pages differ across goals
    assert _env(shop_url, split="val").reset(seed=22)[0] != a.reset(seed=21)[0]
    for e in (a, b, c):
        e.close()


@pytest.mark.parametrize("junk", [
    "click[nonexistent]",
    "search[" + "shoes " * 200_000 + "]",  # 1.2 MB
    "search[\ud800\udfff broken surrogates]",
    "search[☃☃☃ 日本語 🛒]",
    "\x00\x01\x02 binary \xff junk",
    "",
    None,
    12345,
    b"search[shoes]",
    ["click[buy now]"],
])
def test_bad_actions_are_invalid_and_change_nothing(shop_url: str, junk: Any) -> None:
    env = _env(shop_url, split="test")
    obs, _ = env.reset(seed=3)
    obs, *_ = env.step(oracle(obs)[0])  # on a results page now
    state = env.get_state()
    out_obs, reward, terminated, truncated, info = env.step(junk)
    assert info["action_is_valid"] is False and info["action_is_effective"] is False
    assert (out_obs, reward, terminated, truncated) == (obs, 0.0, False, False)
    assert info["anchor_obs"] == env.page and "Available actions" not in info["anchor_obs"]
    with httpx.Client(base_url=shop_url, trust_env=False) as c:
        server_page = c.get("/api/page", params={"session": env.session}).json()["page"]
    assert server_page == env.page  # the server-side session did not move either
    assert env.get_state()["history"] == [*state["history"], None]
    env.close()


def test_search_only_on_search_page_and_length_bound(shop_url: str) -> None:
    env = _env(shop_url, split="test", max_search_chars=20)
    env.reset(seed=4)
    assert not env.step("search[" + "x" * 21 + "]")[4]["action_is_valid"]
    assert env.step("SEARCH[  red  ]")[4]["action_is_valid"]
    assert not env.step("search[blue]")[4]["action_is_valid"]  # results page: no search box
    assert env.step("Click[Back To Search]")[4]["action_is_valid"]  # names are case-insensitive
    env.close()


def test_step_limit_truncates(shop_url: str) -> None:
    env = _env(shop_url, split="train", max_steps=3)
    obs, _ = env.reset(seed=9)
    out = [env.step("click[nowhere]") for _ in range(3)]
    assert [o[3] for o in out] == [False, False, True]
    assert not any(o[2] for o in out)
    after = env.step(oracle(obs)[0])  # steps after the end change nothing
    assert after[3] and not after[4]["action_is_valid"]
    env.close()


def test_unreachable_service_gives_a_clear_error() -> None:
    sock = bind_socket()  # a port that is ours and answers nothing
    port = sock.getsockname()[1]
    sock.close()
    env = WebShopEnv(server_url=f"http://127.0.0.1:{port}", timeout=2.0)
    with pytest.raises(WebShopUnavailable, match="unreachable.*turnpool webshop serve"):
        env.reset(seed=0)
    env.close()


def test_env_starts_its_own_server_when_no_url_is_given() -> None:
    env = turnpool.make("webshop_lite", split="test")
    twin = turnpool.make("webshop_lite", split="test")
    assert isinstance(env, WebShopEnv) and isinstance(twin, WebShopEnv)
    obs, info = env.reset(seed=0)
    assert env.server_url is not None and env.server_url.startswith("http://127.0.0.1:")
    assert obs.startswith("Instruction: ") and info["goal_index"] == 0
    assert twin.reset(seed=0)[0] == obs and twin.server_url == env.server_url  # one per process
    env.close()
    env.close()  # idempotent
    twin.close()


# ---------------------------------------------------------------------------- pool
def test_pool_groups_identical_and_backends_agree(shop_url: str) -> None:
    kwargs = {"server_url": shop_url, "split": "test"}
    runs = {}
    for backend, workers in (("sequential", None), ("thread", 3), ("process", 2)):
        with EnvPool("webshop_lite", env_num=2, group_n=3, seed=40, env_kwargs=kwargs,
                     backend=backend, num_workers=workers, step_timeout=60.0) as pool:
            assert pool.backend_name == backend
            obs, _ = pool.reset()
            trace = [list(obs)]
            for _ in range(3):
                obs, rewards, dones, infos = pool.step([oracle(o)[0] for o in obs])
                assert all(i["action_is_valid"] for i in infos)
                trace.append(list(obs))
            runs[backend] = trace
    for pages in runs["sequential"]:
        assert pages[0] == pages[1] == pages[2] and pages[3] == pages[4] == pages[5]
        assert pages[0] != pages[3]
    assert runs["thread"] == runs["sequential"] == runs["process"]


# ---------------------------------------------------------------------------- CLI
def test_bench_command_runs_and_writes_json(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from turnpool.bench.webshop import command

    out = tmp_path / "webshop.json"
    result = CliRunner().invoke(command, ["--envs", "4", "--group-n", "2", "--steps", "2",
                                          "--latency-ms", "0", "--backends",
                                          "sequential,thread", "--json", str(out)])
    assert result.exit_code == 0, result.output
    report = json.loads(out.read_text())
    assert [(r["task"], r["backend"]) for r in report["rows"]] == [
        ("ragen", "sequential"), ("ragen", "thread"), ("lite", "sequential"), ("lite", "thread")]
    for row in report["rows"]:
        assert row["active_backend"] == row["backend"] and row["valid_ratio"] == 1.0
        assert row["steps_per_s"] > 0 and row["shop_cores"] >= 0


def test_cli_serve_binds_loopback_and_serves() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "turnpool.cli", "webshop", "serve",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded by the test timeout
        assert "webshop serving at http://127.0.0.1:" in line, line
        url = line.split()[3]
        meta = httpx.get(url + "/api/meta", timeout=10, trust_env=False).json()
        assert meta["n_products"] >= 1000
        text = httpx.get(url + "/", timeout=10, trust_env=False, follow_redirects=True).text
        assert text.startswith("Instruction: ")
    finally:
        proc.terminate()
        proc.wait(timeout=10)
