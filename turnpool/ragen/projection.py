"""RAGEN's ``create_projection_function``: the rollout's projection under RAGEN's name.

The projection itself (text -> env action + valid flag) is `turnpool.rollout.projection`;
RAGEN code that imports this name gets exactly that object.

Example:
    >>> f = create_projection_function("countdown")
    >>> f(["<answer>(1 + 2) * 3</answer>", "print(1)"])
    (['(1 + 2) * 3', ''], [True, False])
    >>> create_projection_function("frozenlake")(["<answer>Up || Left</answer>", "dance"])
    ([[4, 1], 0], [True, False])
"""

from __future__ import annotations

from turnpool.rollout.projection import projection_for as create_projection_function

__all__ = ["create_projection_function"]
