"""The ``webshop`` env: RAGEN's WebShop task (webshop-minimal's small set) in process.

Same products, goals, seed -> goal, pages, available actions, reward and per-step flags as
RAGEN's ``WebShopEnv``:

* data: `turnpool.webshop.data` (the bundled small set unless ``file_path`` /
  ``attr_path`` / ``human_goals`` point elsewhere);
* seed -> goal per split (``split`` or RAGEN's ``mode``): `goal_for_seed`, which fails exactly
  where RAGEN's does (train needs over 1,500 goals; test and val work while the index is
  inside the goal list);
* observation: RAGEN's render text: the page (``[SEP]``-joined, see
  `turnpool.webshop.ragen_shop`; after reset only ``Instruction: <goal>``), ``"."``, RAGEN's hint
  lines and ``"\\n You must choose from these actions:"`` with the actions and ``"."``;
* ``action_is_valid`` (RAGEN v2's rule, the default): webshop-minimal's parse of the text, a
  ``search[text]`` on a page with a search bar or a ``click[x]`` on a clickable of the page;
  with ``ragen_version: v1`` (RAGEN v1 configs) v1's: one of the listed actions, or any
  ``search[...]`` where the list offers ``search[<content>]`` (so ``search[]`` is valid there,
  and does nothing). Texts over 4,096 characters are invalid and do nothing. As in RAGEN an
  unlisted action still runs when the page accepts it (a search on any page, ``click[next >]``
  past the last page, ``click[Buy Now]``);
* reward: 1.0 when WebShop's reward is at least 1, else 0.0 (v2's ``binarize_reward``, the
  default; ``info["raw_reward"]`` keeps WebShop's); v1 configs get WebShop's own;
* ``action_is_effective``: the page text changed; ``success`` / ``success_find``: reward == 1;
  ``success_purchase``: the episode ended (bought); ``end_of_page``: the actions are exactly
  back-to-search and prev. The done step's info also carries WebShop's reward parts.

There is no step cap of its own unless ``max_steps`` is given: RAGEN's WebShop has none, its
rollout stops after ``max_actions_per_traj`` / ``max_turn`` (9 in ``configs/webshop.yaml``).

Example:
    >>> import turnpool
    >>> env = turnpool.make("webshop", split="test")
    >>> obs, info = env.reset(seed=0)
    >>> obs.startswith("Instruction: Find me")
    True
    >>> obs, reward, terminated, truncated, info = env.step("search[men's dress shirts]")
    >>> info["action_is_valid"], terminated
    (True, False)
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any

from turnpool.envs.base import TextEnv
from turnpool.webshop.data import goal_for_seed
from turnpool.webshop.ragen_shop import MAX_ACTION_CHARS, RagenShop, ShopState, shared_shop

SPLITS = ("train", "val", "test")

#: RAGEN's hint lines, shown after every page (v1 runs two of them together; v2 does not).
_HINT_LINES = [
    "We must buy a product within 10 actions. It doesn't have to match perfectly with "
    "description.",
    "Search term should not include details like size, color.",
    "Never search for more than 2 times.",
    "Do not be too strict about the description, it's more important to buy one that is close "
    "enough within action limit.",
    "Prioritize click a product in the current page over going to next page.",
    "Almost never click[next >] for more than 2 times.",
    "Almost never click[< prev] unless you are sure the product is on one of the previous "
    "pages.",
    "If you have less than 3 actions left, just buy the first product you see in the current "
    "page.",
    "If an matching option exists, make sure to click[size] then click[color], one at a time, "
    "before click[buy now], but don't have to if only 1 action left, in that case you just "
    "click[buy now]. Never click description.",
]
RENDER_HINTS = "\n".join(_HINT_LINES[:5] + ["".join(_HINT_LINES[5:7])] + _HINT_LINES[7:])
RENDER_HINTS_V2 = "\n".join(_HINT_LINES)

class RagenWebShopEnv(TextEnv):
    """RAGEN's WebShop task on webshop-minimal's small set (details: module docstring).

    Config: ``split`` or RAGEN's ``mode`` ("train" | "val" | "test"), ``file_path`` (a
    WebShop product list or ``documents.jsonl``; the bundled small set by default),
    ``attr_path`` (``items_ins_v2*.json``), ``human_goals`` (a path to
    ``items_human_ins.json`` for human goals), ``num_products``, ``draw_seed`` (the stream of
    WebShop's price draws, 0), ``max_steps`` (None: no cap). RAGEN's other keys (``dataset``,
    ``observation_mode``, ``server``, ``filter_goals``, ``limit_goals``, ``show_attrs``) are
    accepted at their defaults only. ``binarize_reward`` (True, RAGEN v2's default): the
    reward is 1.0 when WebShop's reward is at least 1, else 0.0, and ``info["raw_reward"]``
    keeps WebShop's. ``ragen_version`` ("v2" | "v1"): whose hint lines and validity rule the
    env follows (v2: the hint lines apart; ``action_is_valid`` by the parsed action: a
    ``search[text]`` on a page with a search bar or a ``click[x]`` on a clickable of the page).
    """

    action_kind = "webshop"
    #: RAGEN's manager passes its mode (train / val) to this env's reset; RAGEN configs give it
    #: to turnpool's envs as the ``mode`` kwarg (`turnpool.ragen.config.rollout_plan`).
    ragen_reset_mode = True
    #: the class's own defaults are RAGEN v2's (turnpool's default version, so ``make`` with
    #: v2's env_config is v2's env); RAGEN v1 configs get v1's
    ragen_v1_defaults = {"binarize_reward": False, "ragen_version": "v1"}  # noqa: RUF012
    #: every key it reads is named; any other warns (`TextEnv.extra_kwargs`)
    extra_kwargs = frozenset()
    instruction = (
        "You are browsing an online shop. Based on the instruction, buy a product that close "
        "to the production description. You need to search, read the search results, pick a "
        "product, choose the size and color and buy. You should only choose action from the "
        "available actions list provided later.")

    def __init__(self, split: str | None = None, mode: str | None = None,
                 file_path: str | None = None, attr_path: str | None = None,
                 human_goals: str | bool | None = None, num_products: int | None = None,
                 draw_seed: int = 0, max_steps: int | None = None, dataset: str = "small",
                 observation_mode: str = "text", limit_goals: int = -1,
                 filter_goals: Any = None, server: Any = None, show_attrs: bool = False,
                 binarize_reward: bool = True, ragen_version: str = "v2", **config: Any
                 ) -> None:
        split = split or mode or "train"
        if split not in SPLITS:
            raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
        if observation_mode != "text" or limit_goals != -1 or filter_goals is not None \
                or server is not None or show_attrs:
            raise ValueError("webshop supports RAGEN's defaults for observation_mode, "
                             "limit_goals, filter_goals, server and show_attrs only")
        if ragen_version not in ("v1", "v2"):
            raise ValueError(f"ragen_version must be 'v1' or 'v2', got {ragen_version!r}")
        if dataset not in ("small", "full"):
            raise ValueError(f"dataset must be 'small' or 'full', got {dataset!r}")
        if dataset == "full" and file_path is None:
            raise ValueError("dataset 'full' is not bundled: give file_path (items_shuffle.json "
                             "or documents.jsonl) and attr_path (items_ins_v2.json)")
        human_path = human_goals if isinstance(human_goals, str) else None
        if human_goals is True:
            raise ValueError("human_goals needs the path of items_human_ins.json")
        super().__init__(split=split, file_path=file_path, attr_path=attr_path,
                         human_goals=human_goals, num_products=num_products,
                         draw_seed=draw_seed, max_steps=max_steps,
                         binarize_reward=binarize_reward, ragen_version=ragen_version,
                         **config)
        self.split = split
        self.v2 = ragen_version == "v2"
        self.binarize_reward = bool(binarize_reward)
        self.max_steps = None if max_steps is None else int(max_steps)
        self._shop_key = (file_path, attr_path, human_path, num_products, int(draw_seed))
        self.state: ShopState | None = None
        self.obs = ""
        self.page_text = ""
        self.steps = 0
        self.done = False

    @property
    def shop(self) -> RagenShop:
        return shared_shop(*self._shop_key)

    def goal_index(self, seed: int) -> int:
        return goal_for_seed(seed, self.split, len(self.shop.data.goals))

    # ------------------------------------------------------------------ env API
    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.state = ShopState(self.goal_index(seed))
        self.page_text = self.shop.observation(self.state)
        self.steps, self.done = 0, False
        self.obs = self._render(f"Instruction: {self.shop.instruction(self.state)}")
        return self.obs

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None
              ) -> tuple[str, dict[str, Any]]:
        obs, info = super().reset(seed=seed, options=options)
        assert self.state is not None
        info.update(goal_index=self.state.goal, success_find=False, success_purchase=False)
        return obs, info

    def _render(self, page: str) -> str:
        assert self.state is not None
        actions = self.shop.actions(self.state)
        hints = RENDER_HINTS_V2 if self.v2 else RENDER_HINTS
        return (f"{page}.{hints}\n You must choose from these actions:"
                f"{', '.join(actions)}.")

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.state is None:
            raise RuntimeError("call reset() before step()")
        if self.done or (self.max_steps is not None and self.steps >= self.max_steps):
            return self.obs, 0.0, self.done, not self.done, {
                "action_is_valid": False, "action_is_effective": False}
        self.steps += 1
        text = action if isinstance(action, str) else ""
        listed = self.shop.actions(self.state)
        valid = self.shop.accepts(self.state, text) if self.v2 else (
            len(text) <= MAX_ACTION_CHARS and (
                text in listed or ("search[<content>]" in listed and text.startswith("search[")
                                   and text.endswith("]"))))
        before = self.page_text
        outcome = self.shop.step(self.state, text)
        self.page_text = self.shop.observation(self.state)
        self.obs = self._render(self.page_text)
        raw, self.done = outcome.reward, outcome.done
        reward = (1.0 if raw >= 1.0 else 0.0) if self.binarize_reward else raw
        end_of_page = tuple(self.shop.actions(self.state)) == ("click[back to search]",
                                                               "click[< prev]")
        info: dict[str, Any] = {
            "reward": reward, "action_is_effective": self.page_text != before,
            "action_is_valid": valid, "success": reward == 1, "success_purchase": self.done,
            "success_find": reward == 1, "end_of_page": end_of_page}
        if self.binarize_reward:
            info["raw_reward"] = raw
        if outcome.parts is not None:
            info.update(outcome.parts)
        truncated = (not self.done and self.max_steps is not None
                     and self.steps >= self.max_steps)
        return self.obs, reward, self.done, truncated, info

    def _render_text(self) -> str:
        return self.obs

    def anchor_obs(self) -> str:
        return self.page_text

    def available_actions(self) -> list[str]:
        """RAGEN's ``get_available_actions`` for the current page."""
        return [] if self.state is None else self.shop.actions(self.state)

    # ------------------------------------------------------------------ group copying
    def get_state(self) -> dict[str, Any]:
        return {"seed": self.seed, "state": dataclasses.replace(self.state) if self.state
                else None, "obs": self.obs, "page_text": self.page_text,
                "steps": self.steps, "done": self.done}

    def set_state(self, state: Any) -> None:
        self.seed = state["seed"]
        shop_state = state["state"]
        self.state = None if shop_state is None else dataclasses.replace(
            shop_state, keywords=list(shop_state.keywords), options=dict(shop_state.options))
        self.obs, self.page_text = state["obs"], state["page_text"]
        self.steps, self.done = state["steps"], state["done"]


# ---------------------------------------------------------------------- scripted policy
_ACTIONS_TAIL = "\n You must choose from these actions:"


def _goal_text(obs: str) -> str:
    head = obs.split(".We must buy", 1)[0]
    if " [SEP] " in head:
        parts = head.split(" [SEP] ")
        return parts[parts.index("Instruction:") + 1] if "Instruction:" in parts else ""
    return head.removeprefix("Instruction: ")


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def _best_result(page: str, goal: str, links: list[str]) -> str | None:
    """The result within the goal's price whose title shares the most words with the goal
    (the first on a tie)."""
    parts = [p.strip() for p in page.split("[SEP]")] + [""]
    want = _words(goal)
    limit = re.search(r"price lower than ([0-9.]+) dollars", goal)
    best, best_score = None, -1
    for i, part in enumerate(parts[:-2]):
        link = f"click[{part.lower()}]"
        if link in links:
            prices = [float(p) for p in re.findall(r"\$([0-9]+(?:\.[0-9]+)?)", parts[i + 2])]
            dear = bool(limit and prices and min(prices) > float(limit.group(1)))
            score = len(want & _words(parts[i + 1])) - (100 if dear else 0)
            if score > best_score:
                best, best_score = link, score
    return best


def oracle(obs: str, env_config: dict[str, Any] | None = None) -> list[str]:
    """A scripted shopper from the page text alone (for tests and smoke runs): search the
    goal's product words, open the result whose title is closest to the goal, click the
    goal's options the item page offers, buy. The options and the purchase are one turn:
    RAGEN's pages do not show a selection, so a policy that sees only the page cannot tell
    what it already clicked; when they do not fit in ``env_config["max_actions_per_turn"]``
    (1 when not given, as in RAGEN's config) it buys at the defaults. ``[]`` when nothing is
    left."""
    if _ACTIONS_TAIL not in obs:
        return []
    listed = [a for a in obs.rsplit(_ACTIONS_TAIL, 1)[1].removesuffix(".").split(", ") if a]
    goal = _goal_text(obs)
    if "search[<content>]" in listed:
        # the product and its attributes: what the search indexes (not options, not price)
        words = re.split(r" with [\w ]+: |, and price", goal, maxsplit=1)[0]
        words = words.removeprefix("Find me ").removeprefix("find me ")
        return [f"search[{words}]"] if words else []
    if "click[buy now]" in listed:
        chosen = [f"click[{value.strip().lower()}]"
                  for value in re.findall(r"\w+: ([^,]+?)(?=, and |, |$)", goal)]
        options = [c for c in chosen if c in listed]
        per_turn = int((env_config or {}).get("max_actions_per_turn", 1))
        return (options if len(options) < per_turn else []) + ["click[buy now]"]
    links = [a for a in listed if a not in ("click[back to search]", "click[< prev]",
                                            "click[next >]")]
    if links:
        return [_best_result(obs.split(_ACTIONS_TAIL, 1)[0], goal, links) or links[0]]
    if "click[< prev]" in listed:
        return ["click[< prev]"]
    return []


RagenWebShopEnv.oracle = staticmethod(oracle)
