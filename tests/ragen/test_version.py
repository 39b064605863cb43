"""The RAGEN version a config gets is the one its user runs: RAGEN v1's training config
unpinned is v1 (by the installed RAGEN where there is one, else by its shape, with one warning
naming the pin); v2's are v2; turnpool's own configs keep turnpool's default, v2, silently;
and `load_config` and `turnpool.make` share that default."""

from __future__ import annotations

import importlib
import sys
import warnings
from pathlib import Path

import pytest

from tests.ragen.test_config import RAGEN_BANDIT, RAGEN_BASE, RAGEN_ENVS
from tests.ragen.test_golden_manager_v2 import write_v2_configs
from turnpool.envs.registry import make
from turnpool.ragen.config import ConfigWarning, load_config, rollout_plan
from turnpool.ragen.version import installed_ragen

ROOT = Path(__file__).resolve().parents[2]


def _v1_configs(dest: Path) -> Path:
    (dest / "base.yaml").write_text(RAGEN_BASE)
    (dest / "envs.yaml").write_text(RAGEN_ENVS)
    (dest / "_1_bandit.yaml").write_text(RAGEN_BANDIT)
    return dest / "base.yaml"


@pytest.fixture(autouse=True)
def _no_ragen_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Forget any ``ragen`` an earlier test imported (a stand-in package stays in
    ``sys.modules`` after its test): only what these tests lay out is installed."""
    for name in [m for m in sys.modules if m == "ragen" or m.startswith("ragen.")]:
        monkeypatch.delitem(sys.modules, name)


def _fake_ragen(site: Path, version: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``ragen`` package laid out as that RAGEN installs it (v2 adds env packages)."""
    env = site / "ragen" / "env"
    (env / "sokoban").mkdir(parents=True)
    if version == "v2":
        (env / "sudoku").mkdir()
    for pkg in (site / "ragen", env):
        (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(site))
    importlib.invalidate_caches()


def _load_quietly(path: Path | None, overrides: list[str] | None = None) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of any kind
        return str(load_config(path, overrides or []).turnpool.ragen_version)


def test_ragen_v1s_own_config_unpinned_is_v1_with_one_warning_naming_the_pin(
        tmp_path: Path) -> None:
    base = _v1_configs(tmp_path)
    assert installed_ragen() is None
    with pytest.warns(ConfigWarning) as caught:
        cfg = load_config(base)
    assert cfg.turnpool.ragen_version == "v1"
    assert len(caught) == 1
    assert "turnpool.ragen_version=v1" in str(caught[0].message)
    plan = rollout_plan(cfg)
    assert plan.collector.turn.ragen_version == "v1"
    assert plan.collector.turn.max_actions_per_turn == 5  # v1's base.yaml, not v2's 2
    assert _load_quietly(base, ["turnpool.ragen_version=v2"]) == "v2"  # a pin: no warning


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_a_ragen_training_config_gets_the_installed_ragens_version_silently(
        version: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ragen(tmp_path / "site", version, monkeypatch)
    assert installed_ragen() == version
    assert _load_quietly(_v1_configs(tmp_path)) == version


def test_turnpools_own_configs_keep_v2_whatever_ragen_is_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ragen(tmp_path / "site", "v1", monkeypatch)
    assert _load_quietly(ROOT / "configs" / "frozen_lake.yaml") == "v2"
    assert _load_quietly(None) == "v2"


def test_every_ragen_v2_config_stays_v2_with_v1_installed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_ragen(tmp_path / "site", "v1", monkeypatch)
    for name in write_v2_configs(tmp_path):
        if name != "envs.yaml":  # custom_envs alone: not a training config
            assert _load_quietly(tmp_path / name) == "v2", name


def test_load_config_and_make_share_one_default_frozen_lake(tmp_path: Path) -> None:
    """RAGEN v2's FrozenLake env_config through `turnpool.make` and through a config give
    the same env: v2's (p 0.9, success_rate 0.8) in both."""
    cfg = load_config({"es_manager": {"train": {"env_groups": 1, "group_size": 1,
                                                "env_configs": {"tags": ["FrozenLake"],
                                                                "n_groups": [1]}}}})
    assert cfg.turnpool.ragen_version == "v2"
    tag = rollout_plan(cfg).tags[0]
    via_config = make(tag.env_type, **tag.env_kwargs)
    via_make = make("frozen_lake", success_rate=0.8)  # v2's envs.yaml env_config
    for env in (via_config, via_make):
        assert (env.p, env.success_rate) == (0.9, 0.8)
    for seed in range(50):
        assert via_config.reset(seed=seed) == via_make.reset(seed=seed)
