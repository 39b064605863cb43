"""Prompts in RAGEN's exact format, the history window, the legend, penalties and budgets."""

from __future__ import annotations

import copy
from typing import Any, ClassVar

import pytest

import turnpool
from turnpool.envs.base import TextEnv
from turnpool.pool import TurnResult
from turnpool.rollout.episode import (
    EpisodeState,
    apply_turn,
    plan_actions,
    plan_turn,
    start_episode,
)
from turnpool.rollout.prompts import EnvPrompt, build_messages, describe_env, make_env_prompt
from turnpool.rollout.settings import TagSpec, TurnSettings

pytestmark = pytest.mark.timeout(60)

FMT = ("Always output: <think> [Your thoughts] </think> <answer> [your answer] </answer> "
       "with no extra text. Strictly follow this format. Max response length: 100 words "
       "(tokens).\n")
LAKE = TagSpec(tag="FrozenLake", env_type="frozen_lake", env_instruction="Reach the goal.",
               max_tokens=100, max_actions_per_traj=10)


class LegendEnv(TextEnv):
    """A grid env that draws with its configured ``grid_lookup`` (code -> symbol)."""

    grid_lookup: ClassVar[dict[int, str]] = {0: "#", 1: "_", 2: "P"}
    grid_vocab: ClassVar[dict[str, str] | None] = {"#": "wall", "_": "empty", "P": "player"}
    action_lookup: ClassVar[dict[int, str] | None] = {1: "Left", 2: "Right"}

    def __init__(self, grid_lookup: dict[int, str] | None = None,
                 grid_vocab: dict[str, str] | None = None, **config: Any) -> None:
        super().__init__(**config)
        self.lookup = {int(k): v for k, v in (grid_lookup or self.grid_lookup).items()}
        self.pos = 1

    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        self.pos = 1 + int(self.np_random.integers(0, 3))
        return self._render_text()

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if action is None:
            return self._render_text(), 0.0, False, False, {"action_is_valid": False}
        self.pos = min(3, max(1, self.pos + (1 if action == 2 else -1)))
        return self._render_text(), 0.0, False, False, {"action_is_effective": True}

    def _render_text(self) -> str:
        cells = [0] + [2 if i == self.pos else 1 for i in range(1, 4)] + [0]
        return "".join(self.lookup[c] for c in cells)


LEGEND_ENV = f"{__name__}:LegendEnv"


def _episode(spec: TagSpec = LAKE, settings: TurnSettings | None = None,
             obs: str = "P_\n_G") -> tuple[EpisodeState, TurnSettings]:
    settings = settings or TurnSettings()
    prompt = make_env_prompt(spec, settings)
    return start_episode(prompt, env_id=3, group_id=1, seed=11, obs=obs,
                         info={"anchor_obs": obs}), settings


def _outcome(obs: str, reward: float, n: int, done: bool = False,
             success: bool = False, **info: Any) -> TurnResult:
    return TurnResult(obs=obs, reward_sum=reward, terminated=done, truncated=False,
                      info={"success": success, "anchor_obs": obs, **info}, n_executed=n,
                      error=None)


def test_prompt_is_ragen_format_string_for_string() -> None:
    ep, s = _episode()
    prefix = ("Reach the goal."
              "\nThe meaning of each symbol in the state is:\n"
              "P: player, _: empty, O: hole, G: goal, X: player in hole, √: player on goal"
              "\nYour available actions are:\nLeft, Down, Right, Up"
              '\nYou can make up to 10 actions, separated by the action separator " || "\n')
    first = build_messages(ep, s)
    assert first == [
        {"role": "system", "content": "You're a helpful assistant. "},
        {"role": "user", "content": prefix + "\nTurn 1:\nState:\nP_\n_G\nYou have 10 actions "
                                             "left. " + FMT},
    ]
    plan = plan_turn(ep, "<think>go</think>\n<answer> down||right </answer> trailing", s)
    assert plan.llm_response == "<think>go</think><answer>down || right</answer>"
    assert plan.to_execute == ("Down", "Right") and not plan.penalize
    apply_turn(ep, plan, _outcome("__\n_P", 0.5, 2), s)
    msgs = build_messages(ep, s)
    assert msgs[2:] == [
        {"role": "assistant", "content": "<think>go</think><answer>down || right</answer>"},
        {"role": "user", "content": "Reward:\n0.5\n\nTurn 2:\nState:\n__\n_P\nYou have 8 "
                                    "actions left. " + FMT},
    ]
    # the training view drops the final state and the final reward (RAGEN's
    # prepare_for_update)
    assert build_messages(ep, s, for_update=True) == [
        first[0], first[1], msgs[2]]
    # a turn that ran nothing shows RAGEN's integer 0
    apply_turn(ep, plan_turn(ep, "no tags at all", s), None, s)
    assert build_messages(ep, s)[5]["content"].startswith("Reward:\n0\n\nTurn 3:\n")
    assert build_messages(ep, s)[4]["content"] == "no tags at all"  # raw text kept


