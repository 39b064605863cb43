"""Config loading: RAGEN's keys as they are, turnpool's keys, errors that name key and file."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf
from omegaconf.errors import InterpolationResolutionError

from turnpool.ragen.config import (
    ConfigError,
    ConfigWarning,
    load_config,
    pool_options,
    rollout_plan,
)

pytestmark = pytest.mark.timeout(60)

# The layout of a RAGEN training config (config/base.yaml with its Hydra defaults): every key
# RAGEN places in the sections turnpool owns, plus unowned sections whose interpolations point
# into verl's ppo_trainer.yaml, which is not there.
RAGEN_BASE = """
defaults:
  - ppo_trainer
  - envs

system:
  CUDA_VISIBLE_DEVICES: "0"
seed:
  train: 10000
  val: 123
micro_batch_size_per_gpu: 1
ppo_mini_batch_size: 32
model_path: Qwen/Qwen2.5-0.5B-Instruct
enable_response_mask: True
lora:
  rank: 0
actor_rollout_ref:
  model:
    path: ${model_path}
    lora_rank: ${lora.rank}
  actor:
    ppo_mini_batch_size: ${ppo_mini_batch_size}
  rollout:
    response_length: 400
    rollout_filter_ratio: 0.25
critic:
  model:
    path: ${model_path}
data:
  train_batch_size: null
algorithm:
  gamma: 1.0
  adv_estimator: gae
  kl_ctrl:
    type: fixed
trainer:
  project_name: ragen_latest
  logger: [ 'console', 'wandb' ]
agent_proxy:
  max_context_window: -1
  max_turn: 5
  action_sep: "||"
  max_actions_per_turn: 5
  use_turn_scores: False
  enable_think: True
  reward_normalization:
    grouping: "state"
    method: "identity"
es_manager:
  format_penalty: -0.1
  train:
    env_groups: 8
    group_size: 16
    env_configs:
      tags: ["SimpleSokoban"]
      n_groups: [8]
  val:
    env_groups: 256
    group_size: 1
    env_configs:
      tags: ["SimpleSokoban"]
      n_groups: [256]
ctx_manager:
  generation:
    gen_config:
      response_length: ${actor_rollout_ref.rollout.response_length}
      top_p: ${actor_rollout_ref.rollout.top_p}
      top_k: ${actor_rollout_ref.rollout.top_k}
"""

RAGEN_ENVS = """
custom_envs:
  SimpleSokoban:
    env_type: sokoban
    max_actions_per_traj: 10
    env_instruction: "Solve the Sokoban puzzle."
    max_tokens: 100
    env_config:
      dim_x: 6
      dim_y: 6
      num_boxes: 1
      max_steps: 100
  SokobanDifferentGridVocab:
    env_type: sokoban
    max_actions_per_traj: 10
    env_instruction: "Solve the Sokoban puzzle."
    max_tokens: 100
    env_config:
      search_depth: 30
      grid_lookup: {0: "W", 1: ".", 2: "G", 3: "C", 4: "B", 5: "A", 6: "@"}
      grid_vocab: {"W": "wall", ".": "empty", "G": "target", "C": "box on target",
                   "B": "box", "A": "player", "@": "player on target"}
  VisualSimpleSokoban:
    env_type: sokoban
    max_actions_per_traj: 10
    env_instruction: "Solve the Sokoban puzzle."
    max_tokens: 100
    env_config:
      render_mode: "rgb_array"
  Countdown:
    env_type: countdown
    max_actions_per_traj: 1
    env_instruction: "Countdown."
    max_tokens: 100
    env_config: null
  Bandit:
    env_type: bandit
    max_actions_per_traj: 1
    env_instruction: ""
    max_tokens: 100
    env_config:
      lo_arm_name: "Phoenix"
      hi_arm_name: "Dragon"
  BanditTest:
    env_type: bandit
    max_actions_per_traj: 1
    env_instruction: ""
    max_tokens: 100
    env_config:
      lo_arm_name: "Trader"
      hi_arm_name: "Librarian"
  FrozenLake:
    env_type: frozen_lake
    max_actions_per_traj: 10
    env_instruction: "FrozenLake."
    max_tokens: 100
    env_config: null
  WebShop:
    env_type: webshop
    max_actions_per_traj: 9
    max_tokens: 200
    env_config:
      dataset: small
"""

RAGEN_BANDIT = """
defaults:
  - base
actor_rollout_ref:
  rollout:
    response_length: 500
trainer:
  experiment_name: bandit-base
