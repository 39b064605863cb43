"""TextArena's games through turnpool: the library's own loop, move for move, on many ids and
seeds; the same games through the pool on the sequential and process backends; the global RNG
kept out of the caller's way; PettingZoo's AEC conformance test on two-player games."""

from __future__ import annotations

import random
import re
import sys
from typing import Any

import numpy as np
import pytest
import textarena as ta

import turnpool
from turnpool.envs.hub_table import GlobalRngScope
from turnpool.envs.hubs.textarena import TextArenaEnv, observation_text
from turnpool.pool import EnvPool

#: 24 offline ids, one- to three-player, boards, cards, words and numbers
IDS = [
    "TicTacToe-v0", "ConnectFour-v0", "Nim-v0", "KuhnPoker-v0", "Othello-v0-tiny",
    "Breakthrough-v0-tiny", "Chopsticks-v0", "IteratedPrisonersDilemma-v0", "ColonelBlotto-v0",
    "LiarsDice-v0-small", "UltimateTicTacToe-v0", "WildTicTacToe-v0", "SimpleTak-v0",
    "ThreePlayerTicTacToe-v0", "2048-v0-ultra-easy", "Minesweeper-v0-small", "FrozenLake-v0",
    "GuessTheNumber-v0", "TowerOfHanoi-v0", "Mastermind-v0", "Sudoku-v0-very-easy",
    "LightsOut-v0", "FifteenPuzzle-v0", "Blackjack-v0",
]
SEEDS = (0, 7, 123)
MOVES = 10
_TOKEN = re.compile(r"\[[^\[\]\n]{1,24}\]")
_ROLE = re.compile(r"\[(GAME|Player \d+|[A-Za-z ]+ \d+)\]")


def choose(obs: str, seed: int, move: int) -> str:
    """A move drawn from the bracketed options the game shows near the end of its text (a
    fixed fallback when it shows none): a pure function of the text, the seed and the move."""
    options = [t for t in _TOKEN.findall(obs[-800:]) if not _ROLE.fullmatch(t)] or ["[0]"]
    rng = np.random.default_rng([seed, move])
    return options[int(rng.integers(len(options)))] if rng.random() > 0.15 else "[0]"


def library_loop(env_id: str, seed: int, players: int) -> list[Any]:
    """TextArena's own loop (reset, get_observation, step, close), as its README plays it."""
    env = ta.make(env_id)
    seen: list[Any] = []
    state = random.getstate()
    try:
        env.reset(num_players=players, seed=seed)
        for move in range(MOVES):
            pid, observation = env.get_observation()
            text = observation_text(observation)
            seen.append(("obs", int(pid), text))
            done, _ = env.step(action=choose(text, seed, move))
            if done:
                rewards, _info = env.close()
                seen.append(("end", [float(rewards.get(k, 0.0)) for k in range(players)]))
                break
    finally:
        random.setstate(state)
    return seen


def turnpool_loop(env: TextArenaEnv, seed: int) -> list[Any]:
    obs, info = env.reset(seed=seed)
    seen: list[Any] = [("obs", info["seat"], obs)]
    for move in range(MOVES):
        obs, _reward, terminated, truncated, info = env.step(choose(obs, seed, move))
        if terminated or truncated:
            seen.append(("end", info["seat_rewards"]))
            break
        if move + 1 < MOVES:
            seen.append(("obs", info["seat"], obs))
    return seen


@pytest.mark.parametrize("env_id", IDS)
def test_moves_match_textarenas_own_loop(env_id: str) -> None:
    env = turnpool.make(f"textarena:{env_id}")
    for seed in SEEDS:
        ours = turnpool_loop(env, seed)
        assert ours == library_loop(env_id, seed, env.num_players), (env_id, seed)
    env.close()


def test_a_game_is_the_same_on_the_sequential_and_process_backends() -> None:
    def play(backend: str) -> list[Any]:
        with EnvPool("textarena:TicTacToe-v0", env_num=2, group_n=2, seed=5,
                     backend=backend, num_workers=2) as pool:
            obs, infos = pool.reset()
            out: list[Any] = [(obs, [i["seat"] for i in infos])]
            for move in range(6):
                obs, rewards, dones, infos = pool.step(
                    [choose(o, 5 + k, move) for k, o in enumerate(obs)])
                out.append((obs, rewards, dones, [i.get("seat_rewards") for i in infos]))
        return out

    assert play("sequential") == play("process")


def test_a_game_leaves_the_callers_global_rng_alone() -> None:
    state, np_state = random.getstate(), np.random.get_state()
    env = turnpool.make("textarena:LiarsDice-v0-small")
    env.reset(seed=3)
    env.step("[Bid: 1, 2]")
    assert random.getstate() == state
    after = np.random.get_state()
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(np_state, after))


def test_two_games_interleaved_in_one_process_play_as_if_alone() -> None:
    alone = turnpool_loop(TextArenaEnv("LiarsDice-v0-small"), 9)
    a, b = TextArenaEnv("LiarsDice-v0-small"), TextArenaEnv("LiarsDice-v0-small")
    obs_a, _ = a.reset(seed=9)
    b.reset(seed=10)
    seen: list[Any] = [("obs", 0, obs_a)]
    for move in range(MOVES):
        b.step("[Bid: 1, 1]")  # the other game draws in between
        obs_a, _r, term, trunc, info = a.step(choose(obs_a, 9, move))
        if term or trunc:
            seen.append(("end", info["seat_rewards"]))
            break
        if move + 1 < MOVES:
            seen.append(("obs", info["seat"], obs_a))
    assert seen == alone


def test_the_rng_scope_restores_the_callers_state_after_an_error() -> None:
    state = random.getstate()
    scope = GlobalRngScope(1)
    with pytest.raises(RuntimeError), scope:
        random.seed(99)
        raise RuntimeError("inside")
    assert random.getstate() == state


def test_refused_moves_are_invalid_and_the_game_decides_what_follows() -> None:
    env = TextArenaEnv("TicTacToe-v0")
    env.reset(seed=0)
    _obs, _r, done, _t, info = env.step("[4]")
    assert info["action_is_valid"] and info["seat"] == 1 and not done
    _obs, _r, done, _t, info = env.step("[4]")  # taken: TextArena lets seat 1 try again
    assert not info["action_is_valid"] and info["seat"] == 1 and not done


def test_the_thread_backend_refuses_a_global_rng_library() -> None:
    with pytest.raises(Exception, match="TextArenaEnv|global"):
        EnvPool("textarena:TicTacToe-v0", env_num=2, backend="thread", num_workers=2)


@pytest.mark.parametrize("env_id", ["TicTacToe-v0", "ConnectFour-v0", "KuhnPoker-v0",
                                    "ThreePlayerTicTacToe-v0"])
def test_pettingzoo_api_test_passes(env_id: str) -> None:
    """PettingZoo's own conformance test, its observation-dtype check aside (it assumes
    numeric arrays; a Text observation has no dtype): there, the observation must lie in
    its space."""
    from pettingzoo.test import api_test

    from turnpool.envs.aec import SeatAEC

    module = sys.modules["pettingzoo.test.api_test"]

    def text_in_space(expected: Any, seen: Any, recursed_keys: list[str]) -> None:
        assert expected.contains(seen), recursed_keys

    saved = module._test_observation_space_compatibility
    module._test_observation_space_compatibility = text_in_space
    try:
        api_test(SeatAEC(TextArenaEnv(env_id)), num_cycles=100)
    finally:
        module._test_observation_space_compatibility = saved