def test_answer_only_format_without_think() -> None:
    ep, s = _episode(settings=TurnSettings(enable_think=False, action_sep="|"))
    text = build_messages(ep, s)[1]["content"]
    assert 'separated by the action separator " | "\n' in text
    assert text.endswith("Always output: <answer> [your answer] </answer> with no extra text. "
                         "Strictly follow this format. Max response length: 100 words "
                         "(tokens).\n")
    plan = plan_turn(ep, "<answer>Left | Up</answer>", s)
    assert plan.to_execute == ("Left", "Up") and plan.llm_response == "<answer>Left | Up</answer>"


def test_history_window_never_truncates_stored_history() -> None:
    s = TurnSettings(max_context_window=2)
    ep, _ = _episode(settings=s)
    for k in range(4):
        apply_turn(ep, plan_turn(ep, "<think>t</think><answer>Left</answer>", s),
                   _outcome(f"state{k}", 1.0, 1), s)
    before = copy.deepcopy(ep)
    msgs = build_messages(ep, s)
    text = "".join(m["content"] for m in msgs)
    # window of 2 history entries: turn 4 (state3's predecessor) and the pending turn 5
    assert "\nTurn 4:\n" in text and "\nTurn 5:\n" in text and "\nTurn 3:\n" not in text
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "user"]
    # nothing about the episode changed: all 4 turns, rewards and budget are still there
    assert ep == before
    assert len(ep.turns) == 4 and sum(t.reward for t in ep.turns) == 4.0
    full = build_messages(ep, TurnSettings(max_context_window=-1))
    assert sum(m["role"] == "assistant" for m in full) == 4
    msgs[1]["content"] = "tampered"
    assert build_messages(ep, s)[1]["content"] != "tampered"


def test_legend_comes_from_the_symbols_the_env_draws() -> None:
    desc = describe_env(LEGEND_ENV)
    assert desc.grid_vocab == {"#": "wall", "_": "empty", "P": "player"}
    # only the symbols are remapped: the default meanings follow their codes
    remap = {0: "W", 1: ".", 2: "A"}
    assert describe_env(LEGEND_ENV, {"grid_lookup": remap}).grid_vocab == {
        "W": "wall", ".": "empty", "A": "player"}
    own = {"W": "stone", ".": "sand", "A": "me"}
    # RAGEN's rule (its ContextManager): the prompt reads the tag-level grid_vocab (or the
    # env's default), never env_config, whatever the env draws with
    spec = TagSpec(tag="L", env_type=LEGEND_ENV, env_instruction="",
                   env_kwargs={"grid_lookup": remap, "grid_vocab": own},
                   grid_vocab={"W": "stone", ".": "sand", "A": "me"})
    prompt = make_env_prompt(spec, TurnSettings())
    assert "\nThe meaning of each symbol in the state is:\nW: stone, .: sand, A: me\n" in (
        prompt.prefix)
    env = turnpool.make(LEGEND_ENV, grid_lookup=remap, grid_vocab=own)
    obs, _ = env.reset(seed=5)
    legend = prompt.prefix.split("is:\n")[1].split("\n")[0]
    explained = {item.split(":")[0] for item in legend.split(", ")}
    assert set(obs) <= explained
    nested_only = make_env_prompt(TagSpec(tag="L", env_type=LEGEND_ENV, env_instruction="",
                                          env_kwargs={"grid_lookup": remap,
                                                      "grid_vocab": own}), TurnSettings())
    assert "#: wall, _: empty, P: player" in nested_only.prefix
    plain = make_env_prompt(TagSpec(tag="L", env_type=LEGEND_ENV, env_instruction="",
                                    grid_vocab={"#": "rock", "_": "air", "P": "you"}),
                            TurnSettings())
    assert "#: rock, _: air, P: you" in plain.prefix


