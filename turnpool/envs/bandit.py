"""Two-armed bandit whose arms are named for what they pay (RAGEN's Bandit).

The low arm (``"phoenix"``) always pays ``lo_arm_score`` (0.1); the high arm (``"dragon"``)
pays ``hi_arm_hiscore`` (1.0) with probability ``hi_arm_hiscore_prob`` (0.25), else
``hi_arm_loscore`` (0), so its expected reward is higher. Each reset flips a coin (from the
env's generator) for which of the ids ``action_space_start`` and ``action_space_start + 1`` is
which arm; :meth:`BanditEnv.action_lookup_for_episode` gives the episode's id -> name map, and
arm names are matched case-insensitively. One pull ends the episode; ``success`` means the high
arm was chosen.

RAGEN v2 (``split="train"`` or ``"test"``): the two names come from `ARM_NAMES` (low arm
first), and the episode's generator is seeded with ``seed + internal_seed``, where RAGEN's
``internal_seed`` is how many Bandit envs its process built before this one (so members of
one group draw different payouts); its draws: the name pair, then the id order.

Example:
    >>> env = BanditEnv()
    >>> obs, _ = env.reset(seed=0)
    >>> obs, reward, terminated, truncated, info = env.step("Dragon")
    >>> terminated, info["success"]
    (True, True)
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces

from turnpool.envs.base import TextEnv

#: RAGEN's prompt, character for character (trailing spaces included): a trained model has
#: seen exactly this text.
PROMPT = (
    "You are playing a bandit game. Goal: Maximize your total reward by choosing which arm to "
    "pull. \n"
    "Game Rules: \n"
    "1. There are 2 arms, named {a} and {b}\n"
    "2. Each arm has its own reward distribution, related to their names. \n"
    "3. Analyze the symbolic meaning of each arm's name to guess how their reward distribution "
    "might behave.\n"
    "4. Based on the symbolic meaning of their names, which arm do you think is more likely to "
    "give higher rewards on average? Choose between {a} and {b}, and output like <answer> {a} "
    "</answer> or <answer> {b} </answer>.\n")


#: RAGEN v2's (low arm, high arm) name pairs per split.
ARM_NAMES: dict[str, tuple[tuple[str, str], ...]] = {
    "train": (("Teacher", "Trader"), ("Nurse", "StartupFounder"), ("Librarian", "Investor"),
              ("Accountant", "StockBroker"), ("Engineer", "RealEstateAgent"),
              ("Pharmacist", "Musician"), ("Clerk", "Freelancer"), ("Technician", "Youtuber"),
              ("Planner", "Artist"), ("Postman", "Pilot"), ("Banker", "VentureCapitalist"),
              ("Gardener", "Cryptominer")),
    "test": (("Receptionist", "Explorer"), ("Archivist", "Filmmaker"),
             ("Bookkeeper", "Consultant"), ("SocialWorker", "Photographer"),
             ("Mechanic", "GameDesigner"), ("Secretary", "Entrepreneur"),
             ("Cashier", "DataScientist"), ("CivilServant", "StartupAccelerator")),
}


def _number(value: Any) -> float | int:
    """A payout as the config gives it: ints stay ints, so ``"1 points"`` reads as in RAGEN."""
    return value if isinstance(value, int) and not isinstance(value, bool) else float(value)


class BanditEnv(TextEnv):
    """One-pull, two-armed bandit; see the module docstring for the rules."""

    action_kind = "names"  # arm names; their ids change per episode
    #: what RAGEN's env reports in ``info`` (the RAGEN facade shows only these)
    ragen_info_keys = ("action_is_effective", "action_is_valid", "success")
    ragen_v2_defaults = {"split": "train"}  # noqa: RUF012
    ragen_v2_instance_kwarg = "internal_seed"
    #: RAGEN's action_lookup (filled in by its env) is accepted and unused
    extra_kwargs = frozenset({"action_lookup"})

    def __init__(
        self, lo_arm_name: str = "phoenix", lo_arm_score: float = 0.1,
        hi_arm_name: str = "dragon", hi_arm_loscore: float = 0.0,
        hi_arm_hiscore: float = 1.0, hi_arm_hiscore_prob: float = 0.25,
        action_space_start: int = 1, split: str | None = None, internal_seed: int = 0,
        **config: Any,
    ) -> None:
        super().__init__(
            lo_arm_name=lo_arm_name, lo_arm_score=lo_arm_score, hi_arm_name=hi_arm_name,
            hi_arm_loscore=hi_arm_loscore, hi_arm_hiscore=hi_arm_hiscore,
            hi_arm_hiscore_prob=hi_arm_hiscore_prob, action_space_start=action_space_start,
            split=split, internal_seed=internal_seed, **config)
        if lo_arm_name.lower() == hi_arm_name.lower():
            raise ValueError("bandit arms need different names")
        if split is not None and split not in ARM_NAMES:
            raise ValueError(f"bandit split must be one of {sorted(ARM_NAMES)}, got {split!r}")
        self.split = split
        self.internal_seed = int(internal_seed)
        self.lo_arm_name = str(lo_arm_name)
        self.hi_arm_name = str(hi_arm_name)
        self.lo_arm_score = _number(lo_arm_score)
        self.hi_arm_loscore = _number(hi_arm_loscore)
        self.hi_arm_hiscore = _number(hi_arm_hiscore)
        self.hi_arm_hiscore_prob = float(hi_arm_hiscore_prob)
        self.start = int(action_space_start)
        self.lookup: dict[int, str] = {self.start: self.lo_arm_name,
                                       self.start + 1: self.hi_arm_name}
        self.done = False
        self._text = ""
        self.action_space = spaces.Discrete(2, start=self.start)

    def set_state(self, state: Any) -> None:
        """Refuses another ``internal_seed``'s snapshot: group members numbered apart start
        from different states, so the pool resets each one itself."""
        if state.get("internal_seed") != self.internal_seed:
            raise ValueError("a snapshot of a Bandit with another internal_seed")
        super().set_state(state)

    def action_lookup_for_episode(self) -> dict[int, str]:
        """The episode's id -> arm map; with a ``split`` none before the first reset (the
        names are drawn then), so code that asks early accepts any word and the env decides."""
        if self.split is not None and not self._text:
            return {}
        return dict(self.lookup)

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        if self.split is not None:  # RAGEN v2: names drawn per episode, offset seed
            self.np_random = np.random.default_rng(seed + self.internal_seed)
            pairs = ARM_NAMES[self.split]
            self.lo_arm_name, self.hi_arm_name = pairs[int(self.np_random.random() * len(pairs))]
        names = [self.lo_arm_name, self.hi_arm_name]
        if self.np_random.random() >= 0.5:
            names.reverse()
        self.lookup = {self.start: names[0], self.start + 1: names[1]}
        self.done = False
        self._text = PROMPT.format(a=names[0], b=names[1])
        return self._text

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.done:
            return self._text, 0.0, True, False, {"action_is_valid": False}
        self.done = True
        if action is None:
            first, second = self.lookup.values()
            self._text = f"Invalid choice: the arms are {first} and {second}."
            return self._text, 0.0, True, False, {"action_is_valid": False}
        arm = self.lookup[action]
        if arm == self.hi_arm_name:
            hit = self.np_random.random() < self.hi_arm_hiscore_prob
            reward = self.hi_arm_hiscore if hit else self.hi_arm_loscore
        else:
            reward = self.lo_arm_score
        self._text = f"{arm}: {reward} points"
        return self._text, reward, True, False, {
            "action_is_effective": True, "success": arm == self.hi_arm_name}

    def _render_text(self) -> str:
        return self._text


def _pairs(env_config: dict[str, Any]) -> tuple[tuple[str, str], ...]:
    """The (low, high) name pairs an env with this config may show."""
    split = env_config.get("split")
    if split is not None:
        return ARM_NAMES.get(str(split), ())
    return ((str(env_config.get("lo_arm_name", "phoenix")),
             str(env_config.get("hi_arm_name", "dragon"))),)


def _shown(obs: str, env_config: dict[str, Any]) -> tuple[str, str, str] | None:
    """``(first shown, second shown, high arm)`` read back from an episode's prompt."""
    if not isinstance(obs, str):
        return None
    for lo, hi in _pairs(env_config):
        for a, b in ((lo, hi), (hi, lo)):
            if f"named {a} and {b}\n" in obs:
                return a, b, hi
    return None


def oracle(obs: str, env_config: dict[str, Any]) -> list[str]:
    """The arm with the higher expected reward (the high arm with the default payouts)."""
    arms = BanditEnv(**env_config)
    hi_mean = (arms.hi_arm_hiscore_prob * arms.hi_arm_hiscore
               + (1 - arms.hi_arm_hiscore_prob) * arms.hi_arm_loscore)
    shown = _shown(obs, env_config)
    hi = shown[2] if shown else arms.hi_arm_name
    lo = next((n for n in shown[:2] if n != hi), arms.lo_arm_name) if shown else arms.lo_arm_name
    return [hi if hi_mean >= arms.lo_arm_score else lo]


BanditEnv.oracle = staticmethod(oracle)


def episode_lookup(obs: str, env_config: dict[str, Any]) -> dict[int, str] | None:
    """The episode's id -> arm map read back from its first observation (the prompt names
    the arms in id order), for code that sees only the text (RAGEN's manager maps names)."""
    start = int(env_config.get("action_space_start", 1))
    shown = _shown(obs, env_config)
    return {start: shown[0], start + 1: shown[1]} if shown else None


BanditEnv.episode_lookup = staticmethod(episode_lookup)
