"""GEM through turnpool: every offline game id (and a few of GEM's reasoning-gym ids), the
same observations, rewards and ends as GEM's own loop for the same seeds and actions, and the
same on the sequential and process backends."""

from __future__ import annotations

import random

import gem
import numpy as np

import turnpool
from tests.envs.hubs.parity import Record, play_make, play_pool, record
from turnpool.envs.hub_table import GlobalRngScope

#: GEM's game ids that need NLTK's word lists (fetched from the web, not shipped) or fail in
#: GEM itself with their "random" settings (FifteenPuzzle, Crosswords): not offline here.
NOT_OFFLINE = ("Wordle", "Hangman", "WordSearch", "FifteenPuzzle-v0-random",
               "Crosswords-v0-random")
#: they run, but GEM takes 10-20 s to generate one of their rooms: too slow for the suite
SLOW = ("Sokoban-v0-hard", "Sokoban-v0-random")
GAMES = [i for i in gem.envs.registration.ENV_REGISTRY
         if i.startswith("game:") and not any(part in i for part in NOT_OFFLINE + SLOW)]
NAMES = [f"gem:{i}" for i in GAMES] + [f"gem:rg:{d}" for d in (
    "leg_counting", "basic_arithmetic", "countdown", "arc_1d", "family_relationships")]
STEPS = 4
FALLBACK_ACTIONS = ("\\boxed{up}", "\\boxed{1 1 5}", "\\boxed{3}", "\\boxed{A}", "no box")
BASE_SEED = 5


def library_loop(name: str, seed: int) -> tuple[tuple[str, list[Record]], list[str]]:
    """GEM's own loop: make, reset(seed), step GEM's random actions (drawn in a scope of
    their own, so that drawing them does not move the game's global RNG)."""
    env = gem.make(name[4:])
    obs, _ = env.reset(seed=seed)
    chooser = GlobalRngScope(seed + 10_000)
    steps: list[Record] = []
    actions: list[str] = []
    for _ in range(STEPS):
        with chooser:
            try:
                action = env.sample_random_action()
            except NotImplementedError:  # some games offer none: a few texts of each shape
                action = random.choice(FALLBACK_ACTIONS)
        actions.append(action)
        o, r, term, trunc, info = env.step(action)
        steps.append(record(o, r, term, trunc, info, library=True))
        if term or trunc:
            break
    return (obs, steps), actions


def test_at_least_twenty_offline_ids_are_played() -> None:
    assert len(GAMES) >= 24 and len(NAMES) >= 29


def test_every_id_plays_as_in_gems_own_loop() -> None:
    for k, name in enumerate(NAMES):
        theirs, actions = library_loop(name, BASE_SEED + k)
        assert play_make(name, BASE_SEED + k, actions) == theirs, name


def test_the_sequential_and_process_backends_play_the_same_episodes() -> None:
    actions = {name: library_loop(name, BASE_SEED + k)[1] for k, name in enumerate(NAMES)}
    sequential = play_pool(NAMES, BASE_SEED, actions, "sequential")
    process = play_pool(NAMES, BASE_SEED, actions, "process", num_workers=2)
    assert sequential == process
    for name in NAMES[:3]:
        k = NAMES.index(name)
        assert sequential[name] == play_make(name, BASE_SEED + k, actions[name])


def test_gem_reseeding_leaves_the_callers_global_rngs_alone() -> None:
    random.seed(9)
    np.random.seed(9)
    expected = random.random(), np.random.random()
    random.seed(9)
    np.random.seed(9)
    env = turnpool.make("gem:game:Sokoban-v0-easy")
    env.reset(seed=1)
    env.step("\\boxed{up}")
    env.close()
    assert (random.random(), np.random.random()) == expected


def test_two_envs_interleaved_in_one_process_play_as_each_alone() -> None:
    name = "gem:game:Minesweeper-v0-easy"
    alone = [play_make(name, s, ["\\boxed{1 1}", "\\boxed{2 3}"]) for s in (1, 2)]
    envs = [turnpool.make(name) for _ in range(2)]
    firsts = [env.reset(seed=s)[0] for env, s in zip(envs, (1, 2))]
    steps: list[list[Record]] = [[], []]
    for action in ("\\boxed{1 1}", "\\boxed{2 3}"):
        for k, env in enumerate(envs):
            if not steps[k] or not (steps[k][-1][2] or steps[k][-1][3]):
                steps[k].append(record(*env.step(action)))
    assert [(firsts[k], steps[k]) for k in range(2)] == alone


def test_an_unknown_gem_id_fails_in_the_caller_naming_the_listing() -> None:
    try:
        turnpool.make("gem:game:NoSuchGame-v0")
    except KeyError as exc:
        assert "turnpool envs --hub gem" in str(exc)
    else:
        raise AssertionError("an unknown id built")
