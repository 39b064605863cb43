"""turnpool inside a real TRL GRPOTrainer (CPU, the tiny offline model): rollout_func and
environment_factory each train 2 optimisation steps; a hanging env is cut at step_timeout."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import get_json_schema
from trl import GRPOConfig, GRPOTrainer

from turnpool.integrations.leases import shared_leases
from turnpool.integrations.trl import (
    TurnpoolRollout,
    check_whole_groups,
    environment_factory,
    seed_of_row,
    turnpool_reward,
)
from turnpool.rollout.settings import CollectorSettings

HANG = {"sleep_ms": 3_600_000}
PROCESS = {"backend": "process", "num_workers": 1, "step_timeout": 2.0}


class RecordingTrainer(GRPOTrainer):
    """A GRPOTrainer that keeps what each generation batch handed to the loss."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.batches: list[dict[str, Any]] = []

    def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
        out = super()._generate_and_score_completions(inputs)
        self.batches.append({k: out[k] for k in ("tool_mask", "completion_mask", "advantages")
                             if k in out})
        return out


def _config(tmp_path: Path, **kw: Any) -> GRPOConfig:
    base: dict[str, Any] = dict(output_dir=str(tmp_path / "out"), per_device_train_batch_size=4,
                                num_generations=2, max_steps=2, learning_rate=1e-3,
                                report_to=[], use_cpu=True, logging_steps=1,
                                save_strategy="no", seed=0, disable_tqdm=True)
    base.update(kw)
    return GRPOConfig(**base)


