"""``turnpool verl-config``: the folder it writes is what verl reads. The rows load through
verl's own RLHFDataset, the agent-loop YAML registers and builds the turnpool loop the way
AgentLoopWorker does, and the overrides carry the turnpool section, the data files and the
failure-aware advantage estimator."""

from __future__ import annotations

from pathlib import Path

import hydra
from click.testing import CliRunner
from omegaconf import OmegaConf
from transformers import AutoTokenizer
from verl.experimental.agent_loop.agent_loop import DictConfigWrap
from verl.trainer.ppo.core_algos import get_adv_estimator_fn
from verl.utils.dataset.rl_dataset import RLHFDataset

from turnpool.cli import main
from turnpool.integrations.verl import TurnpoolAgentLoop, loop_options


def test_verl_config_writes_what_verl_reads(tiny_model_dir: Path, tmp_path: Path) -> None:
    out = tmp_path / "verl"
    res = CliRunner().invoke(main, ["verl-config", "--env", "sokoban", "--out", str(out),
                                    "--train-groups", "6", "--val-groups", "2", "--seed", "100",
                                    "--env-kwargs", '{"dim_room": [6, 6]}',
                                    "--step-timeout", "5"])
    assert res.exit_code == 0, res.output
    assert "python -m verl.trainer.main_ppo" in res.output

    lines = (out / "overrides.txt").read_text().splitlines()
    # what verl's hydra main does with them: parse, then apply to a config
    from hydra._internal.config_loader_impl import ConfigLoaderImpl
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(lines)
    cfg = OmegaConf.create({"algorithm": {"adv_estimator": "grpo"}, "data": {},
                            "actor_rollout_ref": {"rollout": {"agent": {}}}})
    OmegaConf.set_struct(cfg, False)
    ConfigLoaderImpl._apply_overrides_to_config(parsed, cfg)
    assert cfg.algorithm.adv_estimator == "turnpool_grpo"
    get_adv_estimator_fn(cfg.algorithm.adv_estimator)  # registered by the integration
    agent = cfg.actor_rollout_ref.rollout.agent
    assert agent.default_agent_loop == "turnpool"

    tok = AutoTokenizer.from_pretrained(tiny_model_dir)
    data_cfg = OmegaConf.create({"prompt_key": "prompt", "max_prompt_length": 512,
                                 "filter_overlong_prompts": False})
    seeds = {}
    for split in ("train", "val"):
        ds = RLHFDataset(data_files=[str(out / f"{split}.parquet")], tokenizer=tok,
                         config=data_cfg)
        seeds[split] = [int(ds[i]["extra_info"]["seed"]) for i in range(len(ds))]
        assert all(ds[i]["agent_name"] == "turnpool" for i in range(len(ds)))
    assert seeds == {"train": list(range(100, 106)), "val": [106, 107]}

    # AgentLoopWorker: OmegaConf.load the YAML, register by name, hydra-instantiate
    [entry] = OmegaConf.load(agent.agent_loop_config_path)
    assert entry.name == "turnpool"
    trainer_cfg = OmegaConf.create({"actor_rollout_ref": {"rollout": {
        "prompt_length": 512, "response_length": 256}}, "data": {},
        "turnpool": cfg.turnpool})
    loop = hydra.utils.instantiate(entry, trainer_config=DictConfigWrap(trainer_cfg),
                                   server_manager=None, tokenizer=tok, processor=None,
                                   dataset_cls=RLHFDataset,
                                   data_config=DictConfigWrap(trainer_cfg.data))
    assert isinstance(loop, TurnpoolAgentLoop)
    opts = loop_options(trainer_cfg, {"extra_info": {"seed": 103}})
    assert opts["env_type"] == "sokoban" and opts["seed"] == 103
    assert opts["env_kwargs"] == {"dim_room": [6, 6]} and opts["retries"] == 1
    assert opts["pool"]["step_timeout"] == 5.0


def test_verl_config_refuses_bad_input(tmp_path: Path) -> None:
    runner = CliRunner()
    bad_env = runner.invoke(main, ["verl-config", "--env", "no_such_env", "--out",
                                   str(tmp_path / "a")])
    assert bad_env.exit_code == 2 and "no_such_env" in bad_env.output
    bad_json = runner.invoke(main, ["verl-config", "--env", "bandit", "--out",
                                    str(tmp_path / "b"), "--env-kwargs", "{oops"])
    assert bad_json.exit_code == 2 and "JSON" in bad_json.output
    assert not (tmp_path / "a").exists() and not (tmp_path / "b").exists()
