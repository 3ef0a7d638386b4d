"""SPA-RL: Stepwise Progress Attribution (Wang et al., arXiv 2505.20732), as a registered
estimator (``"spa"``) and its learned part, the progress estimator.

SPA redistributes an episode's delayed outcome over its steps. A *progress estimator*
``P_phi`` predicts each step's contribution ``c_t = P_phi(s_t, a_t)`` and is trained so that
the contributions of a trajectory add up to its outcome (the paper's progress-estimation
objective, called ``L_PE`` below; the authors' ``prm/train_our_progress_model.py``:
``MSELoss`` between the sum of the per-turn values and ``agent_final_reward``)::

    L_PE(phi) = mean over trajectories i of (R_i - sum_t c_{i,t})^2

During RL the contribution is fused with a *grounding signal* ``g_t`` (1 when the action was
executed by the env, 0 when it was not) into the intermediate reward of every step (the
paper's fused reward, ``r_fused`` below)::

    r_t = alpha * c_t + beta * g_t

and the policy is trained on those rewards (the paper: PPO with a learned critic and GAE).
Equations are named here rather than numbered.

Choices made here, where the paper leaves them open or this library differs:

* **Features.** The paper's estimator is the SFT policy LLM with a linear head on the last
  token of each turn. :class:`ProgressEstimator` is a small torch MLP over any fixed-length
  step features (N, D): :func:`text_features` hashes the words and word pairs of a step's
  text (state + action) into D signed buckets, which runs on CPU in microseconds; a caller
  with an LLM can pass its hidden states instead.
* **Grounding.** ``g_t = not invalid_t`` (the env's ``action_valid``). The authors' data
  script (``prm/rl_data_org.py``) adds 0.5 to each executed step's value (and to the last
  step), i.e. ``alpha = 1``, ``beta = 0.5``: those are the defaults.
* **Advantage with groups.** The trainer here is critic-free, so instead of PPO's GAE on a
  learned value, the advantage of step t is the discounted return of the fused rewards,
  ``G_t = sum_{k >= t} gamma^(k-t) r_k``, less a Monte Carlo estimate of the value: the mean
  of ``G`` over the rows of the same group at the same step index (every trajectory of a
  group starts from the same state, so their t-th steps are comparable draws);
  ``norm="mean_std_norm"`` divides by that cell's std + epsilon. A cell of one row gets 0.
  ``gamma`` defaults to 1.0 (the authors' PPO runs use TRL's defaults: gamma 1, lambda 0.95).
* **Env rewards** only train the estimator (its target ``R_i`` is the trajectory's total
  reward); the advantage reads the fused reward alone, as the authors' PPO data does.
  ``invalid_penalty`` defaults to 0: the grounding term already charges invalid actions.
* **When the estimator trains.** The paper trains it once, before RL, on the SFT policy's
  exploration rollouts, then freezes it. :meth:`ProgressEstimator.update` does one or more
  gradient steps on any batch: call it on a pre-collected set (the paper), or on every
  rollout batch after its advantages are computed (an online variant).

Two things in the authors' released RL pipeline are not in the paper and are not done here:
their data script (``prm/rl_data_org.py``) overwrites every turn's predicted value with the
trajectory's outcome less the mean outcome of the task's other rollouts before adding the
grounding term, and their PPO trainer (``ppo/step_ppotrainer.py``) scales the reward of step t
by ``T - t - 1`` before TRL's GAE. This module follows the paper: the estimator's per-step
contributions, unscaled.

How a trainer calls it, once per iteration::

    feats = text_features([obs + " " + act for obs, act in rows], dim=estimator.feature_dim)
    progress = estimator.predict(feats)                      # c_t, (N,)
    adv = compute_advantage("spa", group_ids=..., traj_ids=..., step_ids=..., rewards=...,
                            invalid=..., process_rewards=progress)
    ... policy update on adv.advantages ...
    estimator.update(feats, group_ids=..., traj_ids=..., rewards=...)   # L_PE on this batch
"""

from __future__ import annotations

import copy
import re
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from agentgym.algorithms.advantage import (
    AdvantageBatch,
    AdvantageConfig,
    AdvantageResult,
    _int_codes,
    _std,
    register_advantage,
    step_group_stats,
)

if TYPE_CHECKING:
    import torch

__all__ = [
    "ProgressEstimator",
    "SPAConfig",
    "spa",
    "spa_rewards",
    "text_features",
    "trajectory_codes",
]

_WORD = re.compile(r"[a-z0-9]+")


