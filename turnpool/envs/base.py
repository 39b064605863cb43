"""The text-environment contract every turnpool env follows.

A `TextEnv` mirrors gymnasium's API (``reset(seed=...) -> (obs, info)``, ``step(a) -> (obs,
reward, terminated, truncated, info)``) with text observations. What it adds for multi-turn
LLM RL:

* every env owns a ``numpy.random.Generator`` (``self.np_random``) created from the reset seed,
  so the same seed gives byte-identical episodes in any process, thread or start method (a
  seedless ``reset()`` after a seeded one takes `next_episode_seed` of the last seed);
* ``info`` always carries ``success``, ``action_is_valid``, ``action_is_effective`` and
  ``anchor_obs`` (a state text without counters, for GiGPO step grouping);
* ``get_state`` / ``set_state`` let the pool build a group's initial state once and copy it to
  the other members (the expensive part of Sokoban is room generation).

A `TextEnv` is a ``gymnasium.Env``: it has an ``observation_space`` (`TextSpace`, a
``gymnasium.spaces.Text``), an ``action_space`` (``Discrete`` over the ids of its
``action_lookup``, else `TextSpace`) and, when built by `turnpool.make`, a ``spec``, so
``gymnasium.utils.env_checker.check_env`` and gymnasium wrappers accept it; the built-in envs
are registered with gymnasium as ``turnpool/<Name>-v0`` (`turnpool.envs.gym_ids`), with a
vector entry point over `EnvPool` (`turnpool.pool.vector`). ``render()`` honours the
``render_mode`` an env was made with (``rgb_array`` where the env draws frames).

Example:
    >>> import turnpool
    >>> env = turnpool.make("bandit")
    >>> obs, info = env.reset(seed=3)
    >>> sorted(info)[:3]
    ['action_is_effective', 'action_is_valid', 'anchor_obs']
"""

from __future__ import annotations

import copy
import inspect
import sys
import warnings
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces
from gymnasium.vector.utils import read_from_shared_memory

#: ``oracle(obs, env_config) -> action names`` that solve (or answer) the current state.
OracleFn = Callable[..., list[str]]
#: A class-level reader of an observation text: ``fn(obs, env_config) -> value``; it runs
#: where only the text is at hand (the RAGEN facade's manager, in the trainer's process).
ObsHook = Callable[[str, dict[str, Any]], Any]

#: What an env's actions look like to the projection (LLM text -> action):
#: ``discrete`` (a fixed ``action_lookup``: names -> ids), ``names`` (names whose ids change
#: per episode), ``word``, ``expression`` (arithmetic, never evaluated by the projection),
#: ``free_text`` and ``webshop`` (``search[...]`` / ``click[...]``).
ACTION_KINDS = ("discrete", "names", "word", "expression", "free_text", "webshop")

INFO_KEYS = ("success", "action_is_valid", "action_is_effective", "anchor_obs")

#: Longest observation / free-text action the default spaces admit.
MAX_OBS_CHARS = 1 << 20
MAX_ACTION_CHARS = 4_096
#: The alphabet `TextSpace` samples from (printable ASCII, blanks and newlines).
SAMPLE_CHARSET = "".join(chr(c) for c in range(32, 127)) + "\n"
#: Instance attributes that are not episode state (never copied between group members).
_NOT_STATE = frozenset({"np_random", "_np_random", "_np_random_seed", "_action_space",
                        "observation_space", "spec", "render_mode"})


class _AllCharacters(frozenset):  # type: ignore[type-arg]
    """Every Unicode character (a set that enumerates nothing): LLM text and env texts print
    any of them (Sokoban's ``√``, Sudoku's ``❌``, a WebShop title)."""

    def __contains__(self, char: object) -> bool:
        return isinstance(char, str) and len(char) == 1

    def __len__(self) -> int:
        return sys.maxunicode + 1

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _AllCharacters)

    def __hash__(self) -> int:
        return hash(_AllCharacters)

    def __reduce__(self) -> Any:
        return (_AllCharacters, ())


