"""``turnpool verl-config``: everything verl needs to train on a turnpool env, in one folder.

    turnpool verl-config --env sokoban --out verl_sokoban --train-groups 256 --val-groups 32

writes into ``--out``:

* ``agent_loop.yaml``: verl's agent-loop list with the ``turnpool`` loop
  (``actor_rollout_ref.rollout.agent.agent_loop_config_path`` points at it);
* ``train.parquet`` / ``val.parquet``: one row per GRPO group. verl repeats each row
  ``actor_rollout_ref.rollout.n`` times under one ``uid``, and the row's ``extra_info.seed``
  is the env seed every member starts from, so a group is one start state; train and val seeds
  never overlap. The ``prompt`` column is a short stand-in (verl's dataset needs one; the
  model sees the env's own prompt);
* ``overrides.txt``: the Hydra overrides for ``python -m verl.trainer.main_ppo``: the data
  files, async rollout with the agent-loop file and ``default_agent_loop=turnpool``, the
  ``turnpool:`` section (env, turns, pool with ``step_timeout``, replay ``retries``) and
  ``algorithm.adv_estimator=turnpool_grpo``, the GRPO estimator that leaves failed envs out
  of their group's statistics (`turnpool.integrations.verl_advantage`).

Add the model, batch sizes and hardware settings of your run to the printed command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

from turnpool.backends import BACKENDS
from turnpool.cli.errors import EXIT_USAGE, UserError, unknown_env
from turnpool.extras import require
from turnpool.worker.defaults import DEFAULT_STEP_TIMEOUT

AGENT_LOOP_YAML = """\
# turnpool's verl agent loop (see turnpool.integrations.verl)
- name: turnpool
  _target_: turnpool.integrations.verl.TurnpoolAgentLoop
"""


def group_rows(env_type: str, n_groups: int, first_seed: int, split: str
               ) -> list[dict[str, Any]]:
    """One verl dataset row per GRPO group; the row's seed is the group's start state."""
    rows = []
    for k in range(n_groups):
        seed = first_seed + k
        rows.append({
            "data_source": f"turnpool/{env_type}",
            "prompt": [{"role": "user", "content": f"turnpool {env_type} episode, seed {seed}"}],
            "agent_name": "turnpool",
            "ability": "agent",
            "reward_model": {"style": "rule", "ground_truth": ""},
            "extra_info": {"seed": seed, "index": k, "split": split},
        })
    return rows


def overrides(out: Path, section: dict[str, Any]) -> list[str]:
    """The Hydra overrides that wire verl to the files in ``out`` and the ``turnpool`` section."""
    lines = [
        f"data.train_files={out / 'train.parquet'}",
        f"data.val_files={out / 'val.parquet'}",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={out / 'agent_loop.yaml'}",
        "actor_rollout_ref.rollout.agent.default_agent_loop=turnpool",
        "algorithm.adv_estimator=turnpool_grpo",
    ]
    # '+' adds keys verl's schema does not know; one override per leaf
    lines += [f"+turnpool.{key}={value}" for key, value in _leaves(section)]
    return lines


def _leaves(tree: dict[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """Dotted keys and Hydra literals of a nested dict's leaves (lists as ``[a,b]``)."""
    out: list[tuple[str, str]] = []
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out += _leaves(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", _literal(value)))
    return out


def _literal(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_literal(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{}"
    if value is None:
        return "null"
    if isinstance(value, str):
        return json.dumps(value) if not value.replace("_", "").isalnum() else value
    return str(value)


@click.command("verl-config")
@click.option("--env", "env_type", required=True, help="A registered env (turnpool envs).")
@click.option("--env-kwargs", default="{}", help="The env's keyword arguments, as JSON.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path),
              required=True, help="Folder to write (created).")
@click.option("--train-groups", type=int, default=256, show_default=True,
              help="Training rows = GRPO groups (one env seed each).")
@click.option("--val-groups", type=int, default=32, show_default=True,
              help="Validation rows.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="First training seed; validation seeds follow the training ones.")
@click.option("--max-turn", type=int, default=5, show_default=True,
              help="Turns per episode (the agent loop's max_turn).")
@click.option("--backend", type=click.Choice(list(BACKENDS)), default="process",
              show_default=True,
              help="turnpool pool backend in each agent-loop worker.")
@click.option("--workers", type=int, default=4, show_default=True,
              help="Env workers per agent-loop worker.")
@click.option("--step-timeout", type=float, default=DEFAULT_STEP_TIMEOUT, show_default=True,
              help="Seconds an env call may take before the env counts as failed.")
@click.option("--retries", type=int, default=1, show_default=True,
              help="Replays of a failed episode from its seed before it is marked failed.")
def verl_config(env_type: str, env_kwargs: str, out_dir: Path, train_groups: int,
                val_groups: int, seed: int, max_turn: int, backend: str, workers: int,
                step_timeout: float, retries: int) -> None:
    """Write verl's agent-loop YAML, group-seeded data rows and the overrides for turnpool."""
    try:
        kwargs = json.loads(env_kwargs)
    except json.JSONDecodeError as e:
        raise click.BadParameter(f"not JSON: {e}", param_hint="--env-kwargs") from e
    if not isinstance(kwargs, dict):
        raise click.BadParameter("must be a JSON object", param_hint="--env-kwargs")
    problem = unknown_env(env_type)
    if problem:
        raise UserError(f"--env: {problem}", EXIT_USAGE)
    if train_groups < 1 or val_groups < 0:
        raise click.BadParameter("need at least one training group")
    pa = require("pyarrow", feature="turnpool verl-config", extra="data")
    pq = require("pyarrow.parquet", feature="turnpool verl-config", extra="data")
    out = out_dir.resolve()
    out.mkdir(parents=True, exist_ok=True)
    (out / "agent_loop.yaml").write_text(AGENT_LOOP_YAML)
    splits = {"train": group_rows(env_type, train_groups, seed, "train"),
              "val": group_rows(env_type, val_groups, seed + train_groups, "val")}
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")
    section = {"env_type": env_type, "env_kwargs": kwargs, "max_turn": max_turn,
               "retries": retries, "capacity": 256,
               "pool": {"backend": backend, "num_workers": workers,
                        "step_timeout": step_timeout}}
    lines = overrides(out, section)
    (out / "overrides.txt").write_text("\n".join(lines) + "\n")
    click.echo(f"wrote {out}/agent_loop.yaml, train.parquet ({train_groups} groups), "
               f"val.parquet ({val_groups} groups), overrides.txt")
    click.echo("run (add your model, batch sizes and actor_rollout_ref.rollout.n = group size):")
    click.echo("  python -m verl.trainer.main_ppo \\")
    click.echo(" \\\n".join(f"    '{line}'" for line in lines))