def text_features(texts: Sequence[str], dim: int = 256) -> np.ndarray:
    """Hashed bag of words and word pairs of each text: float32 (N, dim), rows of unit norm.

    Each lower-cased word and each pair of neighbouring words lands in bucket
    ``crc32(token) % dim`` with sign ``+1`` or ``-1`` from a second hash (signed feature
    hashing keeps collisions unbiased). Deterministic across processes (no ``hash()``).
    """
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, text in enumerate(texts):
        words = _WORD.findall(text.lower())
        for token in (*words, *(f"{a} {b}" for a, b in zip(words, words[1:], strict=False))):
            h = zlib.crc32(token.encode())
            out[i, h % dim] += 1.0 if (h >> 16) & 1 else -1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    np.divide(out, norms, out=out, where=norms > 0)
    return out


def trajectory_codes(group_ids: Any, traj_ids: Any) -> tuple[np.ndarray, np.ndarray]:
    """(trajectory code of each row, int64 (N,) in [0, T); group of each code, int64 (T,)).

    A trajectory is a (group_id, traj_id) pair, as in :func:`compute_advantage`.
    """
    g = np.asarray(group_ids, dtype=np.int64)
    t = np.asarray(traj_ids, dtype=np.int64)
    if g.shape != t.shape or g.ndim != 1:
        raise ValueError(f"group_ids and traj_ids must be (N,) alike, got {g.shape}, {t.shape}")
    pairs, codes = np.unique(np.stack([g, t], axis=1), axis=0, return_inverse=True)
    return codes.reshape(-1).astype(np.int64), pairs[:, 0].astype(np.int64)


