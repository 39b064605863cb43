"""GRPO for verl whose group statistics leave failed envs out: ``adv_estimator=turnpool_grpo``.

The turnpool agent loop replays a failed env from its seed (``turnpool.retries`` times); an
episode that still fails comes back with an all-zero ``response_mask``. verl's own ``grpo``
estimator would still count its score in the group's mean and std, so one hung env shifts every
healthy member's advantage. ``turnpool_grpo`` (registered with verl's
``register_adv_est``) keeps the batch whole but computes each group's statistics over the rows
that have at least one sampled token: it runs verl's ``compute_grpo_outcome_advantage`` on those
rows alone, so a healthy row's advantage is exactly what it would be in the batch without the
failed rows, and a failed row's advantage is 0 (it carries no gradient).

Use it with ``algorithm.adv_estimator=turnpool_grpo`` (``norm_adv_by_std_in_grpo`` is honoured).
verl imports it in every process through the ``verl.plugins`` entry point turnpool declares;
importing ``turnpool.integrations.verl`` registers it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from verl.trainer.ppo.core_algos import (
    ADV_ESTIMATOR_REGISTRY,
    compute_grpo_outcome_advantage,
    register_adv_est,
)

#: The name to set as ``algorithm.adv_estimator``.
ESTIMATOR = "turnpool_grpo"


def healthy_rows(response_mask: torch.Tensor) -> torch.Tensor:
    """Rows with at least one sampled token: the rows a failed env's all-zero mask excludes."""
    return response_mask.sum(dim=-1) > 0


def turnpool_grpo_advantage(token_level_rewards: torch.Tensor, response_mask: torch.Tensor,
                            index: np.ndarray, epsilon: float = 1e-6,
                            norm_adv_by_std_in_grpo: bool = True, config: Any = None,
                            **_: Any) -> tuple[torch.Tensor, torch.Tensor]:
    """verl's GRPO outcome advantage over the healthy rows only; failed rows get 0."""
    if isinstance(config, Mapping):  # verl's AlgoConfig (a Mapping) or an OmegaConf section
        norm_adv_by_std_in_grpo = bool(config.get("norm_adv_by_std_in_grpo",
                                                  norm_adv_by_std_in_grpo))
    keep = healthy_rows(response_mask)
    advantages = torch.zeros_like(token_level_rewards, dtype=torch.float32)
    rows = torch.nonzero(keep, as_tuple=False).flatten()
    if rows.numel():
        sub, _ = compute_grpo_outcome_advantage(
            token_level_rewards=token_level_rewards[rows], response_mask=response_mask[rows],
            index=np.asarray(index, dtype=object)[rows.cpu().numpy()], epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
        advantages[rows] = sub.to(advantages.dtype)
    return advantages, advantages


if ADV_ESTIMATOR_REGISTRY.get(ESTIMATOR) is None:
    register_adv_est(ESTIMATOR)(turnpool_grpo_advantage)
