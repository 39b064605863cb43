"""Every settings type of a rollout, in one place, as plain frozen dataclasses.

A rollout is shaped by four things: what a tag is (`TagSpec`), what a turn accepts
(`TurnSettings`), how the async driver batches (`AsyncSettings`) and how the collector samples
and scores (`CollectorSettings`, which holds the other two). `RolloutPlan` composes them with
the pool layout and the policy options; the config loader (`turnpool.ragen.config`) builds one
from YAML and `TrajectoryCollector.from_plan` runs it.

This module imports nothing else from turnpool, so any layer may read it. Pool options are a
plain mapping handed to `turnpool.pool.EnvPool` as keyword arguments: each pool default lives
once, in EnvPool's signature, and a key the user did not set is simply absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

#: RAGEN's fallback for ``max_tokens`` (``actor_rollout_ref.rollout.response_length``).
DEFAULT_MAX_TOKENS = 400


@dataclass(frozen=True)
class TagSpec:
    """One RAGEN tag (``custom_envs.<tag>``): env type, group count, prompt texts, budget."""

    tag: str
    env_type: str
    n_groups: int = 1
    env_kwargs: dict[str, Any] = field(default_factory=dict)
    max_actions_per_traj: int = 10
    env_instruction: str | None = None
    max_tokens: int = DEFAULT_MAX_TOKENS
    grid_vocab: dict[str, str] | None = None
    action_lookup: dict[int, str] | None = None
    #: per-env kwargs over ``env_kwargs``, one per env of the tag (`EnvGroupSpec.member_kwargs`)
    member_kwargs: tuple[dict[str, Any], ...] = ()


@dataclass(frozen=True)
class TurnSettings:
    """``agent_proxy`` and ``es_manager`` keys that shape a turn."""

    action_sep: str = "||"
    max_actions_per_turn: int = 5
    enable_think: bool = True
    max_context_window: int = -1
    format_penalty: float = -0.1
    #: whose prompt layout and manager contract: "v1" (RAGEN-AI/RAGEN 5eb79b8: the env
    #: instruction opens the first user message) or "v2" (mll-lab-nu/RAGEN: it goes into the
    #: system message, and a turn after one with no valid action says so). Configs loaded by
    #: `turnpool.ragen.config` default to v2; this dataclass keeps v1 for code built on it.
    ragen_version: str = "v1"
    #: v2's ``agent_proxy.context_window_mode``: "full" (every turn; v2 then ignores
    #: ``max_context_window``), "limited_multi_turn" (the last ``max_context_window`` turns
    #: as chat turns) or "single_turn" (one user message summarising them). v1 ignores it.
    context_window_mode: str = "full"

    def __post_init__(self) -> None:
        if self.ragen_version not in ("v1", "v2"):
            raise ValueError(f"ragen_version must be 'v1' or 'v2', got {self.ragen_version!r}")
        if self.context_window_mode not in ("full", "limited_multi_turn", "single_turn"):
            raise ValueError(f"unknown context_window_mode {self.context_window_mode!r}")


@dataclass(frozen=True)
class AsyncSettings:
    """Micro-batching of the async driver (``turnpool.collector.*``).

    Args:
        max_batch: most envs per ``generate`` call (None: an eighth of the envs, at least
            one, so several cohorts alternate between the policy and the envs).
        max_wait_s: how long a pending env may wait for its micro-batch to fill.
        policy_workers: ``generate`` calls in flight at once (threads).
        poll_interval_s: while both sides are busy, how often the driver checks the other
            side (the pool's wait cannot be woken by a policy thread).
    """

    max_batch: int | None = None
    max_wait_s: float = 0.0
    policy_workers: int = 8
    poll_interval_s: float = 0.002

    def __post_init__(self) -> None:
        if self.max_batch is not None and self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1 or None, got {self.max_batch}")
        if self.max_wait_s < 0 or self.poll_interval_s <= 0:
            raise ValueError("need max_wait_s >= 0 and poll_interval_s > 0")
        if self.policy_workers < 1:
            raise ValueError(f"policy_workers must be >= 1, got {self.policy_workers}")


#: how the collector plays an episode: "lockstep" (one batched policy call per turn, every
#: active env in step) or "async" (`turnpool.rollout.async_driver`: micro-batches, each env at
#: its own pace)
CollectorMode = Literal["lockstep", "async"]
COLLECTOR_MODES: tuple[str, ...] = get_args(CollectorMode)
#: the collector's drivers, chosen once from the settings (`CollectorSettings.driver`): the two
#: collector modes, and "tree" for a lock-step collector with a tree mode
Driver = Literal["lockstep", "async", "tree"]


def collector_mode(value: object) -> CollectorMode:
    """``value`` as a `CollectorMode`; anything else is a one-line ValueError."""
    for mode in COLLECTOR_MODES:
        if value == mode:
            return mode  # type: ignore[return-value]  # one of the literal's own values
    raise ValueError(f"collector mode must be one of {', '.join(COLLECTOR_MODES)}, got "
                     f"{value!r}")

#: the collector's tree modes (`TreeSettings.mode`)
TREE_MODES = ("none", "best_of_n", "beam", "shared_prefix")
#: the built-in scores of a tree node: the episode's env reward so far, or its last turn's
TREE_SCORES = ("return", "reward")


@dataclass(frozen=True)
class TreeSettings:
    """Tree rollouts (``turnpool.collector.tree.*``, `turnpool.rollout.tree`): a group's
    ``group_n`` members are the branch slots of one tree.

    Args:
        mode: ``"none"`` (independent episodes), ``"best_of_n"`` (every turn, each slot
            continues the group's best state with its own sample; the best is kept),
            ``"beam"`` (the ``width`` best states are kept and share the slots) or
            ``"shared_prefix"`` (member 0 plays ``prefix_turns`` turns alone, then every
            member continues from its state: a GRPO group sharing a prefix).
        width: beam only: states kept per group (1 <= width <= group_n).
        prefix_turns: shared_prefix only: the turns of the shared prefix (k >= 1).
        score: what ranks the candidates: ``"return"`` (env reward summed over the
            episode so far), ``"reward"`` (the last turn's env reward), an import path
            ``"module:function"`` or a callable, given the candidate's
            `turnpool.rollout.episode.EpisodeState` and returning a float. Ties go to the
            lowest member index.
    """

    mode: str = "none"
    width: int = 1
    prefix_turns: int = 1
    score: str | Callable[[Any], float] = "return"

    def __post_init__(self) -> None:
        if self.mode not in TREE_MODES:
            raise ValueError(f"tree mode must be one of {', '.join(TREE_MODES)}, got "
                             f"{self.mode!r}")
        if isinstance(self.width, bool) or not isinstance(self.width, int) or self.width < 1:
            raise ValueError(f"tree width must be an int >= 1, got {self.width!r}")
        if (isinstance(self.prefix_turns, bool) or not isinstance(self.prefix_turns, int)
                or self.prefix_turns < 1):
            raise ValueError(f"tree prefix_turns must be an int >= 1, got "
                             f"{self.prefix_turns!r}")
        if isinstance(self.score, str):
            if self.score not in TREE_SCORES and ":" not in self.score:
                raise ValueError(f"tree score must be {' or '.join(TREE_SCORES)}, a "
                                 f"'module:function' path or a callable, got {self.score!r}")
        elif not callable(self.score):
            raise ValueError(f"tree score must be a string or a callable, got "
                             f"{self.score!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "none"


@dataclass(frozen=True)
class CollectorSettings:
    """How trajectories are collected (``agent_proxy``, ``algorithm.filter_groups``, ...).

    ``seed_base`` and ``mode`` drive the seed schedule (`turnpool.rollout.episode.SeedSchedule`).
    """

    max_turn: int = 5
    turn: TurnSettings = field(default_factory=TurnSettings)
    grouping: str = "state"
    method: str = "identity"
    use_turn_scores: bool = False
    filter_groups: bool = False
    max_num_gen_batches: int = 10
    on_budget_exhausted: str = "raise"
    target_groups: int | None = None
    seed_base: int | None = 10000
    mode: str = "train"
    #: "lockstep" (one batched policy call per turn) or "async" (`turnpool.rollout.async_driver`)
    collector_mode: CollectorMode = "lockstep"
    async_settings: AsyncSettings = field(default_factory=AsyncSettings)
    #: a failed episode whose failure is retryable is played again from the same seed at
    #: most this many times; a group that still holds a failed episode is dropped (a failure
    #: is never scored as reward 0 in a group)
    episode_retries: int = 2
    #: what happens to a group that still holds a failed episode after the retries: "drop"
    #: (left out of the batch, counted) or "keep" (kept with its failed trajectories marked by
    #: ``error`` / ``failure``, for trainers that need one output per prompt and mask failures)
    failed_groups: str = "drop"
    #: token-level policies only: completion tokens one episode may hold (replies plus the
    #: env/template tokens between them, after the first prompt); each reply is capped to
    #: what is left and the episode ends with ``end_reason="token_budget"`` once no reply
    #: fits (TRL's ``max_completion_length``). None: no limit.
    max_episode_tokens: int | None = None
    #: tree rollouts (`TreeSettings`; lock-step collector only)
    tree: TreeSettings = field(default_factory=TreeSettings)

    def __post_init__(self) -> None:
        if self.failed_groups not in ("drop", "keep"):
            raise ValueError(f"failed_groups must be 'drop' or 'keep', got "
                             f"{self.failed_groups!r}")
        if isinstance(self.episode_retries, bool) or not isinstance(self.episode_retries, int):
            raise TypeError(f"episode_retries must be an int, got {self.episode_retries!r}")
        if self.episode_retries < 0:
            raise ValueError(f"episode_retries must be >= 0, got {self.episode_retries}")
        if self.max_turn < 1:
            raise ValueError(f"max_turn must be >= 1, got {self.max_turn}")
        if self.max_episode_tokens is not None and self.max_episode_tokens < 1:
            raise ValueError(f"max_episode_tokens must be >= 1, got {self.max_episode_tokens}")
        collector_mode(self.collector_mode)
        if self.tree.enabled and self.collector_mode != "lockstep":
            raise ValueError(f"tree mode {self.tree.mode!r} needs the lockstep collector "
                             f"(turnpool.collector.mode=lockstep): the async driver plays "
                             f"each env on its own and cannot branch a group's turn")

    @property
    def driver(self) -> Driver:
        """The collector's driver: "tree" when a tree mode is on, else the collector mode."""
        return "tree" if self.tree.enabled else self.collector_mode


@dataclass(frozen=True)
class RolloutPlan:
    """Everything one rollout needs: tags in pool order, group size, collector settings,
    the pool's keyword arguments (None: EnvPool's defaults) and the policy options."""

    tags: list[TagSpec]
    group_size: int
    collector: CollectorSettings = field(default_factory=CollectorSettings)
    pool: Mapping[str, Any] | None = None
    policy: dict[str, Any] = field(default_factory=dict)

    @property
    def num_groups(self) -> int:
        return sum(t.n_groups for t in self.tags)