class _CodePoints(tuple):  # type: ignore[type-arg]
    """Character ``i`` is ``chr(i)``: the index of a character is its code point."""

    def __getitem__(self, index: Any) -> Any:
        return chr(int(index))

    def __len__(self) -> int:
        return sys.maxunicode + 1

    def __reduce__(self) -> Any:
        return (_CodePoints, ())


_ALL_CHARACTERS = _AllCharacters()
_CODE_POINTS = _CodePoints()


class TextSpace(spaces.Text):
    """``gymnasium.spaces.Text`` for natural-language text: it declares every Unicode
    character (a character's index is its code point, so gymnasium's flattening and the shared
    memory of ``AsyncVectorEnv`` carry any text the envs print) and contains any ``str`` of at
    most ``max_length`` characters; it samples printable ASCII.

    Example:
        >>> space = TextSpace(max_length=8)
        >>> "héllo √" in space, "x" * 9 in space, 3 in space
        (True, False, False)
        >>> from gymnasium.spaces.utils import flatten, unflatten
        >>> unflatten(space, flatten(space, "❌ P_"))
        '❌ P_'
    """

    def __init__(self, max_length: int, *, min_length: int = 0, seed: Any = None) -> None:
        super().__init__(max_length, min_length=min_length, charset=SAMPLE_CHARSET, seed=seed)

    @property
    def character_set(self) -> frozenset[str]:
        return _ALL_CHARACTERS

    @property
    def character_list(self) -> tuple[str, ...]:
        return _CODE_POINTS

    def character_index(self, char: str) -> np.int32:
        return np.int32(ord(char))

    @property
    def characters(self) -> str:
        return "<every Unicode character>"

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and self.min_length <= len(x) <= self.max_length

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        """Printable ASCII of a random length (``mask``/``probability``: a length only)."""
        given = mask if mask is not None else probability
        length = given[0] if given is not None and given[0] is not None else None
        if length is None:
            length = int(self.np_random.integers(self.min_length, self.max_length + 1))
        picks = self.np_random.integers(0, len(SAMPLE_CHARSET), size=int(length))
        return "".join(SAMPLE_CHARSET[int(i)] for i in picks)

    def __repr__(self) -> str:
        return f"TextSpace({self.min_length}, {self.max_length})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TextSpace) and self.min_length == other.min_length
                and self.max_length == other.max_length)

    def __hash__(self) -> int:
        return hash((TextSpace, self.min_length, self.max_length))


class SharedTexts(Sequence[str]):
    """The texts of ``n`` envs in an ``AsyncVectorEnv``'s shared memory, read when asked.

    gymnasium reads a shared-memory observation buffer once, at construction, and relies on
    the result being a live view (as numpy arrays over the buffer are); for a ``Text`` space
    its own reader returns strings decoded that once, so the observations never change. This
    view decodes the buffer on every access, and a ``deepcopy`` (what ``AsyncVectorEnv``
    returns from ``reset``/``step``) is a plain tuple of the current texts.
    """

    def __init__(self, space: TextSpace, shared_memory: Any, n: int) -> None:
        self._codes = np.frombuffer(shared_memory.get_obj(), dtype=np.int32).reshape(
            (n, space.max_length))

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return tuple(self)[index]
        row = self._codes[index]
        return row[row <= sys.maxunicode].astype("<u4").tobytes().decode("utf-32-le")

    def __len__(self) -> int:
        return len(self._codes)

    def __deepcopy__(self, memo: dict[int, Any]) -> tuple[str, ...]:
        return tuple(self)

    def __eq__(self, other: object) -> bool:
        return tuple(self) == (tuple(other) if isinstance(other, Sequence) else other)

    __hash__ = None  # type: ignore[assignment]


@read_from_shared_memory.register(TextSpace)
def _read_texts(space: TextSpace, shared_memory: Any, n: int = 1) -> SharedTexts:
    return SharedTexts(space, shared_memory, n)


#: Shared by every env (spaces are immutable once built).
OBSERVATION_SPACE = TextSpace(MAX_OBS_CHARS)


