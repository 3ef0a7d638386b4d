"""The learned parts of SPA-RL and OPRL behind one interface, for a trainer that holds one
beside its policy (the bundled trainer does, for ``--advantage spa`` and ``oprl``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from agentgym.algorithms.oprl import ImplicitPRM
from agentgym.algorithms.spa import ProgressEstimator, text_features

__all__ = ["LearnedCredit"]


class LearnedCredit:
    """The learned part of ``spa`` or ``oprl`` behind one interface, over the text of each row.

    What a trainer holds for a run: ``process_rewards(texts)`` before the advantage (the
    ``process_rewards`` input of ``compute_advantage(name, ...)``), ``update(texts, ...)``
    after the policy update, on the same rows. Each row's text is featurised by
    :func:`~agentgym.algorithms.spa.text_features` (for a step: the observation it was chosen from and the action).

    * ``"spa"``: a :class:`~agentgym.algorithms.spa.ProgressEstimator`, trained online on
      every batch (``L_PE``) rather than once before RL as in the paper;
    * ``"oprl"``: an :class:`~agentgym.algorithms.oprl.ImplicitPRM` without candidate lists
      (free-text actions), so its step reward is ``beta f_phi(s, a)``, updated after the
      rewards of a batch are computed (the authors' ``update=after``).

    Args:
        name: ``"spa"`` or ``"oprl"``.
        feature_dim: width of the hashed features.
        update_steps: Adam steps per :meth:`update`.
        seed: seeds the model's initial weights.
        **model_options: passed to the model (``lr``, ``hidden``; ``beta``, ``reduce`` for OPRL).
    """

    def __init__(
        self,
        name: str,
        *,
        feature_dim: int = 256,
        update_steps: int = 20,
        seed: int = 0,
        **model_options: Any,
    ) -> None:
        models = {"spa": ProgressEstimator, "oprl": ImplicitPRM}
        if name not in models:
            raise ValueError(f"no learned credit model for {name!r}; choose from {sorted(models)}")
        self.name, self.feature_dim, self.update_steps = name, feature_dim, update_steps
        self.model = models[name](feature_dim, seed=seed, **model_options)

    def process_rewards(self, texts: Sequence[str]) -> np.ndarray:
        """float64 (N,): SPA's contributions ``c_t`` or OPRL's implicit step rewards."""
        feats = text_features(texts, self.feature_dim)
        if self.name == "spa":
            return self.model.predict(feats)
        return self.model.step_rewards(feats)

    def update(
        self, texts: Sequence[str], *, group_ids: Any, traj_ids: Any, rewards: Any
    ) -> dict[str, float]:
        """``update_steps`` steps of the model's objective on these rows; its metrics."""
        feats = text_features(texts, self.feature_dim)
        rows = {"group_ids": group_ids, "traj_ids": traj_ids, "rewards": rewards}
        return self.model.update(feats, **rows, steps=self.update_steps)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)
