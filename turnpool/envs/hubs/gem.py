"""GEM's envs (``gem-llm``) by their GEM ids: ``"gem:game:Sokoban-v0-easy"``,
``"gem:game:Minesweeper-v0-hard"``, ``"gem:rg:leg_counting"``, ``"gem:math:..."``.

The env is ``gem.make(id, **kwargs)``, unwrapped: its observations (the game's own
instructions first, then its feedback), rewards, ``terminated`` / ``truncated`` and info
(``suffix``: the reminder GEM's observation wrappers append) reach the caller as GEM gives
them. Actions are GEM's own answer format, free text such as ``\\boxed{up}``, parsed by the
game; the projection hands it the text inside ``<answer>...</answer>`` or the whole reply.

GEM seeds Python's ``random`` and ``numpy.random`` on ``reset(seed)`` and its games draw from
them, so every call runs in the env's own global RNG scope
(`turnpool.envs.hubs.base.GlobalRngScope`): the same seed gives the same episode in any
process, and neither the caller's draws nor another env's move it. ``success`` is GEM's
reward at the end reaching 1.0 (GEM reports no flag).

Importing GEM configures the root logger at INFO (``logging.basicConfig`` in
``gem/__init__``); a program that configures logging first keeps its own configuration.

Ids that load data sets from a hub (most ``math:``, ``qa:``, ``code:`` and ``eval:`` ids) do
not run offline; ``turnpool envs --hub gem`` lists which do.

Example:
    >>> import turnpool
    >>> env = turnpool.make("gem:game:GuessTheNumber-v0-easy")
    >>> obs, info = env.reset(seed=1)
    >>> obs, reward, terminated, truncated, info = env.step("\\\\boxed{5}")
    >>> info["action_is_valid"], "suffix" in info
    (True, True)
"""

from __future__ import annotations

from typing import Any

from turnpool.envs.hubs.base import HubEnv


class GemEnv(HubEnv):
    """One GEM env (see the module doc)."""

    hub_prefix = "gem"
    uses_global_rng = True

    def _build(self, env_id: str, kwargs: dict[str, Any]) -> Any:
        import gem

        return gem.make(env_id, **kwargs)

    def _library_reset(self, seed: int, options: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
        return self.inner.reset(seed=seed)

    def _library_step(self, action: str) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        return self.inner.step(action)  # type: ignore[no-any-return]

    @classmethod
    def env_ids(cls) -> list[str]:
        from gem.envs.registration import ENV_REGISTRY

        return list(ENV_REGISTRY)