def action_space_for(lookup: dict[int, str] | None) -> spaces.Space[Any]:
    """``Discrete`` over a lookup's ids when they are contiguous, else free text."""
    if lookup:
        ids = sorted(int(i) for i in lookup)
        if ids == list(range(ids[0], ids[0] + len(ids))):
            return spaces.Discrete(len(ids), start=ids[0])
    return TextSpace(MAX_ACTION_CHARS)


def next_episode_seed(seed: int) -> int:
    """The seed of the episode after one seeded ``seed`` when ``reset()`` is given none.

    Example:
        >>> next_episode_seed(3) == next_episode_seed(3) != next_episode_seed(4)
        True
    """
    state = np.random.SeedSequence([int(seed), 0x5EED]).generate_state(1, np.uint64)
    return int(state[0] >> np.uint64(1))


class TextEnv(gymnasium.Env[str, Any]):
    """Base class: a text environment with a per-env RNG and RAGEN-compatible info keys.

    Subclasses implement ``_reset(seed, options) -> obs``, ``_step(action) -> (obs, reward,
    terminated, truncated, info)`` and ``_render_text() -> str`` (the current state as text:
    ``render()`` and, unless overridden, ``anchor_obs()``); the base class seeds
    ``np_random``, fills the standard info keys and maps action names to ids for discrete envs.

    The class attributes below are the whole contract a class may declare; the ones under
    "optional hooks" matter to a few envs only (grid remapping, the RAGEN facade), and their
    defaults say "not offered".
    """

    #: id -> name for discrete envs (None for free-text envs such as countdown).
    action_lookup: ClassVar[dict[int, str] | None] = None
    #: One of ``ACTION_KINDS``; ``None`` derives it: ``discrete`` with an ``action_lookup``,
    #: ``names`` when that lookup changes per episode, else ``free_text``.
    action_kind: ClassVar[str | None] = None
    #: The env's own solver (used by the oracle policy), or ``None``; set it with
    #: ``MyEnv.oracle = staticmethod(fn)``.
    oracle: ClassVar[staticmethod[..., list[str]] | OracleFn | None] = None
    #: symbol -> meaning, for the prompt legend (None for envs without a grid).
    grid_vocab: ClassVar[dict[str, str] | None] = None
    #: Free text shown to the model before the first observation.
    instruction: ClassVar[str] = ""
    #: Config keys accepted beyond ``__init__``'s named parameters (read from ``self.config``,
    #: or RAGEN config keys accepted and unused); any other key warns, naming the env and
    #: the key. ``None``: the class takes any keys (it passes them on, as adapters do).
    extra_kwargs: ClassVar[frozenset[str] | None] = None
    #: RAGEN's config-dataclass defaults where they differ from this class's own, per
    #: version: a config of that version builds the env with them under its ``env_config``
    #: (`turnpool.ragen.config.ragen_defaults`). A class defaults to v2's (the default
    #: version) where its users allow it (FrozenLake); Bandit and WebShop keep v1's.
    ragen_v1_defaults: ClassVar[dict[str, Any]] = {}
    ragen_v2_defaults: ClassVar[dict[str, Any]] = {}
    #: The kwarg that takes RAGEN v2's per-process instance number of this class (its class
    #: counter: how many envs of the class its process built before this one, train manager
    #: first, then val); a RAGEN v2 config numbers the envs so. ``None``: not numbered.
    ragen_v2_instance_kwarg: ClassVar[str | None] = None
    #: Whether the class draws from the process-global ``random`` / ``numpy.random`` state
    #: (RAGEN classes that seed it): two such envs on threads of one process interleave
    #: their draws, so the thread backend refuses them.
    uses_global_rng: ClassVar[bool] = False
    #: Whether ``get_state`` / ``set_state`` capture the whole episode, so the pool branches
    #: the env by state (`EnvPool.fork`); false: by seed + action replay (wrapped envs).
    snapshot_by_state: ClassVar[bool] = True
    # ------------------------------------------------------------ optional hooks
    #: code -> symbol of the grid as drawn by default, for envs whose ``grid_lookup`` kwarg
    #: renames the symbols: the prompt legend re-keys ``grid_vocab`` through it.
    grid_lookup: ClassVar[dict[int, str] | None] = None
    #: ``fn(env_kwargs) -> env_kwargs`` as the wrapped library builds its config (the RAGEN
    #: adapter: its dataclass defaults under the given keys); the RAGEN facade's manager reads
    #: ``action_lookup`` from the result. None: the kwargs as given.
    effective_config: ClassVar[staticmethod[..., dict[str, Any]]
                               | Callable[[dict[str, Any]], dict[str, Any]] | None] = None
    #: for envs whose action ids change per episode (`action_lookup_for_episode`): the
    #: episode's id -> name map read back from its first observation (an `ObsHook`), for
    #: code that sees only the text.
    episode_lookup: ClassVar[staticmethod[..., dict[int, str] | None] | ObsHook | None] = None
    #: the ``info`` keys RAGEN's own env returns, in its order (the RAGEN facade passes on
    #: only these). None: every key.
    ragen_info_keys: ClassVar[tuple[str, ...] | None] = None
    #: whether RAGEN's env returns integer rewards (the facade converts back from float).
    ragen_int_rewards: ClassVar[bool] = False
    #: whether RAGEN's env reads its manager's mode at reset (WebShop's split): a RAGEN config
    #: then passes ``mode=`` to the env.
    ragen_reset_mode: ClassVar[bool] = False
    #: the ``rgb_array`` frame of an observation text (an `ObsHook` returning an array): the
    #: facade draws frames from the text instead of shipping pixels between processes.
    frame_from_obs: ClassVar[staticmethod[..., Any] | ObsHook | None] = None
    #: the reference answer of a first observation (an `ObsHook`; question-answer envs): the
    #: RAGEN facade attaches it as ``correct_answer``.
    answer_for_obs: ClassVar[staticmethod[..., Any] | ObsHook | None] = None
    metadata: dict[str, Any] = {"render_modes": ["text"], "render_fps": 1}  # noqa: RUF012

    def __init__(self, **config: Any) -> None:
        render_mode = config.get("render_mode")
        if render_mode not in (None, *self.metadata["render_modes"]):
            raise ValueError(f"render_mode {render_mode!r} is not one of "
                             f"{self.metadata['render_modes']}")
        self.render_mode = render_mode
        self.config: dict[str, Any] = dict(config)
        if self.extra_kwargs is not None:
            known = _named_parameters(type(self)) | self.extra_kwargs | {"render_mode"}
            for key in sorted(set(config) - known):
                warnings.warn(f"{type(self).__name__}: unknown env kwarg {key!r} ignored",
                              UserWarning, stacklevel=3)
        self.np_random = np.random.default_rng(0)
        self.seed: int | None = None
        self.observation_space = OBSERVATION_SPACE
        self._action_space: spaces.Space[Any] | None = None

    @property  # type: ignore[override]
    def action_space(self) -> spaces.Space[Any]:
        """``Discrete`` over the action ids (Bandit: its arm ids), else `TextSpace`; built on
        first use, after the subclass has set up its lookup."""
        if self._action_space is None:
            self._action_space = action_space_for(self.action_lookup_for_episode())
        return self._action_space

    @action_space.setter
    def action_space(self, space: spaces.Space[Any]) -> None:
        self._action_space = space

    # ----------------------------------------------------------------- public API
    def reset(
        self, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode. ``seed=None`` after a seeded episode uses `next_episode_seed`
        of the last seed (a pure function of it, so a vector env that resets envs from outside
        gives the same episodes); before the first seed, OS entropy."""
        if seed is None:
            if self.seed is None:
                seed = int(np.random.SeedSequence().entropy % (2**63))  # type: ignore[operator]
            else:
                seed = next_episode_seed(self.seed)
        self.seed = int(seed)
        self.np_random = np.random.default_rng(self.seed)
        self._np_random_seed = self.seed  # gymnasium's ``np_random_seed`` (the setter says -1)
        obs = self._reset(self.seed, options or {})
        return obs, self._info({"success": False, "action_is_valid": True,
                                "action_is_effective": False})

    def step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one action. Unknown actions are not errors: ``action_is_valid=False``."""
        obs, reward, terminated, truncated, info = self._step(self.parse_action(action))
        return obs, float(reward), bool(terminated), bool(truncated), self._info(info)

    def render(self, mode: str | None = None) -> Any:  # type: ignore[override]
        """The env drawn in ``mode``, else in the ``render_mode`` it was made with, else as
        text: ``"text"`` is the current observation text, ``"rgb_array"`` an ``(h, w, 3)``
        ``uint8`` image (envs whose ``metadata["render_modes"]`` list it)."""
        mode = mode or self.render_mode or "text"
        if mode == "text":
            return self._render_text()
        if mode not in self.metadata["render_modes"]:
            raise ValueError(f"{type(self).__name__} renders {self.metadata['render_modes']}, "
                             f"not {mode!r}")
        return self._render_rgb_array()

    def close(self) -> None:
        """Release resources. Idempotent."""

    def parse_action(self, action: Any) -> Any:
        """Map an action name (any case) to its id for discrete envs; pass others through.

        Returns ``None`` when a discrete env receives something that is not one of its actions.
        """
        lookup = self.action_lookup_for_episode()
        if lookup is None:
            return action
        if isinstance(action, (int, np.integer)) and not isinstance(action, bool):
            return int(action) if int(action) in lookup else None
        if isinstance(action, str):
            wanted = action.strip().lower()
            for aid, name in lookup.items():
                if name.lower() == wanted:
                    return aid
        return None

    def action_lookup_for_episode(self) -> dict[int, str] | None:
        """The id -> name map in force now (Bandit shuffles its arms per episode)."""
        return self.action_lookup

    def anchor_obs(self) -> str:
        """State text identical for two envs in the same state (no counters, no history)."""
        return self._render_text()

    # ------------------------------------------------------------ group copying
    def get_state(self) -> Any:
        """A picklable snapshot of the full episode state, RNG included."""
        state = {k: copy.deepcopy(v) for k, v in self.__dict__.items() if k not in _NOT_STATE}
        state["__rng__"] = self.np_random.bit_generator.state
        return state

    def set_state(self, state: Any) -> None:
        """Restore a snapshot from ``get_state`` (possibly taken in another env instance)."""
        state = dict(state)
        rng_state = state.pop("__rng__")
        self.__dict__.update(copy.deepcopy(state))
        self.np_random = np.random.default_rng()
        self.np_random.bit_generator.state = rng_state

    # ------------------------------------------------------------ subclass hooks
    def _reset(self, seed: int, options: dict[str, Any]) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define _reset(seed, options) "
                                  "-> the first observation text")

    def _step(self, action: Any) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise NotImplementedError(f"{type(self).__name__} must define _step(action) -> "
                                  "(observation, reward, terminated, truncated, info)")

    def _render_text(self) -> str:
        raise NotImplementedError(f"{type(self).__name__} must define _render_text() -> the "
                                  "current state as text (render() and info['anchor_obs'] "
                                  "read it)")

    def _render_rgb_array(self) -> np.ndarray:
        """The ``rgb_array`` frame, for envs whose ``metadata["render_modes"]`` list it."""
        raise NotImplementedError(f"{type(self).__name__} does not draw rgb_array frames")

    def _info(self, info: dict[str, Any]) -> dict[str, Any]:
        # one read and one write per standard key (a missing one is appended in this order,
        # as setdefault did): this runs on every env-step of every backend
        out = dict(info)
        out["success"] = bool(out.get("success", False))
        out["action_is_valid"] = bool(out.get("action_is_valid", True))
        out["action_is_effective"] = bool(out.get("action_is_effective", False))
        out["anchor_obs"] = self.anchor_obs()
        return out


_NAMED: dict[type[Any], frozenset[str]] = {}


def _named_parameters(cls: type[Any]) -> frozenset[str]:
    """The keyword parameters ``cls.__init__`` names (not its ``**config``), cached."""
    named = _NAMED.get(cls)
    if named is None:
        kinds = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        named = frozenset(name for name, p in inspect.signature(cls.__init__).parameters.items()
                          if p.kind in kinds and name != "self")
        _NAMED[cls] = named
    return named
