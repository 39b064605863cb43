"""What ``turnpool rollout``'s options choose, checked before any env starts: the env
(``--env``), the batch's size (``--groups``, ``--group-size``), the backend, workers and
policy shorthands, and whether the policy can play the chosen envs.

    >>> choice_overrides(env="sudoku", groups=2, group_size=3, mode="train")
    ... # doctest: +NORMALIZE_WHITESPACE
    ('custom_envs.sudoku.env_type=sudoku', 'es_manager.train.env_configs.tags=[sudoku]',
     'es_manager.train.env_configs.n_groups=null', 'es_manager.train.env_groups=2',
     'es_manager.train.group_size=3')
"""

from __future__ import annotations

from typing import Any

from turnpool.cli.errors import EXIT_USAGE, UserError, unknown_env
from turnpool.rollout.settings import RolloutPlan

#: policy -> (the option it cannot do without, an example value)
REQUIRED_POLICY_OPTIONS = {"openai": ("base_url", "http://127.0.0.1:8000/v1"),
                           "hf": ("model_path", "path/to/model")}


def load_plan(config_path: str | None, mode: str, overrides: tuple[str, ...],
              env: str | None = None, user_overrides: tuple[str, ...] = ()) -> RolloutPlan:
    """The run's plan from the config and every override, checked before any env starts;
    one `UserError` line (exit 2) for what is wrong (``env``: the ``--env`` given, checked
    against the config with the user's own ``user_overrides``)."""
    from turnpool.ragen.config import ConfigError, load_config, rollout_plan

    try:
        check_env(env, config_path, user_overrides)
        cfg = load_config(config_path, overrides)
        check_env_types(cfg, mode)
        plan = rollout_plan(cfg, mode)
        check_policy(plan)
    except ConfigError as exc:
        raise UserError(str(exc), EXIT_USAGE) from exc
    return plan


def choice_overrides(env: str | None, groups: int | None, group_size: int | None,
                     mode: str) -> tuple[str, ...]:
    """The dotlist entries ``--env``, ``--groups`` and ``--group-size`` stand for.

    ``--env NAME`` runs a registered env with its own defaults (a tag of its name whose
    ``env_type`` is NAME), or a tag of the config (``custom_envs``) when NAME is not an env.
    ``--groups`` sets ``env_groups`` and lets them split equally over the tags.
    """
    out: list[str] = []
    section = f"es_manager.{mode}"
    if env is not None:
        if unknown_env(env) is None:
            out.append(f"custom_envs.{env}.env_type={env}")
        out += [f"{section}.env_configs.tags=[{env}]", f"{section}.env_configs.n_groups=null"]
    if groups is not None:
        out += [f"{section}.env_configs.n_groups=null", f"{section}.env_groups={groups}"]
    if group_size is not None:
        out.append(f"{section}.group_size={group_size}")
    return tuple(dict.fromkeys(out))


def sugar_overrides(backend: str | None, workers: int | None, policy: str | None
                    ) -> tuple[str, ...]:
    """The dotlist entries the shorthand options stand for (they win over earlier ones)."""
    out = []
    if backend is not None:
        out.append(f"turnpool.backend={backend}")
    if workers is not None:
        out.append(f"turnpool.num_workers={workers}")
    if policy is not None:
        out.append(f"turnpool.policy.name={policy}")
    return tuple(out)


def check_env(env: str | None, config_path: str | None, overrides: tuple[str, ...]) -> None:
    """An ``--env`` that is neither a registered env nor a tag of the config is a usage
    error naming the envs there are."""
    if env is None or unknown_env(env) is None:
        return
    from turnpool.ragen.config import load_config

    if env not in (load_config(config_path, overrides).get("custom_envs") or {}):
        raise UserError(f"--env: {unknown_env(env)}, and no tag of the config is named so",
                        EXIT_USAGE)


def check_env_types(cfg: Any, mode: str) -> None:
    """An unknown ``env_type`` of a tag the run uses is a usage error naming the tag."""
    custom = cfg.get("custom_envs") or {}
    section = (cfg.get("es_manager") or {}).get(mode) or {}
    tags = (section.get("env_configs") or {}).get("tags") or []
    for tag in dict.fromkeys(str(t) for t in tags):
        env_type = (custom.get(tag) or {}).get("env_type")
        if env_type is None:
            continue
        problem = unknown_env(str(env_type))
        if problem:
            raise UserError(f"custom_envs.{tag}.env_type: {problem}", EXIT_USAGE)


def check_policy(plan: RolloutPlan) -> None:
    """A policy that cannot play the run is one line saying what to do: a missing option it
    cannot run without, or the ``oracle`` (the default) for an env that declares none."""
    policy = plan.policy
    name = str(policy.get("name"))
    if name == "oracle":
        _check_oracles(plan)
    if name not in REQUIRED_POLICY_OPTIONS:
        return
    key, example = REQUIRED_POLICY_OPTIONS[name]
    section = policy.get(name) or {}
    if not policy.get(key) and not section.get(key):
        raise UserError(f"the {name} policy needs turnpool.policy.{name}.{key} (e.g. "
                        f"turnpool.policy.{name}.{key}={example})", EXIT_USAGE)


def _check_oracles(plan: RolloutPlan) -> None:
    from turnpool.envs.registry import oracle_for

    for tag in plan.tags:
        try:
            oracle_for(tag.env_type)
        except LookupError:
            raise UserError(
                f"env {tag.env_type!r} (tag {tag.tag}) has no oracle, the default policy; "
                "play it with --policy random, or a model: --policy openai or --policy hf",
                EXIT_USAGE) from None
        except Exception:  # noqa: BLE001 - an env that cannot import says so when it is built
            continue