class ProgressEstimator:
    """SPA's progress estimator ``P_phi``: step features (N, D) -> contributions ``c`` (N,).

    A two-layer torch MLP (``D -> hidden -> 1``, tanh), trained by :meth:`update` on the
    paper's objective ``L_PE``: the squared error between a trajectory's outcome and the sum of
    its steps' contributions, averaged over trajectories. CPU by default; torch is imported
    when one is built, not when this module is.

    Args:
        feature_dim: D, the width of the features (e.g. :func:`text_features`' ``dim``).
        hidden: width of the hidden layer.
        lr: Adam's learning rate.
        seed: seeds the initial weights (two estimators with one seed are equal).
        device: torch device of the model.
    """

    def __init__(
        self,
        feature_dim: int,
        *,
        hidden: int = 64,
        lr: float = 1e-2,
        seed: int = 0,
        device: str = "cpu",
    ) -> None:
        import torch

        self.feature_dim, self.device = feature_dim, torch.device(device)
        gen = torch.Generator().manual_seed(seed)
        first, last = torch.nn.Linear(feature_dim, hidden), torch.nn.Linear(hidden, 1)
        with torch.no_grad():
            for layer in (first, last):
                bound = layer.in_features**-0.5
                layer.weight.uniform_(-bound, bound, generator=gen)
                layer.bias.zero_()
        self.net = torch.nn.Sequential(first, torch.nn.Tanh(), last).to(self.device)
        self.optimizer = torch.optim.Adam(self.net.parameters(), lr=lr)

    def _tensor(self, features: Any) -> torch.Tensor:
        import torch

        x = torch.as_tensor(np.asarray(features, dtype=np.float32), device=self.device)
        if x.ndim != 2 or x.shape[1] != self.feature_dim:
            raise ValueError(f"features must be (N, {self.feature_dim}), got {tuple(x.shape)}")
        return x

    def contributions(self, features: Any) -> torch.Tensor:
        """``c_t`` of every row, float32 (N,), differentiable."""
        return self.net(self._tensor(features)).squeeze(-1)

    def predict(self, features: Any) -> np.ndarray:
        """``c_t`` of every row, float64 (N,): what ``compute_advantage("spa")`` reads as
        ``process_rewards``."""
        import torch

        with torch.no_grad():
            return self.contributions(features).double().cpu().numpy()

    def loss(self, features: Any, *, group_ids: Any, traj_ids: Any, rewards: Any) -> torch.Tensor:
        """``L_PE = mean_i (R_i - sum_t c_{i,t})^2``, with ``R_i`` the trajectory's total reward.

        Args:
            features: float (N, D), one row per (trajectory, step), any order.
            group_ids, traj_ids: int (N,), the rows' trajectories (as in compute_advantage).
            rewards: float (N,), the env reward of each step; their sum over a trajectory is
                its outcome (a sparse-reward env pays it at the last step).
        """
        import torch

        codes, traj_group = trajectory_codes(group_ids, traj_ids)
        num = traj_group.shape[0]
        r = np.asarray(rewards, dtype=np.float64)
        if r.shape != codes.shape:
            raise ValueError(f"rewards must be ({codes.shape[0]},) like group_ids, got {r.shape}")
        outcome = torch.as_tensor(np.bincount(codes, weights=r, minlength=num), device=self.device)
        index = torch.as_tensor(codes, device=self.device)
        c = self.contributions(features)
        total = torch.zeros(num, dtype=c.dtype, device=self.device).index_add(0, index, c)
        return ((outcome.to(c.dtype) - total) ** 2).mean()

    def update(
        self, features: Any, *, group_ids: Any, traj_ids: Any, rewards: Any, steps: int = 1
    ) -> dict[str, float]:
        """``steps`` Adam steps on ``L_PE`` over these rows (full batch).

        Returns ``{"spa/progress_loss_before": ..., "spa/progress_loss": ...}``: the loss
        before the first step and after the last.
        """
        import torch

        self.net.train()
        before = None
        for _ in range(steps):
            self.optimizer.zero_grad(set_to_none=True)
            loss = self.loss(features, group_ids=group_ids, traj_ids=traj_ids, rewards=rewards)
            if before is None:
                before = float(loss.detach())
            loss.backward()
            self.optimizer.step()
        with torch.no_grad():
            after = self.loss(features, group_ids=group_ids, traj_ids=traj_ids, rewards=rewards)
        return {"spa/progress_loss_before": before or 0.0, "spa/progress_loss": float(after)}

    def state_dict(self) -> dict[str, Any]:
        """Weights and optimizer state, for a trainer's checkpoint."""
        return {"net": self.net.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.net.load_state_dict(state["net"])
        self.optimizer.load_state_dict(state["optimizer"])


@dataclass(frozen=True)
class SPAConfig(AdvantageConfig):
    """SPA's options: the fused reward's weights (``r_fused``), gamma 1 and no invalid penalty (the
    grounding term charges invalid actions)."""

    gamma: float = 1.0
    """discount of the fused rewards' returns (TRL's PPO default, which the authors ran)"""
    invalid_penalty: float = 0.0
    """subtracted from an invalid step's return; 0: the grounding term already charges it"""
    alpha: float = 1.0
    """weight of the estimated progress ``c_t`` in ``r_t = alpha c_t + beta g_t`` (``r_fused``)"""
    beta: float = 0.5
    """weight of the grounding signal ``g_t`` (the authors' data adds 0.5 per executed step)"""


def spa_rewards(batch: AdvantageBatch, config: SPAConfig) -> np.ndarray:
    """``r_fused``, the fused reward of every row, float64 (N,): ``alpha c_t + beta g_t``."""
    if batch.process_rewards is None:
        raise ValueError(
            "spa needs process_rewards: the progress estimator's c_t per row "
            "(ProgressEstimator.predict)"
        )
    return config.alpha * batch.process_rewards + config.beta * (~batch.invalid)


@register_advantage("spa", options=SPAConfig, inputs=("process_rewards",))
def spa(batch: AdvantageBatch, config: SPAConfig) -> AdvantageResult:
    """SPA (arXiv 2505.20732): returns of the fused reward ``alpha c_t + beta g_t`` (``r_fused``),
    less the mean return of the group's rows at the same step index (see the module
    docstring for this critic-free stand-in for the paper's PPO value).

    ``process_rewards`` are the progress estimator's ``c_t``; ``g_t = not invalid``. Returns
    ``step_advantage`` = ``advantages``, ``episode_advantage`` zeros, ``returns`` the raw env
    returns (Eq. 5 of GiGPO, as every estimator reports them).
    """
    fused = copy.copy(batch)
    fused.rewards = spa_rewards(batch, config)
    value = fused._discounted_returns(config.gamma) - batch.penalty
    # Cells: (group, step index). Positions are < the longest trajectory, so this is compact.
    width = int(batch.position.max()) + 1 if batch.n else 1
    codes, num = _int_codes(batch.group_code * width + batch.position)
    count = np.bincount(codes, minlength=num)
    mean = np.bincount(codes, weights=value, minlength=num) / np.maximum(count, 1)
    a_step = value - mean[codes]
    if config.norm == "mean_std_norm":
        a_step = a_step / (_std(codes, value, mean, count)[codes] + config.epsilon)
    return AdvantageResult(
        advantages=a_step.astype(np.float32),
        returns=batch.returns,
        episode_advantage=np.zeros(batch.n),
        step_advantage=a_step,
        stats=step_group_stats(batch.step_group_count(), batch.n),
    )