def test_format_penalty_once_per_turn() -> None:
    ep, s = _episode()
    plan = plan_turn(ep, "<think>x</think><answer>Left || dance || jump || Up</answer>", s)
    assert plan.valid == ("Left", "Up") and plan.penalize
    apply_turn(ep, plan, _outcome("s1", 0.0, 2), s)
    assert ep.penalty == pytest.approx(-0.1)  # three invalid names, one penalty
    assert ep.turns[-1].executed == ["Left", "Up"] and ep.turns[-1].n_valid == 2
    for reply in ("<think>x</think><answer>fly</answer>", "", "<answer>Left</answer>",
                  "\x00\xff" * 1000, "<think>" * 100_000):
        plan = plan_turn(ep, reply, s)
        assert plan.penalize and plan.to_execute == ()
        apply_turn(ep, plan, None, s)
    assert ep.penalty == pytest.approx(-0.6)
    assert ep.num_actions == 2 and not ep.done  # invalid turns use no action budget
    good = plan_turn(ep, "<think>ok</think><answer>Right</answer>", s)
    apply_turn(ep, good, _outcome("s2", 0.0, 1), s)
    assert ep.penalty == pytest.approx(-0.6) and not ep.turns[-1].penalized
    # free-text envs judge validity themselves: an action they reject is penalized too
    free = TagSpec(tag="C", env_type="countdown", env_instruction="")
    cep, _ = _episode(free, s, obs="Target: 3, nums: [1, 2]")
    plan = plan_turn(cep, "<think>t</think><answer>1 +</answer>", s)
    assert not plan.penalize
    apply_turn(cep, plan, _outcome("bad", 0.0, 1, done=True, action_is_valid=False), s)
    assert cep.penalty == pytest.approx(-0.1) and cep.turns[0].n_valid == 0


def test_action_budget_cuts_extra_actions_without_penalty() -> None:
    spec = TagSpec(tag="FrozenLake", env_type="frozen_lake", env_instruction="",
                   max_actions_per_traj=3)
    ep, s = _episode(spec)
    apply_turn(ep, plan_turn(ep, "<think></think><answer>Left || Up</answer>", s),
               _outcome("a", 0.0, 2), s)
    assert ep.actions_left == 1
    plan = plan_turn(ep, "<think></think><answer>Down || Down || Right</answer>", s)
    assert plan.to_execute == ("Down",) and not plan.penalize
    turn = apply_turn(ep, plan, _outcome("b", 0.0, 1), s)
    assert ep.done and ep.truncated and ep.end_reason == "action_budget"
    assert turn.done and ep.num_actions == 3
    # max_actions_per_turn keeps only the first actions of a reply
    ep2, s2 = _episode(settings=TurnSettings(max_actions_per_turn=2))
    plan = plan_turn(ep2, "<think></think><answer>Up || Up || Up</answer>", s2)
    assert plan.actions == ("Up", "Up") and plan.llm_response.endswith("<answer>Up || Up</answer>")


def test_env_end_and_errors() -> None:
    ep, s = _episode()
    apply_turn(ep, plan_turn(ep, "<think></think><answer>Right</answer>", s),
               _outcome("win", 1.0, 1, done=True, success=True), s)
    assert ep.done and ep.success and ep.terminated and ep.end_reason == "terminated"
    ep, s = _episode()
    plan = plan_turn(ep, "<think></think><answer>Right</answer>", s)
    failed = TurnResult(obs="x", reward_sum=0.0, terminated=False, truncated=True,
                        info={"error": "boom"}, n_executed=0, error="boom")
    apply_turn(ep, plan, failed, s)
    assert ep.done and ep.error == "boom" and ep.end_reason == "error"
    broken = start_episode(make_env_prompt(LAKE, s), 0, 0, 1, "", {"error": "no reset"})
    assert broken.done and broken.error == "no reset"


def test_episode_action_names_for_per_episode_lookups() -> None:
    # Bandit's ids are shuffled per episode; RAGEN's prompt lists no actions, but unknown
    # arm names are still dropped before the env sees them.
    spec = TagSpec(tag="Bandit", env_type="bandit", env_instruction="",
                   env_kwargs={"lo_arm_name": "Phoenix", "hi_arm_name": "Dragon"},
                   max_actions_per_traj=1)
    prompt: EnvPrompt = make_env_prompt(spec, TurnSettings())
    assert prompt.action_names is None and "available actions" not in prompt.prefix
    assert prompt.valid_names == ("Phoenix", "Dragon")
    ep = start_episode(prompt, 0, 0, 1, "obs", {})
    assert plan_actions(ep, ["dragon"]).to_execute == ("Dragon",)
    unicorn = plan_actions(ep, ["unicorn"])
    assert unicorn.to_execute == () and unicorn.penalize


def test_sokoban_different_grid_vocab_prompt_is_ragens() -> None:
    """RAGEN's SokobanDifferentGridVocab explains the default symbols (its prompt reads the
    default config); a model trained on it saw that text, so it is kept (docs/ragen.md)."""
    from turnpool.ragen.config import load_config, rollout_plan

    cfg = load_config(overrides=["es_manager.train.env_configs.tags=[SokobanDifferentGridVocab]"])
    spec = rollout_plan(cfg).tags[0]
    prompt = make_env_prompt(spec, TurnSettings())
    legend = prompt.prefix.split("The meaning of each symbol in the state is:\n")[1]
    legend = legend.split("\n")[0]
    assert {item.split(": ")[0] for item in legend.split(", ")} == set("#_O√XPS")
    obs, _ = turnpool.make(spec.env_type, **spec.env_kwargs).reset(seed=0)
    assert {"W", "A", "B", "G"} <= set(obs.replace("\n", ""))