agent_proxy:
  max_turn: 1
  max_actions_per_turn: 1
es_manager:
  train:
    env_configs:
      tags: ["Bandit"]
  val:
    env_groups: 512
    env_configs:
      tags: ["Bandit", "BanditTest"]
      n_groups: [256, 256]
"""


@pytest.fixture()
def ragen_dir(tmp_path: Path) -> Path:
    (tmp_path / "base.yaml").write_text(RAGEN_BASE)
    (tmp_path / "envs.yaml").write_text(RAGEN_ENVS)
    (tmp_path / "_1_bandit.yaml").write_text(RAGEN_BANDIT)
    return tmp_path


def test_packaged_defaults_are_ragens() -> None:
    cfg = load_config()
    plan = rollout_plan(cfg)
    assert (plan.num_groups, plan.group_size) == (8, 16)
    assert [(t.tag, t.env_type, t.n_groups, t.max_actions_per_traj) for t in plan.tags] == [
        ("SimpleSokoban", "sokoban", 8, 10)]
    assert plan.tags[0].env_kwargs == {"dim_x": 6, "dim_y": 6, "num_boxes": 1, "max_steps": 100}
    assert plan.collector.max_turn == 5 and plan.collector.seed_base == 10000
    t = plan.collector.turn
    assert (t.action_sep, t.max_actions_per_turn, t.enable_think, t.max_context_window,
            t.format_penalty) == ("||", 5, True, -1, -0.1)
    c = plan.collector
    assert (c.grouping, c.method, c.filter_groups) == ("state", "identity", False)
    assert plan.policy == {"name": "oracle", "epsilon": 0.1, "seed": 0}
    val = rollout_plan(cfg, "val")
    assert (val.num_groups, val.group_size, val.collector.seed_base) == (256, 1, 123)
    tags = set(cfg.custom_envs)
    assert {"SimpleSokoban", "LargerSokoban", "SokobanDifferentGridVocab", "FrozenLake",
            "Bandit", "BanditTest", "Countdown", "MetamathQA", "WebShop"} <= tags


def test_full_ragen_config_loads_and_unowned_sections_stay_unresolved(
        ragen_dir: Path) -> None:
    with pytest.warns(ConfigWarning, match="turnpool.ragen_version=v1"):
        cfg = load_config(ragen_dir / "base.yaml")  # RAGEN v1's shape, unpinned
    plan = rollout_plan(cfg)
    assert plan.tags[0].env_instruction == "Solve the Sokoban puzzle."
    assert plan.tags[0].max_tokens == 100
    assert "VisualSimpleSokoban" in cfg.custom_envs
    gen = OmegaConf.to_container(cfg.ctx_manager, resolve=False)
    assert gen["generation"]["gen_config"]["top_p"] == "${actor_rollout_ref.rollout.top_p}"
    assert cfg.trainer.logger == ["console", "wandb"]
    with pytest.raises(InterpolationResolutionError):
        OmegaConf.to_container(cfg.ctx_manager, resolve=True)  # verl's keys are not there
    assert "defaults" not in cfg
    # a per-task file on top of base (RAGEN's _1_bandit.yaml)
    with pytest.warns(ConfigWarning, match="taken as RAGEN v1's"):
        bandit = load_config(ragen_dir / "_1_bandit.yaml")
    p = rollout_plan(bandit)
    assert [t.tag for t in p.tags] == ["Bandit"] and p.collector.max_turn == 1
    assert p.collector.turn.max_actions_per_turn == 1
    v = rollout_plan(bandit, "val")
    assert [(t.tag, t.n_groups) for t in v.tags] == [("Bandit", 256), ("BanditTest", 256)]
    # RAGEN v1's training config (no v2 key): v1's Bandit, its arms as named
    assert bandit.turnpool.ragen_version == "v1"
    assert v.tags[0].env_kwargs == {"lo_arm_name": "Phoenix", "hi_arm_name": "Dragon"}


def test_config_object_from_hydra_is_accepted(ragen_dir: Path) -> None:
    raw = OmegaConf.load(ragen_dir / "base.yaml")
    OmegaConf.set_struct(raw, True)
    OmegaConf.set_readonly(raw, True)
    cfg = load_config(raw)
    assert rollout_plan(cfg).num_groups == 8


def test_unknown_ragen_keys_warn_naming_key_and_file(tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    cases = [("es_manager:\n  format_penalty: -0.2\n  use_multiprocesing: true\n",
              "es_manager.use_multiprocesing"),
             ("custom_envs:\n  Mine:\n    env_type: sokoban\n    max_action_per_traj: 3\n",
              "custom_envs.Mine.max_action_per_traj"),
             ("algorithm:\n  filter_groups:\n    enabled: true\n",
              "algorithm.filter_groups.enabled"),
             ("agent_proxy:\n  my_fork_knob: 3\n", "agent_proxy.my_fork_knob"),
             ("seed:\n  test: 5\n", "seed.test")]
    for text, key in cases:
        f.write_text(text)
        with pytest.warns(ConfigWarning) as caught:
            load_config(f)  # RAGEN ignores keys it does not read: so do we, loudly
        msgs = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
        assert len(msgs) == 1 and key in msgs[0] and str(f) in msgs[0], msgs
        # opt-in strict mode: the same key fails, three ways to ask for it
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(f, strict=True)
        with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
            load_config(f, overrides=["turnpool.strict_config=true"])
    f.write_text("es_manager:\n  use_multiprocesing: true\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("TURNPOOL_STRICT_CONFIG", "1")
        with pytest.raises(ConfigError, match="did you mean es_manager.use_multiprocessing"):
            load_config(f)


def test_unknown_turnpool_and_top_level_keys_fail_naming_the_intended_key(
        tmp_path: Path) -> None:
    f = tmp_path / "mine.yaml"
    f.write_text("turnpool:\n  backnd: thread\n")
    with pytest.raises(ConfigError, match=r"turnpool\.backnd.*did you mean turnpool\.backend"):
        load_config(f)
    # a turnpool key without its prefix, as a command line would give it
    with pytest.raises(ValueError, match=r"'backend' \(in command-line overrides\); did you "
                                         r"mean turnpool\.backend\?"):
        load_config(overrides=["backend=process"])
    with pytest.raises(ConfigError, match=r"'es_manger'.*did you mean es_manager\?"):
        load_config(overrides=["es_manger.format_penalty=-0.2"])
    f.write_text("new_section: {a: 1}\n")
    with pytest.raises(ConfigError, match=r"'new_section' \(in " + re.escape(str(f))):
        load_config(f)
    # sections RAGEN and verl define are someone else's: kept, not checked
    f.write_text("trainer:\n  whatever: 1\nalgorithm:\n  gamma: 0.9\nlora: {rank: 8}\n")
    cfg = load_config(f)
    assert cfg.trainer.whatever == 1 and cfg.algorithm.gamma == 0.9


@pytest.mark.parametrize("line, key", [
    ("agent_proxy:\n  max_turn: five\n", "agent_proxy.max_turn"),
    ("agent_proxy:\n  enable_think: 1\n", "agent_proxy.enable_think"),
    ("es_manager:\n  format_penalty: low\n", "es_manager.format_penalty"),
    ("es_manager:\n  train:\n    env_configs:\n      tags: SimpleSokoban\n",
     "es_manager.train.env_configs.tags"),
    ("agent_proxy:\n  reward_normalization:\n    method: zscore\n",
     "agent_proxy.reward_normalization.method"),
    ("custom_envs:\n  SimpleSokoban:\n    env_config: 3\n", "custom_envs.SimpleSokoban.env_config"),
    ("seed:\n  train: 1.5\n", "seed.train"),
    ("turnpool:\n  collector:\n    on_budget_exhausted: retry\n",
     "turnpool.collector.on_budget_exhausted"),
    ("turnpool:\n  collector:\n    mode: asynch\n", "turnpool.collector"),
])
def test_ill_typed_key_names_key_and_file(tmp_path: Path, line: str, key: str) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(line)
    with pytest.raises(ConfigError) as err:
        load_config(f)
    assert key in str(err.value) and str(f) in str(err.value)


def test_overrides_and_their_errors() -> None:
    cfg = load_config(overrides=["agent_proxy.max_turn=7", "es_manager.train.group_size=4",
                                 "+turnpool.policy.name=random"])
    plan = rollout_plan(cfg)
    assert plan.collector.max_turn == 7 and plan.group_size == 4
    # switching the policy kind brings that kind's options, not the old kind's
    assert plan.policy == {"name": "random", "invalid_rate": 0.1, "seed": 0}
    with pytest.warns(ConfigWarning, match="command-line overrides"):
        load_config(overrides=["agent_proxy.max_turns=7"])
    with pytest.raises(ConfigError, match="key=value"):
        load_config(overrides=["agent_proxy.max_turn"])


def test_cross_key_checks_name_where_keys_came_from(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(overrides=["es_manager.train.env_groups=3"])
    msg = str(err.value)
    assert "n_groups" in msg and "command-line overrides" in msg and "base.yaml" in msg
    with pytest.raises(ConfigError, match="not under custom_envs"):
        load_config(overrides=["es_manager.train.env_configs.tags=[Nope]"])
    with pytest.raises(ConfigError, match="2 tags but 1 n_groups"):
        load_config(overrides=["es_manager.train.env_configs.tags=[Bandit,FrozenLake]"])
    # n_groups left out: env_groups is split over the tags (RAGEN documents this)
    cfg = load_config(overrides=["es_manager.train.env_configs.tags=[Bandit,FrozenLake,Countdown]",
                                 "es_manager.train.env_configs.n_groups=null"])
    assert [t.n_groups for t in rollout_plan(cfg).tags] == [3, 3, 2]
    f = tmp_path / "fg.yaml"
    f.write_text("algorithm:\n  filter_groups:\n    enable: true\n    max_num_gen_batches: 0\n")
    with pytest.raises(ConfigError, match="max_num_gen_batches"):
        rollout_plan(load_config(f))


def test_interpolations_inside_owned_sections(tmp_path: Path) -> None:
    f = tmp_path / "i.yaml"
    f.write_text("actor_rollout_ref:\n  rollout:\n    response_length: 256\n"
                 "custom_envs:\n  Bandit:\n    max_tokens: ${actor_rollout_ref.rollout."
                 "response_length}\n")
    plan = rollout_plan(load_config(f, ["es_manager.train.env_configs.tags=[Bandit]"]))
    assert plan.tags[0].max_tokens == 256
    f.write_text("custom_envs:\n  Bandit:\n    max_tokens: ${actor_rollout_ref.nothing}\n")
    with pytest.raises(ConfigError, match=r"custom_envs") as err:
        load_config(f)
    assert str(f) in str(err.value)


def test_ragen_parallel_switches_map_to_backends() -> None:
    def backend(*ov: str) -> tuple[str, int | None, dict[str, object]]:
        ps = pool_options(load_config(overrides=list(ov)))
        backend_only = {k: v for k, v in ps.items() if k in ("max_workers", "sequential_env_types")}
        return ps["backend"], ps.get("num_workers"), backend_only

    assert backend() == ("auto", None, {})
    assert backend("es_manager.use_multiprocessing=true", "es_manager.max_workers=2",
                   "es_manager.sequential_env_types=[webshop]") == (
        "process_pool", None, {"max_workers": 2, "sequential_env_types": ["webshop"]})
    assert backend("agent_proxy.use_parallel_rollout=true", "agent_proxy.parallel_n_jobs=3"
                   ) == ("joblib", 3, {})
    assert backend("use_parallel_envs=false") == ("sequential", None, {})
    assert backend("turnpool.backend=thread", "es_manager.use_multiprocessing=true")[0] == "thread"


def test_shipped_user_configs_load() -> None:
    root = Path(__file__).resolve().parents[2] / "configs"
    # serve.yaml holds `turnpool serve`'s settings, not a rollout config (tests/cli reads it)
    files = sorted(f for f in root.glob("*.yaml") if f.stem != "serve")
    assert {f.stem for f in files} >= {"sokoban", "frozen_lake", "bandit", "countdown",
                                       "metamathqa", "webshop", "multi"}
    for f in files:
        cfg = load_config(f)
        for mode in ("train", "val"):
            assert rollout_plan(cfg, mode).tags
    multi = rollout_plan(load_config(root / "multi.yaml"))
    assert len({t.env_type for t in multi.tags}) >= 3


def test_a_config_composed_over_newer_verls_ppo_trainer_loads_without_a_warning() -> None:
    """RAGEN's base.yaml lists verl's ``ppo_trainer`` in its defaults, so RAGEN's own loop
    hands the manager whatever sections the installed verl defines (verl 0.9: these)."""
    import warnings

    composed = OmegaConf.create({
        "model_engine": "dp", "distillation": {"enabled": False}, "sandbox_fusion": None,
        "skip": {"enable": False}, "algorithm": {"filter_groups": {
            "_target_": "verl.trainer.config.FilterGroupsConfig", "enable": False,
            "metric": "reward", "max_num_gen_batches": 0, "max_inflight_gen_batches": 1}},
        "actor_rollout_ref": {}, "ctx_manager": {}})
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigWarning)
        cfg = load_config(composed, ["turnpool.ragen_version=v1"])
    assert cfg.model_engine == "dp"