def test_rollout_func_trains_two_steps_with_env_masks(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rollout = TurnpoolRollout("sokoban", {"dim_room": (6, 6)},
                              settings=CollectorSettings(max_turn=2),
                              pool_options={"backend": "thread", "num_workers": 2},
                              max_new_tokens=16, seed=7)
    seen: list[list[Any]] = []
    trajectories: list[Any] = []

    def reward(completions: list[Any], turnpool_score: list[float | None],
               **kw: Any) -> list[float | None]:
        seen.append(list(turnpool_score))
        trajectories.append(list(rollout.last_trajectories))
        return turnpool_reward(completions, turnpool_score, **kw)

    trainer = RecordingTrainer(
        model=model, reward_funcs=[reward], args=_config(tmp_path, max_completion_length=64),
        train_dataset=Dataset.from_dict({"prompt": ["play"] * 8}), processing_class=tok,
        rollout_func=rollout)
    try:
        trainer.train()
    finally:
        rollout.close()
    assert trainer.state.global_step == 2 and len(trainer.batches) == 2
    logged = [h["rewards/reward/mean"] for h in trainer.state.log_history
              if "rewards/reward/mean" in h]
    for batch, scores, trajs, mean in zip(trainer.batches, seen, trajectories, logged):
        assert scores == [t.score + t.penalty for t in trajs]
        assert mean == pytest.approx(sum(scores) / len(scores), abs=1e-5)
        # groups of 2: same seed, same first state
        assert [t.seed for t in trajs[0::2]] == [t.seed for t in trajs[1::2]]
        assert trajs[0].turns[0].state == trajs[1].turns[0].state
        mask = batch["tool_mask"] * batch["completion_mask"]
        for row, t in zip(mask.tolist(), trajs):
            ones = sum(len(turn.response_ids) for turn in t.turns)
            zeros = sum(len(turn.prompt_ids) for turn in t.turns[1:])
            assert sum(row) == ones
            assert sum(batch_row for batch_row in row[: ones + zeros]) == ones
            if len(t.turns) > 1:  # env/template tokens between the replies are masked
                first = len(t.turns[0].response_ids)
                assert row[first] == 0 and row[first + zeros] == 1


def test_rollout_func_hanging_env_is_cut_and_unscored(tiny_model_dir: Path,
                                                      tmp_path: Path) -> None:
    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rollout = TurnpoolRollout("sleep", HANG,  # no retries: each would hang again
                              settings=CollectorSettings(max_turn=2, episode_retries=0),
                              pool_options=PROCESS, max_new_tokens=16)
    trainer = GRPOTrainer(model=model, reward_funcs=[turnpool_reward],
                          args=_config(tmp_path, max_completion_length=32),
                          train_dataset=Dataset.from_dict({"prompt": ["play"] * 4}),
                          processing_class=tok, rollout_func=rollout)
    try:
        start = time.monotonic()
        out = rollout(["play"] * 4, trainer)
        elapsed = time.monotonic() - start
    finally:
        rollout.close()
    assert elapsed < 60
    assert out["turnpool_score"] == [None] * 4  # unscored, never 0
    assert all(f is not None for f in out["turnpool_failure"])
    assert all(sum(m) == 0 for m in out["env_mask"])
    assert all(len(m) == len(c) == len(lp) for m, c, lp in
               zip(out["env_mask"], out["completion_ids"], out["logprobs"]))
    assert all("timeout" in (t.error or "") for t in rollout.last_trajectories)
    assert turnpool_reward([], out["turnpool_score"]) == [None] * 4


def test_environment_factory_tools_are_typed_and_act_on_the_env() -> None:
    Sokoban = environment_factory("sokoban", {"dim_room": (6, 6)},
                                  pool_options={"backend": "sequential"}, capacity=2)
    env = Sokoban()
    assert {"up", "down", "left", "right"} <= set(vars(Sokoban))
    schema = get_json_schema(env.up)
    assert schema["function"]["name"] == "up" and not schema["function"]["parameters"].get(
        "required")
    first = env.reset(prompt="p", seed=5)
    assert "Sokoban" in first and "Turn" not in first
    assert "Reward: " in env.up()
    assert env.get_reward() is not None
    Count = environment_factory("countdown", pool_options={"backend": "sequential"},
                                capacity=1)
    counter = Count()
    schema = get_json_schema(counter.act)
    assert schema["function"]["parameters"]["properties"]["action"]["type"] == "string"
    counter.reset(prompt="p")
    assert "episode is over" in counter.act("1+2")
    assert counter.get_reward() == pytest.approx(counter._reward)
    assert "episode is over" in counter.act("x" * 10_000_000)  # no second step, no crash
    # same row -> same seed (a GRPO group shares its start state)
    assert seed_of_row({"prompt": "a"}) == seed_of_row({"prompt": "a"})
    assert seed_of_row({"prompt": "a", "seed": 3}) == 3


def test_environment_factory_hang_is_cut_and_slots_are_given_back() -> None:
    Sleep = environment_factory("sleep", HANG, pool_options=PROCESS, capacity=2)
    leases = shared_leases("sleep", HANG, 2, PROCESS)
    env, other = Sleep(), Sleep()
    env.reset(seed=1)
    other.reset(seed=1)
    assert leases.leased == 2
    start = time.monotonic()
    reply = env.act("go")
    assert time.monotonic() - start < 60
    assert "failed" in reply and "timeout" in reply
    assert env.get_reward() is None  # a failed env is unscored, not 0
    assert "episode is over" in env.act("again")
    env.reset(seed=2)  # gives its slot back and leases one again
    assert leases.leased == 2 and env.get_reward() == 0.0
    del other
    assert leases.leased == 1


def test_environment_factory_trains_two_steps(tiny_model_dir: Path, tmp_path: Path) -> None:
    from trl.chat_template_utils import qwen2_5_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = qwen2_5_chat_template  # renders tools; the tiny model's does not
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    Bandit = environment_factory("bandit", pool_options={"backend": "thread"}, capacity=8)
    resets: list[dict[str, Any]] = []

    class Recorded(Bandit):  # type: ignore[misc, valid-type]
        def reset(self, **row: Any) -> str:
            resets.append(dict(row))
            return str(super().reset(**row))

    trainer = RecordingTrainer(
        model=model, args=_config(tmp_path, max_completion_length=16,
                                  max_tool_calling_iterations=1),
        train_dataset=Dataset.from_dict({"prompt": [[{"role": "user", "content": "Play."}]] * 8,
                                         "seed": [0, 0, 1, 1, 2, 2, 3, 3]}),
        processing_class=tok, environment_factory=Recorded)
    trainer.train()
    assert trainer.state.global_step == 2
    assert len(resets) == 8 and all("seed" in r for r in resets)
    rewards = [h for h in trainer.state.log_history if "rewards/Recorded/mean" in h]
    assert len(rewards) == 2  # the env's get_reward is the reward source TRL logged
    envs = trainer.environments
    assert [e.get_reward() for e in envs] == [float(e._reward) for e in envs]
    leases = shared_leases("bandit", {}, 8, {"backend": "thread"})
    assert leases.leased <= 4 + 1  # the batch's instances (+ TRL's probe) hold slots
    for batch in trainer.batches:
        assert batch["tool_mask"].shape == batch["completion_mask"].shape


@pytest.mark.parametrize("thinking", [True, False])
def test_rollout_func_qwen3_template_multi_turn(tiny_model_dir: Path, tmp_path: Path,
                                                thinking: bool) -> None:
    """Qwen3's stock template drops earlier <think> blocks when it re-renders a chat; the
    episode still trains as one sequence: exactly the tokens the model saw and sampled."""
    from trl.chat_template_utils import qwen3_chat_template

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = qwen3_chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rollout = TurnpoolRollout("sokoban", {"dim_room": (6, 6)},
                              settings=CollectorSettings(max_turn=3),
                              pool_options={"backend": "sequential"}, seed=3)
    kwargs = {"chat_template_kwargs": {"enable_thinking": thinking}}
    outs: list[tuple[list[Any], dict[str, Any]]] = []
    original = rollout.__call__

    def recording(prompts: list[Any], trainer: Any) -> dict[str, Any]:
        out = original(prompts, trainer)
        outs.append((list(rollout.last_trajectories), out))
        return out

    trainer = RecordingTrainer(
        model=model, reward_funcs=[turnpool_reward],
        args=_config(tmp_path, max_completion_length=256, top_k=20, min_p=0.01,
                     repetition_penalty=1.1, temperature=0.7, **kwargs),
        train_dataset=Dataset.from_dict({"prompt": ["play"] * 8}), processing_class=tok,
        rollout_func=recording)
    try:
        trainer.train()
    finally:
        rollout.close()
    assert trainer.state.global_step == 2 and len(outs) == 2
    multi = 0
    for trajs, out in outs:
        for t, prompt, completion, mask in zip(trajs, out["prompt_ids"], out["completion_ids"],
                                               out["env_mask"]):
            assert t.error is None and t.is_one_sequence
            ids = list(t.turns[0].prompt_ids or [])
            for k, turn in enumerate(t.turns):
                ids += (turn.prompt_ids or []) if k else []
                ids += turn.response_ids or []
            assert prompt + completion == ids  # what the model saw and sampled
            assert sum(mask) == sum(len(turn.response_ids or []) for turn in t.turns)
            assert len(completion) <= 256  # max_completion_length bounds the episode
            text = tok.decode(prompt + completion)
            # enable_thinking=False: the template's empty thought opens every reply
            assert text.count("<think>\n\n</think>") == (0 if thinking else len(t.turns))
            if len(t.turns) > 1:
                multi += 1
            # the episode ends for a true reason: turns, its token budget, or the env
            assert t.end_reason in ("max_turn", "token_budget", "terminated", "truncated",
                                    "action_budget")
            assert (t.end_reason == "max_turn") == (len(t.turns) == 3 and not t.turns[-1].done)
    assert multi > 0  # the crash this guards against needs a second turn


def test_rollout_func_generates_through_trls_vllm_client(tiny_model_dir: Path,
                                                         tmp_path: Path) -> None:
    """With ``use_vllm`` in server mode the episode is generated by TRL's own VLLMClient. vLLM
    cannot run here (and TRL's server mode needs it and NCCL to start), so the trainer is
    built without it and then pointed at a real VLLMClient talking HTTP to the local token
    server, which answers in vLLM's format."""
    import requests
    from trl.chat_template_utils import qwen3_chat_template
    from trl.generation.vllm_client import VLLMClient

    from turnpool.policies.token_server import TokenServer

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = qwen3_chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    rollout = TurnpoolRollout("sokoban", {"dim_room": (6, 6)},
                              settings=CollectorSettings(max_turn=3),
                              pool_options={"backend": "sequential"}, seed=11)
    trainer = GRPOTrainer(
        model=model, reward_funcs=[turnpool_reward],
        args=_config(tmp_path, max_completion_length=200, top_k=7, min_p=0.02,
                     repetition_penalty=1.05, temperature=0.9,
                     chat_template_kwargs={"enable_thinking": False}),
        train_dataset=Dataset.from_dict({"prompt": ["play"] * 4}), processing_class=tok,
        rollout_func=rollout)
    serving = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with TokenServer(serving, tok) as server:
        client = VLLMClient.__new__(VLLMClient)  # its __init__ insists on vLLM being installed
        client.session = requests.Session()
        client.base_url = server.url.removesuffix("/v1")
        client.model = server.model_name
        trainer.use_vllm, trainer.vllm_mode = True, "server"
        trainer.vllm_generation = type("VLLMGeneration", (), {"vllm_client": client})()
        try:
            out = rollout(["play"] * 4, trainer)
        finally:
            rollout.close()
            client.session.close()
    assert server.log and all(e["endpoint"] == "completions" for e in server.log)
    assert all(e["sampling"] == {"temperature": 0.9, "max_tokens": e["sampling"]["max_tokens"],
                                 "top_k": 7, "min_p": 0.02, "repetition_penalty": 1.05}
               for e in server.log)
    assert all(e["sampling"]["max_tokens"] <= 200 for e in server.log)
    for t, prompt, completion, mask in zip(rollout.last_trajectories, out["prompt_ids"],
                                           out["completion_ids"], out["env_mask"]):
        seq = prompt + completion
        assert len(completion) <= 200
        sampled: list[int] = []
        for k, turn in enumerate(t.turns):
            cut = len(t.turns[0].prompt_ids or []) + sum(
                len(x.response_ids or []) + (len(x.prompt_ids or []) if j else 0)
                for j, x in enumerate(t.turns[:k])) + (len(turn.prompt_ids or []) if k else 0)
            # what the server got and sampled, token for token, sits in the trained sequence
            assert any(e["prompt_ids"] == seq[:cut] and e["token_ids"] == turn.response_ids
                       for e in server.log)
            sampled += turn.response_ids or []
        assert [i for i, m in zip(completion, mask) if m] == sampled
        assert tok.decode(seq).count("<think>\n\n</think>") == len(t.turns)  # enable_thinking
    assert max(len(t.turns) for t in rollout.last_trajectories) > 1


def test_a_batch_that_splits_groups_is_refused_naming_the_setting(tmp_path: Path) -> None:
    """2 prompts per device x 2 steps per generation on 2 processes: TRL accepts groups of 8
    (the global batch is 8) but each process gets 4 prompts, half a group. TurnpoolRollout
    refuses before it starts anything, naming the setting to change."""
    cfg = _config(tmp_path, per_device_train_batch_size=2, num_generations=4,
                  steps_per_generation=2)
    check_whole_groups(cfg, 2)
    cfg.num_generations = 8  # what TRL's own check accepts on 2 processes (8 % 8 == 0)
    with pytest.raises(ValueError, match="Raise steps_per_generation .e.g. to 4.") as err:
        check_whole_groups(cfg, 2)
    assert "num_generations = 8" in str(err.value)

    class Accel:
        num_processes = 2

    class Trainer:  # the attributes TurnpoolRollout reads before it starts anything
        args = cfg
        accelerator = Accel()

    rollout = TurnpoolRollout("bandit")
    with pytest.raises(ValueError, match="whole GRPO groups"):
        rollout(["p"] * 4, Trainer())
    assert rollout._pools == {}  # no pool was started


def _readme_block(marker: str) -> str:
    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    start = text.index("```python\n", text.index(marker)) + len("```python\n")
    return text[start:text.index("```\n", start)]


@pytest.mark.slow(seconds=20)
def test_readme_environment_factory_runs_with_a_tool_calling_model(
        tiny_model_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The README's environment_factory block, run as written, with the tiny model fine-tuned
    here to answer in Qwen's <tool_call> JSON: TRL parses the calls and they step turnpool envs.
    """
    from trl.chat_template_utils import qwen2_5_chat_template

    from turnpool.policies.tiny_llm import teach_tool_calls

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    tok.chat_template = qwen2_5_chat_template
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    Probe = environment_factory("bandit", pool_options={"backend": "sequential"}, capacity=1)
    first = Probe().reset(seed=0)
    assert "phoenix()" in first and "dragon()" in first and "<answer>" not in first
    teach_tool_calls(model, tok, Probe, "Pull an arm.")  # the README rows' user text

    monkeypatch.chdir(tmp_path)
    import trl.trainer.grpo_trainer as grpo

    parsed: list[dict[str, Any]] = []  # what TRL's own parser made of each completion
    parse = grpo.parse_response

    def recorded(*args: Any, **kw: Any) -> Any:
        out = parse(*args, **kw)
        parsed.append(out)
        return out

    monkeypatch.setattr(grpo, "parse_response", recorded)
    scope: dict[str, Any] = {"model": model, "tokenizer": tok}
    # the README's own code (trusted text of this repository), run as a user would paste it
    code = compile(_readme_block("environment_factory example"), "README.md", "exec")
    exec(code, scope)  # noqa: S102
    trainer = scope["trainer"]
    assert trainer.state.global_step == 1
    envs = trainer.environments
    steps = sum(e.tool_steps for e in envs)
    calls = sum(len(m.get("tool_calls") or []) for m in parsed)
    assert 0 < steps <= calls  # env steps caused by the model's (well-formed) tool calls
    # a garbled <tool_call> stays text: no env step, no exception
    garbled = [m for m in parsed if "<tool" in str(m.get("content")) and not m.get("tool_calls")]
    assert len(parsed) >= 8 and steps <= len(parsed) - len(garbled)
    logged = [h for h in trainer.state.log_history if "tools/call_frequency" in h]
    assert logged and logged[0]["tools/call_frequency"] > 0
    assert all(isinstance(r, str) for e in envs for r in e.invalid_calls)


def test_environment_factory_rejects_malformed_calls_with_a_reason() -> None:
    Count = environment_factory("countdown", pool_options={"backend": "sequential"},
                                capacity=1)
    env = Count()
    env.reset(seed=1)
    replies = [env.act(""), env.act(None), env.act(["1+2"])]
    assert all(r.startswith("Invalid call:") for r in replies)
    assert len(env.invalid_calls) == 3 and env.tool_steps == 0
    env.act("1+2")
    assert env.tool_steps == 1
    assert env.act("again").startswith("Invalid call: the episode is over")
    assert len(env.invalid_calls) == 4


def test_choice_example_runs_one_step_of_both_curves(tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """examples/trl_grpo_bandit_choice.py's code path (SFT, GRPO run, lr-0 control, JSON) at
    one step, leaving no scratch folder behind; the full run stays out of the suite."""
    import importlib.util
    import tempfile

    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))

    script = Path(__file__).resolve().parents[2] / "examples" / "trl_grpo_bandit_choice.py"
    spec = importlib.util.spec_from_file_location("trl_grpo_bandit_choice", script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    summary = module.main(["--steps", "1", "--sft-steps", "2", "--groups", "1",
                           "--group-size", "2", "--out", str(tmp_path / "choice")])
    assert [r["learning_rate"] for r in summary["runs"]] == [1e-3, 0.0]
    assert all(len(r["success"]) == 1 for r in summary["runs"])
    # same seeds, same starting model: step 1 is the same sample in both runs
    assert summary["runs"][0]["success"] == summary["runs"][1]["success"]
    assert (tmp_path / "choice.json").exists()
    assert list(scratch.iterdir()) == []  # the model and TRL's output went with their folder
